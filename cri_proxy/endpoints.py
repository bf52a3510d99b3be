"""gRPC endpoint addresses and the proxy's own Unix socket file.

Kept apart from the server so the start-up checks (stale socket, live owner, symlink) can be
tested on their own and reused by the CLI.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

from cri_proxy.errors import EndpointError

SUN_PATH_MAX = 107  # bytes of a Unix socket's path on Linux (sun_path is 108, with its NUL)


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
    size = len(os.fsencode(path))
    if size > SUN_PATH_MAX:  # bind and connect would fail, and grpcio's words for it are vague
        raise EndpointError(
            f"unix endpoint {endpoint!r}: its path is {size} bytes, over the {SUN_PATH_MAX} a socket's holds"
        )
    return Path(path)


ADMIN_SOCKET_NAME = "admin.sock"
DEFAULT_ADMIN_ENDPOINT = f"unix:///run/cri-proxy/{ADMIN_SOCKET_NAME}"


def admin_endpoint_beside(listen: str) -> str:
    """The admin socket that goes with a CRI socket: `admin.sock` in the same directory.

    Both `serve` (when `admin_listen` is not set) and `ctl` (when `--admin-endpoint` is not given)
    derive it the same way, so a proxy and a ctl pointed at one CRI socket find each other.
    A CRI endpoint that is not a Unix socket has no directory: the default admin socket then.
    """
    try:
        path = socket_path(listen)
    except EndpointError:
        path = None
    if path is None:
        return DEFAULT_ADMIN_ENDPOINT
    return f"unix://{path.parent / ADMIN_SOCKET_NAME}"


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
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        parent_mode = path.parent.stat().st_mode
    except OSError as exc:  # a part of the path is a file, no permission, a read-only file system
        why = "a part of it is not a directory" if isinstance(exc, FileExistsError) else exc.strerror
        raise EndpointError(f"cannot make the socket's directory {path.parent}: {why}") from None
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


def why_not_bound(path: Path) -> str:
    """Why grpcio could not bind a socket at `path`: it says only "Failed to bind" (the cause is in
    its own log line, if anywhere), so the same bind is tried here and its errno named."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(str(path))
        except OSError as exc:
            return exc.strerror or str(exc)
    remove_socket(path)  # made just now, by this bind
    return "grpcio could not bind it, though a bind of the same path here could"


def secure_socket(path: Path, mode: int, group: str, key: str) -> None:
    """Give a socket we bound its mode, and its group when `group` names one (`key`: the config key)."""
    os.chmod(path, mode)
    if group:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise EndpointError(f"{key}: no group named {group!r}") from None
        os.chown(path, 0 if os.geteuid() == 0 else -1, gid)


SocketId = tuple[int, int]
"""A socket file's (device, inode): which one sits at a path, ours or another server's."""


def socket_id(path: Path) -> SocketId | None:
    """The socket file at `path`, or None when there is none (nothing, or not a socket)."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISSOCK(st.st_mode) else None


@contextlib.contextmanager
def kept_from_grpcio(path: Path, ours: SocketId | None) -> Iterator[None]:
    """Around a grpcio server's stop: grpcio unlinks its Unix path when it stops, whoever's socket
    is there. Another server's socket at `path` (bound after ours was removed) is linked aside
    first and put back after; it is out of reach only between grpcio's unlink and the rename."""
    theirs = socket_id(path)
    aside: Path | None = None
    if theirs is not None and theirs != ours:
        aside = path.with_name(f".{path.name}.kept-{os.getpid()}")
        try:
            os.link(path, aside)
        except OSError:
            aside = None
    try:
        yield
    finally:
        if aside is not None:
            with contextlib.suppress(OSError):
                if socket_id(path) == theirs:  # grpcio left it: nothing to put back
                    os.unlink(aside)
                elif not os.path.lexists(path):
                    os.rename(aside, path)
                else:
                    os.unlink(aside)


def remove_socket(path: Path, ours: SocketId | None = None) -> None:
    """Remove our socket file at shutdown, leaving anything else alone: with `ours`, only that very
    file (another server may have bound the path after ours was removed)."""
    try:
        if ours is not None and socket_id(path) != ours:
            return
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
    except FileNotFoundError:
        pass
