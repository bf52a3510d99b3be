"""One exception tree for the project, so callers can catch `CriProxyError` and nothing wider."""

from __future__ import annotations


class CriProxyError(Exception):
    """Root of every error the project raises on purpose."""


class CpuError(CriProxyError, ValueError):
    """A CPU list that does not parse (the message quotes the text)."""


class AllocationError(CriProxyError, ValueError):
    """A Koordinator allocation annotation that is not of the documented shape."""


class KubeletStateError(CriProxyError, ValueError):
    """A kubelet `cpu_manager_state` of an unknown shape."""


class SnapshotError(CriProxyError, ValueError):
    """A `plan` snapshot that is not valid JSON or not of the documented shape (names the key)."""


class SysfsError(CriProxyError):
    """Node topology could not be read from sysfs (names the file)."""


class ConfigError(CriProxyError):
    """A bad configuration file, key or value; the message names the key."""


class EndpointError(CriProxyError):
    """A socket or endpoint the proxy cannot use (live owner, symlink, bad address)."""


class CheckpointError(CriProxyError):
    """A checkpoint file that cannot be written, or read back (names the path and what was wrong)."""


class StateLockedError(CriProxyError):
    """Another cri-proxy process uses the same state directory."""
