"""Run the relay: socket checks, the grpc.aio server, the runtime channel, and clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import shutil
import signal
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import grpc.aio
from loguru import logger

from cri_proxy.config import Config
from cri_proxy.endpoints import grpc_target, prepare_listen_socket, remove_socket, socket_path
from cri_proxy.errors import EndpointError
from cri_proxy.relay.forward import FailPolicy, Forwarder
from cri_proxy.relay.hooks import HookTable
from cri_proxy.relay.transport import FrameRelay, bind_unix

SOCKET_MODE = 0o660
INTERNAL_SOCKET_MODE = 0o600
_SUN_PATH_MAX = 100  # sockaddr_un holds 108 bytes; longer internal socket paths go to a temp dir


def channel_options(config: Config) -> list[tuple[str, int]]:
    """Message limits, and reconnect back-off short enough to notice a restarted runtime quickly."""
    return [
        ("grpc.max_receive_message_length", config.max_recv_message_bytes),
        ("grpc.max_send_message_length", config.max_send_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


def server_options(config: Config) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", config.max_recv_message_bytes),
        ("grpc.max_send_message_length", config.max_send_message_bytes),
    ]


class _Details(NamedTuple):
    """A grpc.HandlerCallDetails for asking a handler whether it answers a path."""

    method: str
    invocation_metadata: tuple[tuple[str, str], ...] = ()


def own_paths(
    handlers: Iterable[grpc.GenericRpcHandler[Any, Any]], services: tuple[str, ...] = ()
) -> Callable[[str], bool]:
    """Which request paths the proxy answers itself: those of `services`, else what a handler answers."""
    if services:
        prefixes = tuple(f"/{name}/" for name in services)
        return lambda path: path.startswith(prefixes)
    found = tuple(handlers)

    def owns(path: str) -> bool:
        details = _Details(path)
        return any(h.service(details) is not None for h in found)  # type: ignore[arg-type]

    return owns


class Relay:
    """The running proxy server: `start()`, then `wait()` or `stop()`.

    relay_mode "grpc": one grpc.aio server with the extra handlers and the forwarder on `listen`.
    relay_mode "frames": the frame relay on `listen`; with extra handlers, a connection whose first
    request is for one of them is piped to that same grpc.aio server on a private socket instead
    (`.<name>.internal` beside the listen socket), which answers it and forwards any CRI call the
    connection makes later, as relay_mode "grpc" does.
    """

    def __init__(
        self,
        config: Config,
        hooks: HookTable | None = None,
        extra_handlers: tuple[grpc.GenericRpcHandler[Any, Any], ...] = (),
        own_services: tuple[str, ...] = (),
    ) -> None:
        self.config = config
        self.channel = grpc.aio.insecure_channel(
            grpc_target(config.runtime_endpoint), options=channel_options(config)
        )
        self.forwarder = Forwarder(
            self.channel, config.runtime_endpoint, hooks, FailPolicy(config.fail_policy)
        )
        self.server = grpc.aio.server(options=server_options(config))
        # Our own services (health, introspection) first; the forwarder answers everything else.
        self.server.add_generic_rpc_handlers((*extra_handlers, self.forwarder))
        self._socket = socket_path(config.listen)
        self._bound = False  # only a socket we bound is ours to remove
        self._stopped = asyncio.Event()
        # relay_mode "frames": HTTP/2 frames relayed per connection (fastpath.py) instead of self.server
        self.frames: FrameRelay | None = None
        self.internal: Any = None  # (the first-request route is going away with the admin socket)
        self._internal_dir: Path | None = None  # a temp dir we made for the internal socket
        if config.relay_mode == "frames":
            if self._socket is None:
                raise EndpointError(f"relay_mode 'frames' needs a unix:// listen endpoint: {config.listen!r}")
            # fail policy, metrics observer and hook runner are the forwarder's (serve.py sets them)
            self.frames = FrameRelay(
                config,
                hooks,
                lambda: self.forwarder.fail_policy,
                lambda: self.forwarder.observer,
                runner=self.forwarder.runner,
            )

    async def start(self) -> None:
        if self.frames is not None and self._socket is not None:  # relay_mode "frames"
            prepare_listen_socket(self._socket, self.config.allow_world_writable_socket_dir)
            old = os.umask(0o117)
            try:
                sock = bind_unix(str(self._socket))
                self._bound = True
            finally:
                os.umask(old)
            self._secure_socket(self._socket)
            try:
                if self.internal is not None:
                    await self._start_internal(self._socket)
                await self.frames.start(sock)
            except BaseException:
                sock.close()
                self._remove_sockets()
                raise
            config = self.config
            logger.info("cri-proxy relaying frames on {} -> {}", config.listen, config.runtime_endpoint)
            return
        if self._socket is not None:
            prepare_listen_socket(self._socket, self.config.allow_world_writable_socket_dir)
            old = os.umask(0o117)  # the socket is born 0660: no moment where others may connect
            try:
                self._bind()
                self._bound = True
            finally:
                os.umask(old)
            self._secure_socket(self._socket)
        else:
            self._bind()
        await self.server.start()
        logger.info("cri-proxy serving on {} -> runtime {}", self.config.listen, self.config.runtime_endpoint)

    async def _start_internal(self, listen: Path) -> None:
        """The grpc.aio server (own services + forwarder) on a socket only this user may use."""
        assert self.internal is not None
        path = listen.parent / f".{listen.name}.internal"
        if len(str(path)) > _SUN_PATH_MAX:
            self._internal_dir = Path(tempfile.mkdtemp(prefix="cri-proxy-"))  # 0700
            path = self._internal_dir / "internal.sock"
        prepare_listen_socket(path, allow_world_writable_dir=True)  # a stale one goes; never a live one
        old = os.umask(0o177)
        try:
            bound = self.server.add_insecure_port(f"unix://{path}")
        except RuntimeError as exc:
            raise EndpointError(f"cannot listen on internal socket {path}: {exc}") from exc
        finally:
            os.umask(old)
        if not bound:
            raise EndpointError(f"cannot listen on internal socket {path}")
        self.internal.path = str(path)
        os.chmod(path, INTERNAL_SOCKET_MODE)
        await self.server.start()

    def _remove_sockets(self) -> None:
        if self._socket is not None and self._bound:
            remove_socket(self._socket)
        if self.internal is not None and self.internal.path:
            remove_socket(Path(self.internal.path))
        if self._internal_dir is not None:
            shutil.rmtree(self._internal_dir, ignore_errors=True)
            self._internal_dir = None

    def _bind(self) -> None:
        target = grpc_target(self.config.listen)
        try:
            bound = self.server.add_insecure_port(target)
        except RuntimeError as exc:
            raise EndpointError(f"cannot listen on {self.config.listen}: {exc}") from exc
        if self._socket is None and bound == 0:
            raise EndpointError(f"cannot listen on {self.config.listen}")

    def _secure_socket(self, path: Path) -> None:
        os.chmod(path, SOCKET_MODE)
        if self.config.socket_group:
            try:
                gid = grp.getgrnam(self.config.socket_group).gr_gid
            except KeyError:
                raise EndpointError(f"socket_group: no group named {self.config.socket_group!r}") from None
            os.chown(path, 0 if os.geteuid() == 0 else -1, gid)

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting, let in-flight calls finish within the grace, remove the socket."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        grace = self.config.shutdown_grace_seconds if grace is None else grace
        if self.frames is not None:  # relay_mode "frames"
            await self.frames.stop(grace)
        else:
            await self.server.stop(grace)
        await self.channel.close(None)
        self._remove_sockets()
        logger.info("cri-proxy stopped")

    async def wait(self) -> None:
        await self._stopped.wait()


async def run_until_signalled(
    start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]]
) -> None:
    """`start()`, serve until SIGTERM or SIGINT, then `stop()` (which shuts down gracefully)."""
    loop = asyncio.get_running_loop()
    signalled = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, signalled.set)
    try:
        await start()
        await signalled.wait()
        logger.info("signal received: stopping")
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)
        await stop()
