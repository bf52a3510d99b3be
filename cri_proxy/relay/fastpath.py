"""The frame relay: each client connection is paired 1:1 with a runtime connection, frames pass unchanged.

Why: a gRPC relay in Python pays grpcio's per-call cost twice (server and client side). Passing
HTTP/2 frames keeps SETTINGS, PING, flow control, GOAWAY, RST_STREAM, HPACK state and stream ids
end to end, so the relay only has to find frame boundaries. It still decodes every client header
block (HPACK, to keep its decoder in sync) to learn each stream's `:path`; a stream whose method
has hooks has its request DATA held until END_STREAM, decoded, passed to the pre hook and sent on
re-encoded, within the runtime's flow-control windows. The relay's own frames (rewritten DATA,
refusals, WINDOW_UPDATE corrections) never touch either side's HPACK dynamic table.

The socket carries CRI alone (the proxy's own services are on the admin socket): a Link dials the
runtime as soon as its client connects and relays from the first byte, so the client's SETTINGS,
PINGs and the runtime's answers to them pass from the connection's start.

Here: the listener (FrameRelay) and Link, a connection's life.
A Link's state is in linkstate.py, its frame relay (both ways, windows, backlog) in framelink.py, its
hooked streams in hooked.py; the stand-in for an unreachable runtime is in unreachable.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from typing import cast

from loguru import logger

from cri_proxy.config import Config
from cri_proxy.endpoints import socket_path
from cri_proxy.errors import EndpointError
from cri_proxy.relay import frames as h2
from cri_proxy.relay.forward import CallObserver, FailPolicy
from cri_proxy.relay.framelink import _FrameLink
from cri_proxy.relay.hooks import HookTable
from cri_proxy.relay.linkstate import _decoder
from cri_proxy.relay.methods import KNOWN
from cri_proxy.relay.unreachable import _Unreachable

_CONNECT_TIMEOUT = 5.0
_WRITE_BUFFER_HIGH = 1 << 20


class FrameRelay:
    """Accepts client connections on a bound Unix socket and pairs each with a runtime connection."""

    def __init__(
        self,
        config: Config,
        hooks: HookTable | None = None,
        fail_policy: Callable[[], FailPolicy] | None = None,
        observer: Callable[[], CallObserver | None] | None = None,
    ) -> None:
        runtime = socket_path(config.runtime_endpoint)
        if runtime is None:
            raise EndpointError(
                f"relay_mode 'frames' needs a unix:// runtime_endpoint, not {config.runtime_endpoint!r}"
            )
        self.runtime_path = str(runtime)
        self.endpoint = config.runtime_endpoint
        self.hooks = hooks if hooks is not None else HookTable()
        fixed = FailPolicy(config.fail_policy)
        self._fail_policy = fail_policy or (lambda: fixed)  # read per call: a reload may change it
        self.observer = observer or (lambda: None)  # metrics, as the grpc relay's `_measured` records
        self.message_limit = min(config.max_recv_message_bytes, config.max_send_message_bytes)
        self.links: set[Link] = set()
        self._server: asyncio.AbstractServer | None = None

    @property
    def fail_policy(self) -> FailPolicy:
        return self._fail_policy()

    def watch_responses(self) -> bool:
        """Whether any hook needs the runtime's answers (then its header blocks are decoded too)."""
        if not len(self.hooks):
            return False
        found = (self.hooks.get(path) for path in KNOWN)
        return any(h is not None and (h.post is not None or h.failed is not None) for h in found)

    async def start(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: Link(self), sock=sock)

    async def stop(self, grace: float) -> None:
        """Stop accepting; GOAWAY every client; wait up to `grace` for open calls; close the rest."""
        loop = asyncio.get_running_loop()
        if self._server is not None:
            self._server.close()
        for link in list(self.links):
            link.go_away()
        deadline = loop.time() + grace
        while any(link.busy() for link in self.links) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for link in list(self.links):
            link.close()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):  # uvloop waits for every connection to detach
                await asyncio.wait_for(self._server.wait_closed(), 1.0)


class _RuntimeSide(asyncio.Protocol):
    """The runtime connection's protocol: hands everything to its Link."""

    def __init__(self, link: Link) -> None:
        self.link = link

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.link.runtime = cast(asyncio.Transport, transport)
        self.link.runtime.set_write_buffer_limits(high=_WRITE_BUFFER_HIGH)

    def data_received(self, data: bytes) -> None:
        self.link.from_runtime(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.runtime_lost(exc)

    def pause_writing(self) -> None:
        if self.link.client is not None:
            self.link.client.pause_reading()

    def resume_writing(self) -> None:
        if self.link.client is not None:
            self.link.client.resume_reading()


class Link(_FrameLink):
    """One client connection and its runtime connection (the client side's protocol)."""

    # -- connection life ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.client = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses
        self.client.set_write_buffer_limits(high=_WRITE_BUFFER_HIGH)
        self.relay.links.add(self)
        self.observer = self.relay.observer()
        if len(self.relay.hooks) or self.observer is not None:
            self.c_block.dec = _decoder()
        if self.relay.watch_responses() or self.observer is not None:
            self.r_block.dec = _decoder()
        self._spawn(self._connect())  # relayed from the first byte: nothing waits for a request

    # -- the runtime connection -----------------------------------------------------------------
    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(
                loop.create_unix_connection(lambda: _RuntimeSide(self), self.relay.runtime_path),
                _CONNECT_TIMEOUT,
            )
        except (TimeoutError, OSError) as exc:
            if not self.closed and self.client is not None:
                reason = str(exc) or type(exc).__name__
                message = f"cri-proxy: runtime {self.relay.endpoint} is not reachable: {reason}"
                logger.debug("{}", message)
                self.stand_in = _Unreachable(self.client, message)
                for chunk in self.waiting:
                    self.stand_in.feed(chunk)
                self.waiting.clear()
            return
        if self.closed:
            if self.runtime is not None:
                self.runtime.close()
            return
        waiting, self.waiting = self.waiting, []
        for chunk in waiting:
            self._from_client(chunk)

    def data_received(self, data: bytes) -> None:
        if self.runtime is not None and not self.waiting:
            self._from_client(data)
        elif self.stand_in is not None:
            self.stand_in.feed(data)
        else:
            self.waiting.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.relay.links.discard(self)
        if self.stand_in is not None:
            self.stand_in.cancel()
        if self.runtime is not None:
            self.runtime.close()
        for st in self.streams.values():
            if st.hook is not None and st.hook.task is not None:
                st.hook.task.cancel()  # the caller went away: so does its pre hook (as in grpc mode)

    def pause_writing(self) -> None:
        if self.runtime is not None:
            self.runtime.pause_reading()

    def resume_writing(self) -> None:
        if self.runtime is not None:
            self.runtime.resume_reading()

    def go_away(self) -> None:
        """Ask the client to open no new streams (graceful: every stream it sent may complete)."""
        if self.stand_in is not None:
            self.stand_in.finish()
        elif self.client is not None and not self.closed:
            self._inject_r2c(h2.goaway(h2.MAX_WINDOW, h2.NO_ERROR))

    def busy(self) -> bool:
        """Relayed calls open."""
        return bool(self.streams) and not self.closed

    def close(self) -> None:
        self.closed = True  # what the runtime side reports from now on is of no interest
        if self.client is not None:
            self.client.close()
        if self.runtime is not None:
            self.runtime.close()


def bind_unix(path: str) -> socket.socket:
    """A bound Unix stream socket for the frame relay (the caller sets the umask around this)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise EndpointError(f"cannot listen on {path}: {exc.strerror or exc}") from exc
    return sock
