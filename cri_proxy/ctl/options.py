"""crictl's global options: flags, then environment variables, then /etc/crictl.yaml, then defaults.

The names are crictl's, so habits and scripts carry over: `--runtime-endpoint/-r`,
`--image-endpoint/-i`, `--timeout/-t`, `--debug/-D`, `--config/-c`, and the variables
`CONTAINER_RUNTIME_ENDPOINT`, `IMAGE_SERVICE_ENDPOINT`, `CRI_CONFIG_FILE`. The config file has
crictl's keys (`runtime-endpoint`, `image-endpoint`, `timeout`, `debug`, `pull-image-on-create`).
What differs: the default endpoint is the proxy's socket, the default timeout is 10 s (crictl: 2 s,
too short for RunPodSandbox on a busy node), and `--bypass` talks to the runtime behind the proxy.
The proxy's own views (`cpusets`, `status`, ...) are asked on its admin socket: `--admin-endpoint`
(env `CRI_PROXY_ADMIN_ENDPOINT`), by default admin.sock beside the runtime endpoint.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from cri_proxy.ctl.errors import CtlError
from cri_proxy.defaults import DEFAULT_CONFIG_FILE, DEFAULT_LISTEN
from cri_proxy.endpoints import DEFAULT_ADMIN_ENDPOINT, admin_endpoint_beside
from cri_proxy.files import text_of

DEFAULT_CRICTL_CONFIG = Path("/etc/crictl.yaml")
DEFAULT_TIMEOUT = 10.0
ENV_RUNTIME = "CONTAINER_RUNTIME_ENDPOINT"
ENV_IMAGE = "IMAGE_SERVICE_ENDPOINT"
ENV_CONFIG = "CRI_CONFIG_FILE"
ENV_ADMIN = "CRI_PROXY_ADMIN_ENDPOINT"

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


class Settings(NamedTuple):
    """Where to connect and how, once every source has been read (a NamedTuple, not a dataclass:
    importing dataclasses costs a tenth of crictl's whole run)."""

    runtime_endpoint: str = DEFAULT_LISTEN
    image_endpoint: str = DEFAULT_LISTEN
    timeout: float = DEFAULT_TIMEOUT
    debug: bool = False
    bypass: bool = False
    pull_image_on_create: bool = False
    admin_endpoint: str = DEFAULT_ADMIN_ENDPOINT  # the proxy's own views (cpusets, status, ...)

    @property
    def role(self) -> str:
        """Who answers on the endpoint, for error messages: the proxy, or the runtime (--bypass)."""
        return "runtime" if self.bypass else "proxy"


def parse_duration(text: str) -> float:
    """Seconds from `10`, `10s`, `1.5s`, `500ms`, `1m30s` (a bare number is seconds, as in the file)."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        pos, seconds = 0, 0.0
        for match in _PART.finditer(value):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if pos != len(value) or not value:
            raise argparse.ArgumentTypeError(f"invalid duration {text!r} (e.g. 10s, 500ms, 1m)") from None
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: negative")
    return seconds


def parse_timeout(text: str) -> float:
    """--timeout: a duration; 0 or less means the default, as in crictl."""
    value = text.strip()
    return 0.0 if value.startswith("-") else parse_duration(value)


# the global flags that take a value, as `cri-proxy ctl` finds the command word before parsing
VALUE_FLAGS = frozenset(
    {
        "-r",
        "--runtime-endpoint",
        "-i",
        "--image-endpoint",
        "-t",
        "--timeout",
        "-c",
        "--config",
        "--proxy-config",
        "--admin-endpoint",
    }
)


def add_global_flags(parser: argparse.ArgumentParser) -> None:
    """crictl's global flags (defaults None: a flag that was not given leaves the next source)."""
    parser.add_argument(
        "-r",
        "--runtime-endpoint",
        metavar="ENDPOINT",
        help=f"CRI runtime endpoint (env {ENV_RUNTIME}; default: the proxy, {DEFAULT_LISTEN})",
    )
    parser.add_argument(
        "-i",
        "--image-endpoint",
        metavar="ENDPOINT",
        help=f"CRI image endpoint (env {ENV_IMAGE}; default: the runtime endpoint)",
    )
    parser.add_argument(
        "-t",
        "--timeout",
        type=parse_timeout,
        metavar="DURATION",
        help=f"timeout of each call, e.g. 2s or 500ms (default {DEFAULT_TIMEOUT:g}s; crictl's is 2s)",
    )
    parser.add_argument(
        "-D", "--debug", action="store_true", default=None, help="print requests and responses on stderr"
    )
    parser.add_argument(
        "-c",
        "--config",
        metavar="FILE",
        help=f"crictl's client config file (env {ENV_CONFIG}; default {DEFAULT_CRICTL_CONFIG})",
    )
    parser.add_argument(
        "--bypass",
        action="store_true",
        help="talk straight to the runtime behind the proxy (its runtime_endpoint, from --proxy-config)",
    )
    parser.add_argument(
        "--proxy-config",
        metavar="FILE",
        help=f"the proxy's TOML config, read by --bypass (default {DEFAULT_CONFIG_FILE})",
    )
    parser.add_argument(
        "--admin-endpoint",
        metavar="ENDPOINT",
        help=f"the proxy's admin socket, for cpusets/snapshot/plan/status/pools/problems (env {ENV_ADMIN}; "
        f"default: admin.sock beside the runtime endpoint, {DEFAULT_ADMIN_ENDPOINT})",
    )


def read_crictl_config(path: Path, explicit: bool) -> dict[str, Any]:
    """The keys of crictl's YAML config; a missing default file is no error, a bad file is."""
    try:
        text = text_of(path.read_bytes(), path)
    except FileNotFoundError:
        if explicit:
            raise CtlError(f"config file {path} does not exist") from None
        return {}
    except OSError as exc:
        raise CtlError(f"config file {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise CtlError(f"config file {exc}") from None
    if not text.strip():
        return {}
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CtlError(f"config file {path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CtlError(f"config file {path}: expected a mapping of crictl keys")
    for key, want in (
        ("runtime-endpoint", str),
        ("image-endpoint", str),
        ("timeout", (int, float)),
        ("debug", bool),
        ("pull-image-on-create", bool),
    ):
        value = data.get(key)
        wrong_bool = want is not bool and isinstance(value, bool)
        if value is not None and (not isinstance(value, want) or wrong_bool):
            raise CtlError(f"config file {path}: {key}: unexpected value {value!r}")
    return data


def _bypass_endpoint(proxy_config: str | None) -> str:
    from cri_proxy import config as config_mod
    from cri_proxy.errors import CriProxyError

    try:
        loaded = config_mod.load(Path(proxy_config) if proxy_config else None)
    except CriProxyError as exc:
        raise CtlError(f"--bypass: the proxy's config: {exc}") from None
    return loaded.runtime_endpoint


def resolve(args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
    """Flag > environment > crictl config file > default, as crictl does."""
    config_flag: str | None = args.config or env.get(ENV_CONFIG) or None
    file = read_crictl_config(Path(config_flag) if config_flag else DEFAULT_CRICTL_CONFIG, bool(config_flag))

    runtime: str = args.runtime_endpoint or env.get(ENV_RUNTIME) or file.get("runtime-endpoint") or ""
    runtime = runtime or DEFAULT_LISTEN
    image: str = args.image_endpoint or env.get(ENV_IMAGE) or file.get("image-endpoint") or runtime
    if args.timeout:  # crictl: 0 or less means the default
        timeout = float(args.timeout)
    elif file.get("timeout"):
        timeout = float(file["timeout"])
    else:
        timeout = DEFAULT_TIMEOUT
    debug = bool(args.debug) if args.debug is not None else bool(file.get("debug", False))
    admin: str = args.admin_endpoint or env.get(ENV_ADMIN) or admin_endpoint_beside(runtime)
    if args.bypass:
        for flag, value in (
            ("--runtime-endpoint", args.runtime_endpoint),
            ("--image-endpoint", args.image_endpoint),
        ):
            if value:
                raise CtlError(f"--bypass and {flag} contradict each other: give one")
        runtime = image = _bypass_endpoint(args.proxy_config)
    return Settings(
        runtime_endpoint=runtime,
        image_endpoint=image,
        timeout=timeout,
        debug=debug,
        bypass=bool(args.bypass),
        pull_image_on_create=bool(file.get("pull-image-on-create", False)),
        admin_endpoint=admin,
    )
