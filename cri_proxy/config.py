"""The proxy's settings: defaults, the TOML file, then command-line flags, in that order.

Every option is declared once in `OPTIONS`; the file loader and the flag parser both read that
table, so a key that is not there is refused with its name, and a value of the wrong type too.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from cri_proxy.cpu.cpuset import CPUSet
from cri_proxy.defaults import DEFAULT_CONFIG_FILE as DEFAULT_CONFIG_FILE
from cri_proxy.defaults import DEFAULT_LISTEN as DEFAULT_LISTEN
from cri_proxy.defaults import DEFAULT_RUNTIME_ENDPOINT as DEFAULT_RUNTIME_ENDPOINT
from cri_proxy.errors import ConfigError, CpuError

MIB = 1024 * 1024


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
    relay_mode: str = "frames"  # "frames" (HTTP/2 frame relay, fastpath.py) or "grpc" (grpc.aio relay)
    log_level: str = "INFO"
    socket_group: str = ""
    allow_world_writable_socket_dir: bool = False
    state_dir: str = "/var/lib/cri-proxy"
    kubelet_state_file: str = "/var/lib/kubelet/cpu_manager_state"
    sysfs_root: str = "/sys"
    reserved_cpus: str = ""
    system_cpus: str = ""
    dry_run: bool = False
    exclusive_wait_seconds: float = 5.0
    reconcile_concurrency: int = 8
    reconcile_period_seconds: float = 30.0
    kubelet_poll_seconds: float = 1.0
    log_format: str = "auto"  # auto | text | json
    metrics_address: str = ""  # HOST:PORT for /metrics, /healthz, /readyz; empty: off
    kubernetes_enabled: bool = False  # [kubernetes] enabled: watch this node's pods for re-binds
    kubernetes_node_name: str = ""  # [kubernetes] node_name; empty: the host name
    kubernetes_kubeconfig: str = ""  # [kubernetes] kubeconfig; empty: in-cluster, then ~/.kube/config

    def validate(self) -> Config:
        if self.relay_mode not in ("grpc", "frames"):
            raise ConfigError(f"relay_mode: must be 'grpc' or 'frames', not {self.relay_mode!r}")
        if self.log_format not in ("auto", "text", "json"):
            raise ConfigError(f"log_format: must be 'auto', 'text' or 'json', not {self.log_format!r}")
        if self.metrics_address:
            host, sep, port = self.metrics_address.rpartition(":")
            if not sep or not host or not port.isdigit() or int(port) > 65535:
                raise ConfigError(f"metrics_address: expected HOST:PORT, not {self.metrics_address!r}")
        if self.fail_policy not in ("ignore", "fail"):
            raise ConfigError(f"fail_policy: must be 'ignore' or 'fail', not {self.fail_policy!r}")
        for key in ("max_recv_message_bytes", "max_send_message_bytes"):
            if getattr(self, key) < 1024:
                raise ConfigError(f"{key}: must be at least 1024 bytes, not {getattr(self, key)}")
        if self.shutdown_grace_seconds < 0:
            raise ConfigError(
                f"shutdown_grace_seconds: must not be negative, not {self.shutdown_grace_seconds}"
            )
        if self.log_level.upper() not in (
            "TRACE",
            "DEBUG",
            "INFO",
            "SUCCESS",
            "WARNING",
            "ERROR",
            "CRITICAL",
        ):
            raise ConfigError(f"log_level: unknown level {self.log_level!r}")
        for key in ("reserved_cpus", "system_cpus"):
            try:
                CPUSet.parse(getattr(self, key))
            except CpuError as exc:
                raise ConfigError(f"{key}: {exc}") from None
        for key in ("exclusive_wait_seconds", "reconcile_period_seconds", "kubelet_poll_seconds"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key}: must not be negative, not {getattr(self, key)}")
        if self.reconcile_concurrency < 1:
            raise ConfigError(f"reconcile_concurrency: must be at least 1, not {self.reconcile_concurrency}")
        for key in ("listen", "runtime_endpoint"):
            if not getattr(self, key):
                raise ConfigError(f"{key}: must not be empty")
        return self


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
    try:
        text = file.read_text()
    except FileNotFoundError:
        if path is not None and path != DEFAULT_CONFIG_FILE:
            raise ConfigError(f"config file {file} does not exist") from None
        text = ""
    except OSError as exc:
        raise ConfigError(f"config file {file}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {file}: not valid TOML: {exc}") from None
    values.update(_from_file(data, file))
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = _coerce(key, value)
    return replace(Config(), **values).validate()
