"""Default paths and endpoints, in a module that imports nothing: `ctl` needs them to start,
and importing the config (with the CPU rules behind it) would cost more than crictl's whole run."""

from __future__ import annotations

from pathlib import Path

DEFAULT_CONFIG_FILE = Path("/etc/cri-proxy/config.toml")
DEFAULT_LISTEN = "unix:///run/cri-proxy/cri-proxy.sock"
DEFAULT_RUNTIME_ENDPOINT = "unix:///run/containerd/containerd.sock"
