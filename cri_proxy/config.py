"""The proxy's settings: defaults, the TOML file, then command-line flags, in that order.

Every option is declared once in `OPTIONS`; the file loader and the flag parser both read that
table, so a key that is not there is refused with its name, and a value of the wrong type too.
"""

from __future__ import annotations

import ipaddress
import math
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from cri_proxy.cpu.cpuset import CPUSet
from cri_proxy.defaults import DEFAULT_CONFIG_FILE as DEFAULT_CONFIG_FILE
from cri_proxy.defaults import DEFAULT_LISTEN as DEFAULT_LISTEN
from cri_proxy.defaults import DEFAULT_RUNTIME_ENDPOINT as DEFAULT_RUNTIME_ENDPOINT
from cri_proxy.endpoints import admin_endpoint_beside, socket_path
from cri_proxy.errors import ConfigError, CpuError, EndpointError
from cri_proxy.files import read_small, text_of

MIB = 1024 * 1024
MAX_CONFIG_BYTES = MIB
"""1 MiB: a config file is a few hundred bytes; more is not a config file."""


@dataclass(frozen=True, slots=True)
class Config:
    """Everything `cri-proxy serve` can be told. Field names are the TOML keys, except that
    `kubernetes_<key>` is `<key>` in the `[kubernetes]` table (see `TABLES`)."""

    listen: str = DEFAULT_LISTEN
    runtime_endpoint: str = DEFAULT_RUNTIME_ENDPOINT
    max_recv_message_bytes: int = 16 * MIB
    max_send_message_bytes: int = 16 * MIB
    shutdown_grace_seconds: float = 10.0
    fail_policy: str = "ignore"
    relay_mode: str = "frames"  # "frames" (HTTP/2 frame relay, relay/core.py) or "grpc" (grpc.aio relay)
    relay_buffer_bytes: int = 32 * MIB  # frames mode: bytes one connection may hold (held requests, backlog)
    relay_buffer_total_bytes: int = 256 * MIB  # frames mode: ... all connections together
    log_level: str = "INFO"
    socket_group: str = ""
    admin_listen: str = ""  # the admin socket (introspection, health); empty: admin.sock beside `listen`
    admin_socket_group: str = ""  # a group that may use the admin socket (0660); empty: root only (0600)
    allow_world_writable_socket_dir: bool = False
    state_dir: str = "/var/lib/cri-proxy"
    kubelet_state_file: str = "/var/lib/kubelet/cpu_manager_state"
    sysfs_root: str = "/sys"
    cgroup_root: str = "/sys/fs/cgroup"  # where containers' cgroups are read (cpuset.cpus, v1 or v2)
    reserved_cpus: str = ""
    system_cpus: str = ""
    dry_run: bool = False
    exclusive_wait_seconds: float = 5.0
    reconcile_concurrency: int = 8
    reconcile_period_seconds: float = 30.0
    kubelet_poll_seconds: float = 1.0
    log_format: str = "auto"  # auto | text | json
    metrics_address: str = ""  # HOST:PORT for /metrics, /healthz, /readyz; empty: off
    allow_remote_metrics: bool = False  # metrics_address may be a non-loopback address
    kubernetes_enabled: bool = False  # [kubernetes] enabled: watch this node's pods for re-binds
    kubernetes_node_name: str = ""  # [kubernetes] node_name; empty: the host name
    kubernetes_kubeconfig: str = ""  # [kubernetes] kubeconfig; empty: in-cluster, then ~/.kube/config

    def validate(self) -> Config:
        """Every value on its own (no I/O); `check_cpus` adds what needs the node's online CPUs."""
        if self.relay_mode not in ("grpc", "frames"):
            raise ConfigError(f"relay_mode: must be 'grpc' or 'frames', not {self.relay_mode!r}")
        if self.log_format not in ("auto", "text", "json"):
            raise ConfigError(f"log_format: must be 'auto', 'text' or 'json', not {self.log_format!r}")
        if self.metrics_address:
            _check_metrics_address(self.metrics_address, self.allow_remote_metrics)
        if self.fail_policy not in ("ignore", "fail"):
            raise ConfigError(f"fail_policy: must be 'ignore' or 'fail', not {self.fail_policy!r}")
        for key, (low, high) in NUMBERS.items():
            _check_number(key, getattr(self, key), low, high)
        if self.relay_buffer_bytes < self.max_recv_message_bytes + 1024:
            raise ConfigError(
                f"relay_buffer_bytes: must hold one largest message (max_recv_message_bytes + 1024 ="
                f" {self.max_recv_message_bytes + 1024}), not {self.relay_buffer_bytes}"
            )
        if self.relay_buffer_total_bytes < self.relay_buffer_bytes:
            raise ConfigError(
                f"relay_buffer_total_bytes: must be at least relay_buffer_bytes ({self.relay_buffer_bytes}),"
                f" not {self.relay_buffer_total_bytes}"
            )
        if self.log_level.upper() not in LOG_LEVELS:
            raise ConfigError(f"log_level: unknown level {self.log_level!r}")
        for key in ("reserved_cpus", "system_cpus"):
            try:
                CPUSet.parse(getattr(self, key))
            except CpuError as exc:
                raise ConfigError(f"{key}: {exc}") from None
        for key in ("listen", "runtime_endpoint"):
            if not getattr(self, key):
                raise ConfigError(f"{key}: must not be empty")
        for key, endpoint in (
            ("listen", self.listen),
            ("runtime_endpoint", self.runtime_endpoint),
            (
                "admin_listen" if self.admin_listen.strip() else "admin_listen (unset: beside listen)",
                self.admin_endpoint,
            ),
        ):
            try:
                socket_path(endpoint)
            except EndpointError as exc:
                raise ConfigError(f"{key}: {exc}") from None
        admin, listen = socket_path(self.admin_endpoint), socket_path(self.listen)
        if admin is None:
            raise ConfigError(f"admin_listen: must be a unix:// socket, not {self.admin_listen!r}")
        if admin == listen:
            raise ConfigError(f"admin_listen: must differ from listen ({self.listen!r})")
        return self

    @property
    def admin_endpoint(self) -> str:
        """Where the admin socket is: `admin_listen`, or admin.sock in the directory of `listen`."""
        return self.admin_listen.strip() or admin_endpoint_beside(self.listen)


LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")
DAY = 86400.0
GRPC_MAX_MESSAGE = 2**31 - 1  # grpc keeps message limits in a signed 32-bit int

NUMBERS: dict[str, tuple[float, float]] = {
    "max_recv_message_bytes": (1024, GRPC_MAX_MESSAGE),
    "max_send_message_bytes": (1024, GRPC_MAX_MESSAGE),
    "shutdown_grace_seconds": (0.0, DAY),
    "exclusive_wait_seconds": (0.0, DAY),
    "reconcile_period_seconds": (0.0, DAY),  # 0: passes only on changes
    "kubelet_poll_seconds": (0.01, DAY),  # 0 would poll in a busy loop
    "reconcile_concurrency": (1, 1024),
    "relay_buffer_bytes": (2048, 1 << 40),
    "relay_buffer_total_bytes": (2048, 1 << 40),
}
"""Numeric keys and their inclusive bounds; nan and infinities are refused for every one."""


def _check_number(key: str, value: float, low: float, high: float) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: must be a finite number, not {value}")
    if not low <= value <= high:
        raise ConfigError(f"{key}: must be between {_number(low)} and {_number(high)}, not {value}")


def _number(bound: float) -> str:
    """A bound as written in a config file: 2147483647, not 2.14748e+09."""
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def _check_metrics_address(address: str, allow_remote: bool) -> None:
    """HOST:PORT (`[v6]:PORT`); a host that is not loopback only with `allow_remote_metrics`."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"metrics_address: expected HOST:PORT, not {address!r}")
    if is_loopback(host) or allow_remote:
        return
    raise ConfigError(
        f"metrics_address: {host} is not a loopback address and the listener has no authentication;"
        " set allow_remote_metrics = true to serve /metrics, /healthz and /readyz there anyway"
    )


def is_loopback(host: str) -> bool:
    """An IP literal in 127.0.0.0/8 or ::1, or a name that always means this host."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_cpus(config: Config, online: CPUSet, present: CPUSet | None = None) -> list[str]:
    """`reserved_cpus` and `system_cpus` against the node: CPUs it has, and not every one reserved.

    A CPU the node has (`present`) but that is offline now (taken out by an operator, or by the
    kernel's handling of a failing core) is no reason to refuse a start: the node's CRI path would
    be down for it. It is named in the warnings returned, and used once it is online again."""
    has = online if present is None else present | online
    warnings = []
    for key in ("reserved_cpus", "system_cpus"):
        cpus = CPUSet.parse(getattr(config, key))
        missing = cpus - has
        if missing:
            raise ConfigError(f"{key}: CPUs {missing} are not online on this node (online: {online})")
        if cpus - online:
            warnings.append(
                f"{key}: CPUs {cpus - online} are offline now (online: {online}); used once online"
            )
    reserved = CPUSet.parse(config.reserved_cpus)
    if has and reserved >= has:
        raise ConfigError(
            f"reserved_cpus: {config.reserved_cpus} covers every online CPU ({online}),"
            " which leaves no CPU for the share pools"
        )
    if online and reserved >= online:
        warnings.append(
            f"reserved_cpus: {config.reserved_cpus} covers every CPU online now ({online}):"
            " the share pools are empty until more are online"
        )
    return warnings


RELOADABLE = frozenset(
    {
        "log_level",
        "log_format",
        "reserved_cpus",
        "system_cpus",
        "fail_policy",
        "dry_run",
        "exclusive_wait_seconds",
        "reconcile_concurrency",
        "reconcile_period_seconds",
        "kubelet_poll_seconds",
        "shutdown_grace_seconds",
    }
)
"""What SIGHUP can change; everything else needs a restart (and the log says so)."""

_TYPES: dict[str, type] = {f.name: type(getattr(Config(), f.name)) for f in fields(Config)}


TABLES: dict[str, str] = {"kubernetes": "kubernetes_"}
"""TOML tables: `[table] key = value` sets the field `<prefix>key`; those fields have no flat key."""


def _coerce(key: str, value: Any, name: str | None = None) -> Any:
    want = _TYPES[key]
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        raise ConfigError(f"{name or key}: expected {want.__name__}, got {type(value).__name__} {value!r}")
    return value


def _from_file(data: dict[str, Any], file: Path) -> dict[str, Any]:
    """The file's keys as field names; unknown keys (also inside a table) refused by name."""
    values: dict[str, Any] = {}
    for key, value in data.items():
        prefix = TABLES.get(key)
        if prefix is not None:
            if not isinstance(value, dict):
                raise ConfigError(f"config file {file}: {key}: expected a table [{key}], got {value!r}")
            for sub, item in value.items():
                if prefix + sub not in _TYPES:
                    raise ConfigError(f"config file {file}: unknown key '{key}.{sub}'")
                values[prefix + sub] = _coerce(prefix + sub, item, f"{key}.{sub}")
            continue
        if key not in _TYPES or key.startswith(tuple(TABLES.values())):
            raise ConfigError(f"config file {file}: unknown key {key!r}")
        values[key] = _coerce(key, value)
    return values


def load(path: Path | None, overrides: dict[str, Any] | None = None) -> Config:
    """Defaults <- file (absent default file is fine) <- overrides (flags that were given)."""
    values: dict[str, Any] = {}
    file = path if path is not None else DEFAULT_CONFIG_FILE
    try:  # bounded and never blocking: a FIFO or /dev/zero named here must not hang the start
        text = text_of(read_small(file, MAX_CONFIG_BYTES, devices=True), file)
    except FileNotFoundError:
        if path is not None and path != DEFAULT_CONFIG_FILE:
            raise ConfigError(f"config file {file} does not exist") from None
        text = ""
    except OSError as exc:
        raise ConfigError(f"config file {file}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"config file {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {file}: not valid TOML: {exc}") from None
    values.update(_from_file(data, file))
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = _coerce(key, value)
    return replace(Config(), **values).validate()
