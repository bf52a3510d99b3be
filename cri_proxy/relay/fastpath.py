"""The frame relay: each client connection is paired 1:1 with a runtime connection, frames pass unchanged.

Why: a gRPC relay in Python pays grpcio's per-call cost twice (server and client side). Passing
HTTP/2 frames keeps SETTINGS, PING, flow control, GOAWAY, RST_STREAM, HPACK state and stream ids
end to end, so the relay only has to find frame boundaries. It still decodes every client header
block (HPACK, to keep its decoder in sync) to learn each stream's `:path`; a stream whose method
has hooks has its request DATA held until END_STREAM, decoded, passed to the pre hook and sent on
re-encoded, within the runtime's flow-control windows. The relay's own frames (rewritten DATA,
refusals, WINDOW_UPDATE corrections) never touch either side's HPACK dynamic table.

When the proxy serves gRPC services of its own (introspection, health) on the same socket, a
connection is routed by its first request: the relay sends an empty SETTINGS frame (gRPC clients
wait for the server's preface before their first request; an empty one changes nothing, and the
client's ACK of it is kept from the server), reads the client's frames up to the first complete
header block, decodes its `:path` (with a decoder of its own, so the
connection's decoder later sees those bytes exactly once), and then connects the client either to
the runtime (the frame relay above, the buffered bytes replayed into it) or to the proxy's internal
grpc.aio server (a plain byte pipe; that server also forwards CRI calls, as relay_mode "grpc" does).

Here: the listener (FrameRelay) and Link, a connection's life and its routing by the first request.
A Link's state is in linkstate.py, its frame relay (both ways, windows, backlog) in framelink.py, its
hooked streams in hooked.py; the stand-in for an unreachable runtime is in unreachable.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

from loguru import logger

from cri_proxy.config import Config
from cri_proxy.endpoints import socket_path
from cri_proxy.errors import EndpointError
from cri_proxy.relay import frames as h2
from cri_proxy.relay.forward import CallObserver, FailPolicy
from cri_proxy.relay.framelink import _FrameLink
from cri_proxy.relay.hooks import HookTable
from cri_proxy.relay.linkstate import _PASS, _decoder, _Headers
from cri_proxy.relay.methods import KNOWN
from cri_proxy.relay.unreachable import _Unreachable

_CONNECT_TIMEOUT = 5.0
_WRITE_BUFFER_HIGH = 1 << 20
_FIRST_REQUEST_TIMEOUT = 10.0  # seconds a new connection may take to send its first request
_SNIFF_LIMIT = 1 << 20  # client bytes read at most while looking for the first request's :path
_STICKY_SECONDS = 30.0  # a process told to retry elsewhere has its new connections piped for this long
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(slots=True, eq=False)
class InternalRoute:
    """Where connections whose first request is for one of the proxy's own services go."""

    owns: Callable[[str], bool]  # a request path the internal server answers itself
    path: str = ""  # its Unix socket, set when it is bound


class FrameRelay:
    """Accepts client connections on a bound Unix socket and pairs each with a runtime connection."""

    def __init__(
        self,
        config: Config,
        hooks: HookTable | None = None,
        fail_policy: Callable[[], FailPolicy] | None = None,
        observer: Callable[[], CallObserver | None] | None = None,
        internal: InternalRoute | None = None,
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
        self.internal = internal
        # connections by where they went: "runtime" (frames relayed) or "internal" (byte pipe)
        # (and "moved": relayed connections told to retry a call for our own services elsewhere)
        self.routed: dict[str, int] = {"runtime": 0, "internal": 0, "moved": 0}
        # client pid -> until when its new connections go to the internal server (see Link._move)
        self.sticky: dict[int, float] = {}
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

    async def stop(
        self, grace: float, internal_stop: Callable[[float], Awaitable[None]] | None = None
    ) -> None:
        """Stop accepting; GOAWAY every client; wait up to `grace` for open calls; close the rest.

        `internal_stop(grace)` stops the internal server meanwhile: it sends its own GOAWAY through
        the piped connections and waits for their calls; they are closed once it is done.
        """
        loop = asyncio.get_running_loop()
        if self._server is not None:
            self._server.close()
        for link in list(self.links):
            link.go_away()
        deadline = loop.time() + grace

        async def relayed() -> None:
            while any(link.busy() for link in self.links) and loop.time() < deadline:
                await asyncio.sleep(0.02)

        if internal_stop is not None:
            await asyncio.gather(relayed(), internal_stop(grace))
        else:
            await relayed()
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
        if len(self.relay.hooks) or self.observer is not None or self.relay.internal is not None:
            self.c_block.dec = _decoder()
        if self.relay.watch_responses() or self.observer is not None:
            self.r_block.dec = _decoder()
        self.pid = _peer_pid(self.client)
        internal = self.relay.internal
        if internal is None:
            self.relay.routed["runtime"] += 1
            self._spawn(self._connect())
        elif self._sticky():
            self.piped = True
            self.relay.routed["internal"] += 1
            self._spawn(self._connect_internal(internal.path))
        else:
            self.sniff = bytearray()
            self.client.write(h2.settings())  # the server preface clients wait for: all defaults
            self.ack_owed = True
            loop = asyncio.get_running_loop()
            self.timer = loop.call_later(_FIRST_REQUEST_TIMEOUT, self._dismiss)

    # -- routing by the first request -----------------------------------------------------------
    def _sticky(self) -> bool:
        """Whether this client's process was told to retry a call elsewhere a short while ago."""
        sticky = self.relay.sticky
        if self.pid is None or not sticky:
            return False
        now = asyncio.get_running_loop().time()
        for pid in [pid for pid, until in sticky.items() if until < now]:
            del sticky[pid]
        return self.pid in sticky

    def _sniff(self) -> None:
        """Look for the first complete header block in what the client sent so far."""
        buf = self.sniff
        assert buf is not None
        preface = len(h2.PREFACE)
        if len(buf) < preface:
            if not h2.PREFACE.startswith(bytes(buf)):
                self._route(None)  # not HTTP/2: the runtime will say so
            return
        if self.s_off == 0:
            if buf[:preface] != h2.PREFACE:
                return self._route(None)
            self.s_off = preface
        off, size = self.s_off, len(buf)
        while size - off >= h2.HEADER_LEN:
            length, ftype, flags, _ = h2.read_head(buf, off)
            end = off + h2.HEADER_LEN + length
            if end > size:
                break
            payload = bytes(buf[off + h2.HEADER_LEN : end])
            off = end
            if ftype == h2.HEADERS and not self.s_frags:
                try:
                    self.s_frags.append(h2.header_fragment(flags, payload))
                except h2.FrameError:
                    return self._route(None)
            elif ftype == h2.CONTINUATION and self.s_frags:
                self.s_frags.append(payload)
            elif self.s_frags:
                return self._route(None)  # a header block interrupted: the runtime will object
            else:
                continue
            if flags & h2.END_HEADERS:
                try:  # a decoder of our own: the connection's decoders see these bytes later
                    headers = cast(_Headers, _decoder().decode(b"".join(self.s_frags), raw=True))
                except Exception:  # hpack errors, or worse: the runtime's side will report them
                    return self._route(None)
                path = h2.header_value(headers, b":path")
                return self._route(path.decode("utf-8", "replace") if path is not None else None)
        self.s_off = off
        if size > _SNIFF_LIMIT:
            self._route(None)

    def _route(self, path: str | None) -> None:
        """Connect the client to the internal server (one of our own services) or to the runtime."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        assert self.sniff is not None
        self.waiting = [bytes(self.sniff)]
        self.sniff, self.s_frags = None, []
        internal = self.relay.internal
        if path is not None and internal is not None and internal.owns(path):
            self.piped = True
            self.relay.routed["internal"] += 1
            self._spawn(self._connect_internal(internal.path))
        else:
            self.relay.routed["runtime"] += 1
            self._spawn(self._connect())

    def _dismiss(self) -> None:
        """No request in time (or the relay stops): GOAWAY, and close."""
        self.timer = None
        if self.sniff is None or self.closed or self.client is None:
            return
        self.sniff = None
        self.client.write(h2.goaway(0, h2.NO_ERROR))
        self.client.close()

    async def _connect_internal(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(
                loop.create_unix_connection(lambda: _RuntimeSide(self), path), _CONNECT_TIMEOUT
            )
        except (TimeoutError, OSError) as exc:
            logger.error("cannot reach the internal server at {}: {}", path, exc)
            self.close()
            return
        for chunk in self._connected():
            self._to_internal(chunk)

    def _connected(self) -> list[bytes]:
        """The runtime side is up: what the client sent meanwhile, to pass on now; nothing (and
        the new connection closed) when the link closed while it connected."""
        if self.closed:
            if self.runtime is not None:
                self.runtime.close()
            return []
        waiting, self.waiting = self.waiting, []
        return waiting

    def _to_internal(self, data: bytes) -> None:
        """Client bytes for the internal server: unchanged, but for the ACK of our SETTINGS."""
        if self.runtime is None:
            return
        if not self.ack_owed:
            self.runtime.write(data)
            return
        self.c_buf += data
        buf = self.c_buf
        off = 0
        if self.preface_left:
            off = min(self.preface_left, len(buf))
            self.preface_left -= off
        while len(buf) - off >= h2.HEADER_LEN:
            length, ftype, flags, _ = h2.read_head(buf, off)
            end = off + h2.HEADER_LEN + length
            if end > len(buf):
                break
            if ftype == h2.SETTINGS and flags & h2.ACK:
                self.ack_owed = False
                self.c_buf = bytearray()
                self.runtime.writelines([buf[:off], buf[end:]])
                return
            off = end
        self.runtime.write(bytes(buf[:off]))
        del buf[:off]

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
        for chunk in self._connected():
            self._from_client(chunk)

    def data_received(self, data: bytes) -> None:
        if self.sniff is not None:
            self.sniff += data
            self._sniff()
        elif self.piped:
            if self.runtime is not None and not self.waiting:
                self._to_internal(data)
            else:
                self.waiting.append(data)
        elif self.runtime is not None and not self.waiting:
            self._from_client(data)
        elif self.stand_in is not None:
            self.stand_in.feed(data)
        else:
            self.waiting.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.relay.links.discard(self)
        if self.timer is not None:
            self.timer.cancel()
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
        if self.sniff is not None:
            self._dismiss()
        elif self.piped:
            pass  # the internal server sends its own GOAWAY as it stops
        elif self.stand_in is not None:
            self.stand_in.finish()
        elif self.moving:
            pass  # a GOAWAY went already; another may not name a higher stream
        elif self.client is not None and not self.closed:
            self._inject_r2c(h2.goaway(h2.MAX_WINDOW, h2.NO_ERROR))

    def busy(self) -> bool:
        """Relayed calls open (a piped connection's calls are the internal server's to wait for)."""
        return bool(self.streams) and not self.closed

    def close(self) -> None:
        self.closed = True  # what the runtime side reports from now on is of no interest
        if self.client is not None:
            self.client.close()
        if self.runtime is not None:
            self.runtime.close()

    def _move(self, sid: int, path: str) -> int:
        """A call for our own services on a connection relayed to the runtime: refuse it unprocessed.

        GOAWAY (last stream: the one before) tells the client that this stream and any later one
        were not processed: gRPC clients retry them, transparently, on a new connection, which goes
        to the internal server (the client's process is remembered for a while: a retried batch
        may start with a CRI call, and a second refusal would not be retried again). The header
        block still goes to the runtime (its HPACK decoder must see it), cancelled at once, before
        any of the request's DATA: the runtime never runs it. Its answers on the stream go to the
        client (HPACK again), which ignores them.
        """
        if not self.moving:
            self.moving = True
            self.relay.routed["moved"] += 1
            if self.pid is not None:  # its retries (and its next calls) go to the internal server
                self.relay.sticky[self.pid] = asyncio.get_running_loop().time() + _STICKY_SECONDS
            logger.debug("frame relay: {} on a runtime connection: GOAWAY, the client retries it", path)
            self._inject_r2c(h2.goaway(self.last_stream, h2.NO_ERROR))
        self.dropping.add(sid)
        self._inject_c2r(h2.rst_stream(sid, h2.CANCEL))
        return _PASS


def _peer_pid(transport: asyncio.Transport) -> int | None:
    """The client's process id (SO_PEERCRED), when the transport tells."""
    sock = transport.get_extra_info("socket")
    try:
        pid: int = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))[0]
    except (AttributeError, OSError, struct.error):
        return None
    return pid if pid > 0 else None


def bind_unix(path: str) -> socket.socket:
    """A bound Unix stream socket for the frame relay (the caller sets the umask around this)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise EndpointError(f"cannot listen on {path}: {exc.strerror or exc}") from exc
    return sock
