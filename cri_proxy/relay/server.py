"""Run the relay: socket checks, the grpc.aio server, the runtime channel, and clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import grpc.aio
from loguru import logger

from cri_proxy.config import Config
from cri_proxy.endpoints import (
    SocketId,
    grpc_target,
    kept_from_grpcio,
    prepare_listen_socket,
    remove_socket,
    secure_socket,
    socket_id,
    socket_path,
    why_not_bound,
)
from cri_proxy.errors import EndpointError
from cri_proxy.relay.forward import FailPolicy, Forwarder
from cri_proxy.relay.heap import HeapTrim, malloc_trim
from cri_proxy.relay.hooks import HookTable
from cri_proxy.relay.transport import FrameRelay, bind_unix

SOCKET_MODE = 0o660


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


class Relay:
    """The running proxy server on the CRI socket: `start()`, then `wait()` or `stop()`.

    relay_mode "grpc": a grpc.aio server carrying the forwarder alone on `listen`.
    relay_mode "frames": the frame relay on `listen` (transport.py, core.py). Either way the socket carries
    CRI only: the proxy's own services are on the admin socket (cri_proxy/daemon/admin.py).
    """

    def __init__(
        self, config: Config, hooks: HookTable | None = None, settings: Callable[[], Config] | None = None
    ) -> None:
        self.config = config  # what the relay was started with; `settings()` is what runs now
        self.settings = settings or (lambda: config)
        self.channel = grpc.aio.insecure_channel(
            grpc_target(config.runtime_endpoint), options=channel_options(config)
        )
        self.forwarder = Forwarder(
            self.channel, config.runtime_endpoint, hooks, lambda: FailPolicy(self.settings().fail_policy)
        )
        self.server = grpc.aio.server(options=server_options(config))
        self.server.add_generic_rpc_handlers((self.forwarder,))
        self._socket = socket_path(config.listen)
        self._bound = False  # only a socket we bound is ours to remove
        self.socket_id: SocketId | None = None  # the socket file we bound (a removed one is made again)
        self._stopped = asyncio.Event()
        # relay_mode "frames": HTTP/2 frames relayed per connection (relay/core.py) instead of self.server
        self.frames: FrameRelay | None = None
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
        # the heap given back (heap.py): after each connection in "frames" mode, every `EVERY` seconds
        # in "grpc" mode, whose connections are grpcio's and end unseen
        self.heap = self.frames.heap if self.frames is not None else HeapTrim(malloc_trim())
        self._heap_looks: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.frames is not None and self._socket is not None:  # relay_mode "frames"
            await self._listen(self.frames, self._socket)
            config = self.config
            logger.info("cri-proxy relaying frames on {} -> {}", config.listen, config.runtime_endpoint)
            return
        if self._socket is not None:
            prepare_listen_socket(self._socket, self.config.allow_world_writable_socket_dir)
            old = os.umask(0o117)  # the socket is born 0660: no moment where others may connect
            try:
                self._bind()
                self._bound = True
                self.socket_id = socket_id(self._socket)
            finally:
                os.umask(old)
            self._secure_socket(self._socket)
        else:
            self._bind()
        await self.server.start()
        self._heap_looks = asyncio.get_running_loop().create_task(
            self.heap.look_every(), name="cri-proxy heap"
        )
        logger.info("cri-proxy serving on {} -> runtime {}", self.config.listen, self.config.runtime_endpoint)

    async def _listen(self, frames: FrameRelay, path: Path) -> None:
        """Bind `path` (born 0660), secure it and serve the frame relay on it."""
        prepare_listen_socket(path, self.config.allow_world_writable_socket_dir)
        old = os.umask(0o117)
        try:
            sock = bind_unix(str(path))
            self._bound = True
            self.socket_id = socket_id(path)
        finally:
            os.umask(old)
        try:
            self._secure_socket(path)
            await frames.start(sock)
        except BaseException:
            sock.close()
            self._remove_socket()
            raise

    def socket_gone(self) -> str | None:
        """None while the CRI socket file is the one this relay bound; else "removed" or "replaced"."""
        if self._socket is None or self.socket_id is None or self._stopped.is_set():
            return None
        if socket_id(self._socket) == self.socket_id:
            return None
        return "replaced" if os.path.lexists(self._socket) else "removed"

    async def remake_socket(self) -> bool:
        """The CRI socket file was removed: bind it again (frames mode; the connections open stay).
        False where it cannot be: grpc mode (grpcio binds paths only at its start)."""
        if self.frames is None or self._socket is None or os.path.lexists(self._socket):
            return False
        await self._listen(self.frames, self._socket)
        return True

    def _remove_socket(self) -> None:
        if self._socket is not None and self._bound:
            remove_socket(self._socket, self.socket_id)

    def _bind(self) -> None:
        target = grpc_target(self.config.listen)
        try:
            bound = self.server.add_insecure_port(target)
        except RuntimeError as exc:
            why = why_not_bound(self._socket) if self._socket is not None else str(exc)
            raise EndpointError(f"cannot listen on {self.config.listen}: {why}") from None
        if self._socket is None and bound == 0:
            raise EndpointError(f"cannot listen on {self.config.listen}")

    def _secure_socket(self, path: Path) -> None:
        secure_socket(path, SOCKET_MODE, self.config.socket_group, "socket_group")

    async def stop(self, grace: float | None = None) -> None:
        """`stop_serving`, then `close`."""
        await self.stop_serving(grace)
        await self.close()

    async def close(self) -> None:
        """Close the runtime channel: every call still on it ends (the proxy's own loops use it)."""
        await self.channel.close(None)

    async def stop_serving(self, grace: float | None = None) -> None:
        """Stop accepting, let in-flight calls finish within the grace, remove the socket. The
        runtime channel stays open for the loops that still use it until `close`."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        grace = self.settings().shutdown_grace_seconds if grace is None else grace
        if self.frames is not None:  # relay_mode "frames"
            await self.frames.stop(grace)
        else:
            if self._heap_looks is not None:
                self._heap_looks.cancel()
            self.heap.cancel()
            if self._socket is not None:
                with kept_from_grpcio(self._socket, self.socket_id):
                    await self.server.stop(grace)
            else:
                await self.server.stop(grace)
        self._remove_socket()
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
