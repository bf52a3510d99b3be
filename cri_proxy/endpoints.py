"""gRPC endpoint addresses and the proxy's own Unix socket file.

Kept apart from the server so the start-up checks (stale socket, live owner, symlink) can be
tested on their own and reused by the CLI.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

from cri_proxy.errors import EndpointError


def socket_path(endpoint: str) -> Path | None:
    """The filesystem path of a `unix://` endpoint, or None for a TCP one."""
    if endpoint.startswith("unix://"):
        path = endpoint[len("unix://") :]
    elif endpoint.startswith("unix:"):
        path = endpoint[len("unix:") :]
    elif endpoint.startswith("/"):
        path = endpoint
    else:
        return None
    if not path.startswith("/"):
        raise EndpointError(f"unix endpoint {endpoint!r} must name an absolute path")
    return Path(path)


def grpc_target(endpoint: str) -> str:
    """What grpc wants for an endpoint: `unix:///abs/path` for sockets, the text otherwise."""
    path = socket_path(endpoint)
    return f"unix://{path}" if path is not None else endpoint


def socket_answers(path: Path, timeout: float = 0.5) -> bool:
    """True when a live server accepts connections on the socket at `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def prepare_listen_socket(path: Path, allow_world_writable_dir: bool = False) -> None:
    """Make `path` free for a new listening socket, or refuse with a clear error.

    The parent directory is created (0755). A socket file left by a dead server is removed; one
    that a live server answers on is never touched. Anything that is not a socket (a regular file,
    a symlink that could point anywhere) is refused rather than deleted.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    parent_mode = path.parent.stat().st_mode
    if parent_mode & stat.S_IWOTH and not allow_world_writable_dir:
        # anyone could plant a socket or symlink there between our checks and our bind
        raise EndpointError(
            f"refusing to listen in {path.parent}: the directory is world-writable "
            "(use a private directory such as /run/cri-proxy, or allow_world_writable_socket_dir = true)"
        )
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise EndpointError(f"refusing to listen on {path}: it is a symlink")
    if not stat.S_ISSOCK(st.st_mode):
        raise EndpointError(f"refusing to listen on {path}: it exists and is not a socket")
    if socket_answers(path):
        raise EndpointError(f"another server is already listening on {path}; refusing to start")
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:  # pragma: no cover - permission problems are environment-specific
        raise EndpointError(
            f"cannot remove stale socket {path}: {os.strerror(exc.errno or errno.EIO)}"
        ) from exc


def remove_socket(path: Path) -> None:
    """Remove our socket file at shutdown, leaving anything else alone."""
    try:
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
    except FileNotFoundError:
        pass
