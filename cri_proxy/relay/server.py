"""Run the relay: socket checks, the grpc.aio server, the runtime channel, and clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from loguru import logger

from cri_proxy.config import Config
from cri_proxy.endpoints import grpc_target, prepare_listen_socket, remove_socket, socket_path
from cri_proxy.errors import ConfigError, EndpointError
from cri_proxy.relay.fastpath import FrameRelay, bind_unix
from cri_proxy.relay.forward import FailPolicy, Forwarder
from cri_proxy.relay.hooks import HookTable

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
    """The running proxy server: `start()`, then `wait()` or `stop()`."""

    def __init__(
        self,
        config: Config,
        hooks: HookTable | None = None,
        extra_handlers: tuple[grpc.GenericRpcHandler[Any, Any], ...] = (),
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
        if config.relay_mode == "frames":
            if extra_handlers:
                raise ConfigError(
                    "relay_mode 'frames' cannot serve cri-proxy's own gRPC services "
                    "(introspection, health) on the same socket; use relay_mode 'grpc'"
                )
            if self._socket is None:
                raise EndpointError(f"relay_mode 'frames' needs a unix:// listen endpoint: {config.listen!r}")
            # fail policy and metrics observer are read from the forwarder, where serve.py sets them
            self.frames = FrameRelay(
                config, hooks, lambda: self.forwarder.fail_policy, lambda: self.forwarder.observer
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
            await self.frames.start(sock)
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
        if self.frames is not None:  # relay_mode "frames"
            await self.frames.stop(self.config.shutdown_grace_seconds if grace is None else grace)
        else:
            await self.server.stop(self.config.shutdown_grace_seconds if grace is None else grace)
        await self.channel.close(None)
        if self._socket is not None and self._bound:
            remove_socket(self._socket)
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
