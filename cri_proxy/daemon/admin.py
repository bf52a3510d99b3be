"""The admin socket: the proxy's own gRPC services (introspection for `ctl`, grpc.health.v1).

Why a socket of its own: the CRI socket then carries CRI alone, so the relay never has to look at
a connection's requests to decide who answers them. The admin socket is root-only by default
(0600): the views show every pod on the node. `admin_socket_group` opens it to one group (0660).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from loguru import logger

from cri_proxy.config import Config
from cri_proxy.endpoints import (
    SocketId,
    kept_from_grpcio,
    prepare_listen_socket,
    remove_socket,
    secure_socket,
    socket_id,
    socket_path,
    why_not_bound,
)
from cri_proxy.errors import EndpointError

ADMIN_SOCKET_MODE = 0o600
ADMIN_GROUP_SOCKET_MODE = 0o660


class AdminServer:
    """A small grpc.aio server on the admin socket: `check()`, `start()`, `stop(grace)`."""

    def __init__(self, config: Config, handlers: tuple[grpc.GenericRpcHandler[Any, Any], ...]) -> None:
        self.endpoint = config.admin_endpoint
        path = socket_path(self.endpoint)
        if path is None:  # Config.validate refuses this; a Config built by hand may still hold it
            raise EndpointError(f"admin_listen: must be a unix:// socket, not {self.endpoint!r}")
        self.path: Path = path
        self.group = config.admin_socket_group
        self.allow_world_writable_dir = config.allow_world_writable_socket_dir
        self.handlers = handlers
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers(handlers)
        self._bound = False  # only a socket we bound is ours to remove
        self._stopping = False
        self.socket_id: SocketId | None = None  # the socket file bound (a removed one is made again)

    def check(self) -> None:
        """Refuse a live owner, a symlink or a non-socket at the admin path now (start does it again)."""
        prepare_listen_socket(self.path, self.allow_world_writable_dir)

    async def start(self) -> None:
        prepare_listen_socket(self.path, self.allow_world_writable_dir)
        old = os.umask(0o177)  # born 0600: no moment where others may connect
        try:
            try:
                bound = self.server.add_insecure_port(f"unix://{self.path}")
            except RuntimeError:
                bound = 0
            if not bound:  # grpcio says only "Failed to bind"
                raise EndpointError(
                    f"cannot listen on the admin socket {self.path}: {why_not_bound(self.path)}"
                )
        finally:
            os.umask(old)
        self._bound = True
        self.socket_id = socket_id(self.path)
        try:
            mode = ADMIN_GROUP_SOCKET_MODE if self.group else ADMIN_SOCKET_MODE
            secure_socket(self.path, mode, self.group, "admin_socket_group")
            await self.server.start()
        except BaseException:
            remove_socket(self.path)
            self._bound = False
            raise
        logger.info("admin socket (introspection, health) on {}", self.endpoint)

    def socket_gone(self) -> str | None:
        """None while the admin socket file is the one bound (or it is being stopped: grpcio then
        unlinks it); else "removed" or "replaced"."""
        if not self._bound or self._stopping or socket_id(self.path) == self.socket_id:
            return None
        return "replaced" if os.path.lexists(self.path) else "removed"

    async def remake_socket(self) -> bool:
        """The admin socket file was removed: serve on a new one. grpcio binds paths only at a start,
        and unlinks its path when it stops, so the old server stops first (its calls get a second)."""
        if os.path.lexists(self.path):
            return False
        old, self.server = self.server, grpc.aio.server()
        self.server.add_generic_rpc_handlers(self.handlers)
        self._bound = False
        await old.stop(1.0)
        await self.start()
        return True

    async def stop(self, grace: float | None = None) -> None:
        self._stopping = True
        with kept_from_grpcio(self.path, self.socket_id):
            await self.server.stop(grace)
        if self._bound:
            remove_socket(self.path, self.socket_id)
            self._bound = False
