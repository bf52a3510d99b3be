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
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, TypeAlias, cast

import grpc
import hpack
from google.protobuf.message import DecodeError, Message
from loguru import logger

from cri_proxy.config import Config
from cri_proxy.endpoints import socket_path
from cri_proxy.errors import EndpointError
from cri_proxy.relay import frames as h2
from cri_proxy.relay.forward import CallObserver, FailPolicy
from cri_proxy.relay.hooks import HookError, Hooks, HookTable
from cri_proxy.relay.methods import KNOWN, MethodInfo, Shape

Buf: TypeAlias = bytes | bytearray
_Headers: TypeAlias = list[tuple[bytes, bytes]]  # hpack.Decoder.decode(raw=True) gives a list of these

_CODES: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}
_OK = 0
_INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]
_RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
_INTERNAL = grpc.StatusCode.INTERNAL.value[0]
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
_CONNECT_TIMEOUT = 5.0
_UNREACHABLE_LINGER = 0.2  # seconds a stand-in connection stays after answering its first call
_UNREACHABLE_LIFETIME = 2.0  # ... and at most, so an idle client reconnects (and retries the runtime)
_WRITE_BUFFER_HIGH = 1 << 20
_HEADER_LIST_LIMIT = 1 << 30  # the peers enforce their own limits; ours must never be the tighter one
_FIRST_REQUEST_TIMEOUT = 10.0  # seconds a new connection may take to send its first request
_SNIFF_LIMIT = 1 << 20  # client bytes read at most while looking for the first request's :path
_STICKY_SECONDS = 30.0  # a process told to retry elsewhere has its new connections piped for this long
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid

# what the parse loops do with a frame
_PASS = 0  # forward unchanged
_SKIP = 1  # consumed (held, dropped, or replaced): not forwarded
_DONE = 2  # already written by the handler, together with the frames before it


@dataclass(slots=True, eq=False)
class InternalRoute:
    """Where connections whose first request is for one of the proxy's own services go."""

    owns: Callable[[str], bool]  # a request path the internal server answers itself
    path: str = ""  # its Unix socket, set when it is bound


@dataclass(slots=True, eq=False)
class _Hooked:
    """A request stream whose method has hooks: its DATA is held until the client's END_STREAM."""

    info: MethodInfo
    hooks: Hooks
    window: int  # the runtime's send window for this stream
    held: list[Buf] = field(default_factory=list)
    received: int = 0  # flow-controlled bytes the client sent on this stream
    sent: int = 0  # flow-controlled bytes we sent the runtime on it
    out: bytes = b""  # the request to send (gRPC-framed), from out_at on
    out_at: int = 0
    releasing: bool = False  # the client ended its request: the pre hook runs
    sending: bool = False  # `out` is ready to go to the runtime
    finished: bool = False  # END_STREAM sent, or the stream ended otherwise
    request: Message | None = None  # as forwarded, for the post/failed hooks
    response: bytearray = field(default_factory=bytearray)
    task: asyncio.Task[None] | None = None


class _HeaderBlock:
    """One direction's header block (HEADERS, then CONTINUATIONs): both directions gather and
    decode theirs alike, and while one is open nothing may be inserted into that direction."""

    __slots__ = ("dec", "end", "frags", "open", "sid")

    def __init__(self) -> None:
        self.dec: hpack.Decoder | None = None  # None: this direction's headers are not read
        self.open = False
        self.sid = 0
        self.end = False  # the block's HEADERS frame ended its stream
        self.frags: list[Buf] = []

    def feed(self, ftype: int, flags: int, sid: int, buf: Buf, start: int, end: int) -> bool:
        """Take a HEADERS or CONTINUATION frame (payload `buf[start:end]`, copied only when read);
        True once the block is complete."""
        if ftype == h2.HEADERS:
            self.sid, self.end = sid, bool(flags & h2.END_STREAM)
            self.frags = [] if self.dec is None else [h2.header_fragment(flags, bytes(buf[start:end]))]
        elif self.dec is not None:
            self.frags.append(buf[start:end])
        self.open = not flags & h2.END_HEADERS
        return not self.open

    def decode(self) -> _Headers | None:
        """The complete block's headers, or None when not read; raises hpack.HPACKError."""
        if self.dec is None:
            return None
        headers = cast(_Headers, self.dec.decode(b"".join(self.frags), raw=True))
        self.frags = []
        return headers


@dataclass(slots=True, eq=False)
class _Stream:
    """An open stream: enough to end it ourselves if the runtime goes away."""

    id: int
    responded: bool = False  # response headers forwarded to the client
    hook: _Hooked | None = None
    need: int = 0  # response: body bytes still due of the current gRPC message
    head: bytes = b""  # response: partial 5-byte message prefix
    measured: str = ""  # unary method path when calls are measured
    began: float = 0.0  # when its headers arrived
    sent_at: float = 0.0  # when its request went on to the runtime


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


class Link(asyncio.Protocol):
    """One client connection and its runtime connection (the client side's protocol)."""

    def __init__(self, relay: FrameRelay) -> None:
        self.relay = relay
        self.client: asyncio.Transport | None = None
        self.runtime: asyncio.Transport | None = None
        self.stand_in: _Unreachable | None = None
        self.waiting: list[bytes] = []  # client bytes that arrived before the runtime connection
        self.closed = False
        self.c_buf = bytearray()
        self.r_buf = bytearray()
        self.preface_left = len(h2.PREFACE)
        # header blocks in progress: nothing may be inserted into a direction while one is open
        self.c_block = _HeaderBlock()
        self.r_block = _HeaderBlock()
        self.c_parsing = False
        self.streams: dict[int, _Stream] = {}
        self.last_stream = 0
        self.dropping: set[int] = set()  # response streams we ended ourselves (oversized message)
        # what we know of the runtime's receiving side
        self.max_frame = h2.DEFAULT_MAX_FRAME_SIZE
        self.initial_window = h2.DEFAULT_WINDOW
        self.conn_window = h2.DEFAULT_WINDOW
        self.backlog: deque[tuple[Buf, int]] = deque()  # frames for the runtime waiting for window
        self.queued = 0  # DATA bytes in the backlog; its peak shows how far the client ran ahead
        self.queued_peak = 0
        self.deferred_c2r: list[tuple[Buf, int]] = []
        self.deferred_r2c: list[Buf] = []
        # Held request bytes are credited back to the client at once (else it would wait for window the
        # runtime never gives: it has not seen them); the runtime later credits what we send it on
        # those streams, which the client must not get twice: `withheld` is kept back from it.
        self.withheld = 0
        self.credit: dict[int, int] = {}  # stream (0: connection) -> WINDOW_UPDATE owed to the client
        self.tasks: set[asyncio.Task[None]] = set()
        self.goaway_forwarded = False  # the runtime's GOAWAY went to the client: send none of ours
        # routing by the first request (only when the relay has an internal server)
        self.sniff: bytearray | None = None  # client bytes while its first request is awaited
        self.s_off = 0  # how far `sniff` has been parsed
        self.s_frags: list[bytes] = []  # the first header block so far
        self.timer: asyncio.TimerHandle | None = None
        self.piped = False  # connected to the internal server: bytes pass both ways unparsed
        self.ack_owed = False  # the client's ACK of our own SETTINGS is still to be taken out
        self.moving = False  # a request for our own services came: GOAWAY sent, new streams refused
        self.pid: int | None = None  # the client's process

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

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def _fatal(self, why: str) -> None:
        """A header block we cannot decode: the runtime cannot either; end the connection cleanly."""
        logger.error("frame relay: {}; closing the connection", why)
        if self.client is not None:
            self.client.write(h2.goaway(self.last_stream, h2.COMPRESSION_ERROR))
        self.close()

    # -- client -> runtime --------------------------------------------------------------------
    def _from_client(self, data: bytes) -> None:
        if self.c_buf:
            self.c_buf += data
            buf: Buf = self.c_buf
        else:
            buf = data
        size = len(buf)
        off = 0
        if self.preface_left:
            off = min(self.preface_left, size)
            self.preface_left -= off
        start = 0
        self.c_parsing = True
        while size - off >= h2.HEADER_LEN and not self.closed:
            length, ftype, flags, sid = h2.read_head(buf, off)
            end = off + h2.HEADER_LEN + length
            if end > size:
                break
            flow = 0
            if ftype == h2.DATA:
                flow = length
                action = self._client_data(sid, flags, buf, off + h2.HEADER_LEN, end)
            elif ftype == h2.HEADERS or ftype == h2.CONTINUATION:
                action = self._client_headers(ftype, flags, sid, buf, off + h2.HEADER_LEN, end)
            elif ftype == h2.RST_STREAM:
                action = self._client_reset(sid)
            elif ftype == h2.SETTINGS:
                if not flags & h2.ACK:
                    action = self._client_settings(buf[off + h2.HEADER_LEN : end])
                elif self.ack_owed:  # the ACK of our own SETTINGS (see _sniff): not the runtime's
                    self.ack_owed = False
                    action = _SKIP
                else:
                    action = _PASS
            else:
                action = _PASS
            if action == _PASS and (self.backlog or flow > self.conn_window):
                action = _SKIP
                self._to_runtime(buf[start:off])
                self._queue(buf[off:end], flow)
            elif action == _PASS:
                self.conn_window -= flow
            else:
                self._to_runtime(buf[start:off])
            if action != _PASS:
                start = end
            off = end
            if not self.c_block.open and self.deferred_c2r:
                self._to_runtime(buf[start:off])
                start = off
                deferred, self.deferred_c2r = self.deferred_c2r, []
                for chunk, chunk_flow in deferred:
                    self._emit(chunk, chunk_flow)
        self._to_runtime(buf[start:off])
        self.c_parsing = False
        if not self.c_block.open and self.deferred_c2r:
            deferred, self.deferred_c2r = self.deferred_c2r, []
            for chunk, chunk_flow in deferred:
                self._emit(chunk, chunk_flow)
        if self.credit:
            self._give_credit()
        _keep_rest(self, "c_buf", buf, off)

    def _client_data(self, sid: int, flags: int, buf: Buf, start: int, end: int) -> int:
        st = self.streams.get(sid)
        if st is None or st.hook is None or st.hook.releasing:
            return _PASS
        hook = st.hook
        flow = end - start
        hook.received += flow
        if flow:
            self.credit[0] = self.credit.get(0, 0) + flow
            if not flags & h2.END_STREAM:
                self.credit[sid] = self.credit.get(sid, 0) + flow
        if hook.received > self.relay.message_limit + 1024:  # never hold more than a message may be
            hook.releasing = True
            limit = self.relay.message_limit
            self._refuse(st, _RESOURCE_EXHAUSTED, f"cri-proxy: request larger than max (> {limit})")
            return _SKIP
        payload = buf[start:end]
        if flags & h2.PADDED:
            payload = h2.unpad(flags, bytes(payload))
        if payload:
            hook.held.append(payload)
        if flags & h2.END_STREAM:
            hook.releasing = True
            hook.task = self._spawn(self._run_pre(st))
        return _SKIP

    def _client_headers(self, ftype: int, flags: int, sid: int, buf: Buf, start: int, end: int) -> int:
        block = self.c_block
        if not block.feed(ftype, flags, sid, buf, start, end):
            return _PASS
        try:
            headers = block.decode()
        except hpack.HPACKError as exc:
            self._fatal(f"client header block does not decode: {exc}")
            return _SKIP
        sid = block.sid
        if sid in self.streams or sid <= self.last_stream:
            return _PASS  # trailers from the client, or a stream we no longer track
        path = ""
        if headers is not None:
            path = (h2.header_value(headers, b":path") or b"").decode("utf-8", "replace")
            internal = self.relay.internal
            if self.moving or (internal is not None and internal.owns(path)):
                return self._move(sid, path)
        self.last_stream = sid
        st = _Stream(sid)
        self.streams[sid] = st
        if headers is not None and not block.end:
            hooks = self.relay.hooks.get(path)
            info = KNOWN.get(path)
            if hooks is not None and info is not None:
                st.hook = _Hooked(info, hooks, self.initial_window)
            if self.observer is not None and info is not None and info.shape is Shape.UNARY:
                st.measured, st.began = path, perf_counter()
                st.sent_at = st.began
        return _PASS

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

    def _reset(self, sid: int) -> _Stream | None:
        """A stream reset by either side: forget it, and stop its hook (hooked streams only)."""
        st = self.streams.pop(sid, None)
        if st is not None and st.hook is not None:
            if st.hook.task is not None and not st.hook.finished:
                st.hook.task.cancel()
            self._settle(st.hook)
        return st

    def _client_reset(self, sid: int) -> int:
        st = self._reset(sid)
        hook = None if st is None else st.hook
        if hook is not None and hook.request is not None and hook.hooks.failed is not None:
            # the caller cancelled a call already forwarded: roll back as for a failure
            self._spawn(_run_observer(hook.hooks.failed, hook.request, grpc.StatusCode.CANCELLED, hook.info))
        return _PASS

    def _client_settings(self, payload: Buf) -> int:
        for ident, value in h2.settings_pairs(bytes(payload)):
            if ident == h2.SETTINGS_HEADER_TABLE_SIZE and self.r_block.dec is not None:
                self.r_block.dec.max_allowed_table_size = value
        return _PASS

    def _to_runtime(self, chunk: Buf) -> None:
        """Client frames whose window was already counted (or that need none), in order."""
        if not chunk or self.runtime is None:
            return
        if self.backlog:
            self._queue(chunk, 0)
        else:
            self.runtime.write(chunk)

    def _emit(self, chunk: Buf, flow: int) -> None:
        """A frame for the runtime: now if the connection window allows and nothing waits, else queued."""
        if self.runtime is None:
            return
        if self.backlog or flow > self.conn_window:
            self._queue(chunk, flow)
        else:
            self.conn_window -= flow
            self.runtime.write(chunk)

    def _inject_c2r(self, chunk: Buf, flow: int = 0) -> None:
        """A frame of our own for the runtime; never inside the client's open header block."""
        if self.c_block.open or self.c_parsing:  # after the client frames read so far
            self.deferred_c2r.append((chunk, flow))
        else:
            self._emit(chunk, flow)

    def _queue(self, chunk: Buf, flow: int) -> None:
        """Hold a frame until the runtime's connection window has room (kept in order)."""
        self.backlog.append((chunk, flow))
        self.queued += flow
        self.queued_peak = max(self.queued_peak, self.queued)

    def _drain(self) -> None:
        out: list[Buf] = []
        while self.backlog and self.backlog[0][1] <= self.conn_window:
            chunk, flow = self.backlog.popleft()
            self.conn_window -= flow
            self.queued -= flow
            out.append(chunk)
        if out and self.runtime is not None:
            self.runtime.writelines(out)

    # -- hooks ----------------------------------------------------------------------------------
    async def _run_pre(self, st: _Stream) -> None:
        """Decode the held request, run the pre hook, then send the (re-encoded) request on."""
        hook = st.hook
        assert hook is not None
        info, policy = hook.info, self.relay.fail_policy
        body = b"".join(hook.held)
        hook.held = []
        framed = h2.single_grpc_message(body)
        if framed is not None and len(framed[1]) > self.relay.message_limit:
            limit = self.relay.message_limit
            return self._refuse(
                st, _RESOURCE_EXHAUSTED, f"cri-proxy: request larger than max ({len(framed[1])} vs. {limit})"
            )
        if framed is None or framed[0]:
            logger.warning("{}: request is not one uncompressed message; forwarded without hooks", info.path)
            return self._release(st, body)
        try:
            message = info.request_type.FromString(framed[1])
        except DecodeError as exc:
            logger.warning("{}: request does not decode ({}); forwarded without hooks", info.path, exc)
            if policy is FailPolicy.FAIL:
                return self._refuse(
                    st, _INVALID_ARGUMENT, f"cri-proxy: {info.name} request does not decode: {exc}"
                )
            return self._release(st, body)
        if hook.hooks.pre is not None:
            work = type(message)()
            work.CopyFrom(message)
            try:
                changed = await hook.hooks.pre(work, info)
            except HookError as exc:
                return self._refuse(st, exc.code.value[0], exc.message)
            except Exception as exc:  # a hook bug must never take the call down with it
                logger.opt(exception=exc).error("{}: pre hook failed: {}", info.path, exc)
                if policy is FailPolicy.FAIL:
                    return self._refuse(st, _INTERNAL, f"cri-proxy: {info.name} hook failed: {exc}")
                changed = None
            if changed is not None:
                message = changed
                body = h2.grpc_message(changed.SerializeToString())
        hook.request = message
        self._release(st, body)

    def _release(self, st: _Stream, body: bytes) -> None:
        hook = st.hook
        if hook is None:
            return
        if self.streams.get(st.id) is not st or self.runtime is None:
            self._settle(hook)  # cancelled, or ended by the runtime, meanwhile: nothing to send
            if hook.request is not None and hook.hooks.failed is not None:
                # the pre hook did its work for a call that will never run: let it roll back
                self._spawn(
                    _run_observer(hook.hooks.failed, hook.request, grpc.StatusCode.CANCELLED, hook.info)
                )
            return
        hook.out, hook.out_at, hook.sending = body, 0, True
        if st.measured:
            st.sent_at = perf_counter()
        self._pump(st)

    def _pump(self, st: _Stream) -> None:
        """Send what the stream's window allows, in frames the runtime accepts."""
        hook = st.hook
        assert hook is not None
        while hook.sending and not hook.finished:
            left = len(hook.out) - hook.out_at
            size = min(left, hook.window, self.max_frame)
            if size <= 0 and left > 0:
                return  # wait for the runtime's WINDOW_UPDATE on this stream
            piece = hook.out[hook.out_at : hook.out_at + size]
            hook.out_at += size
            hook.window -= size
            hook.sent += size
            self.withheld += size
            last = hook.out_at >= len(hook.out)
            self._inject_c2r(h2.frame(h2.DATA, h2.END_STREAM if last else 0, st.id, piece), size)
            if last:
                hook.finished = True
                hook.out = b""
                self._settle(hook)

    def _settle(self, hook: _Hooked) -> None:
        """The stream sends nothing more to the runtime (sent, refused, cancelled or ended)."""
        hook.finished = True
        hook.held = []
        hook.out = b""

    def _give_credit(self) -> None:
        """Send the client the WINDOW_UPDATEs owed for request bytes we hold."""
        credit, self.credit = self.credit, {}
        self._inject_r2c(b"".join(h2.window_update(sid, n) for sid, n in credit.items() if n > 0))

    def _refuse(self, st: _Stream, code: int, message: str) -> None:
        """Answer the call ourselves and cancel it at the runtime (which has its headers only)."""
        if self.streams.get(st.id) is not st:
            if st.hook is not None:
                self._settle(st.hook)
            return
        del self.streams[st.id]
        self._measure(st, code, upstream=False)
        self._inject_r2c(h2.status_frames(st.id, code, message, not st.responded, h2.DEFAULT_MAX_FRAME_SIZE))
        self._inject_c2r(h2.rst_stream(st.id, h2.CANCEL))
        if st.hook is not None:
            self._settle(st.hook)

    def _measure(self, st: _Stream, code: int, upstream: bool) -> None:
        """Count and time a finished unary call (metrics), as the grpc relay does."""
        if not st.measured or self.observer is None:
            return
        now = perf_counter()
        status = _CODES.get(code, grpc.StatusCode.UNKNOWN)
        self.observer.observe(st.measured, status, now - st.began, now - st.sent_at if upstream else 0.0)

    def _observe(self, st: _Stream, headers: list[tuple[bytes, bytes]] | None) -> None:
        """The runtime ended a hooked call: hand its answer to the post or failed hook."""
        hook = st.hook
        if hook is None or hook.request is None or headers is None:
            return
        code = _status(headers)
        info = hook.info
        if code == _OK and hook.hooks.post is not None:
            framed = h2.single_grpc_message(bytes(hook.response))
            if framed is None or framed[0]:
                logger.warning("{}: response is not one uncompressed message; no post hook", info.path)
                return
            try:
                response = info.response_type.FromString(framed[1])
            except DecodeError as exc:
                logger.warning("{}: cannot decode the runtime's response for post hook: {}", info.path, exc)
                return
            self._spawn(_run_observer(hook.hooks.post, hook.request, response, info))
        elif code != _OK and hook.hooks.failed is not None:
            status = _CODES.get(code, grpc.StatusCode.UNKNOWN)
            self._spawn(_run_observer(hook.hooks.failed, hook.request, status, info))

    # -- runtime -> client --------------------------------------------------------------------
    def from_runtime(self, data: bytes) -> None:
        if self.client is None or self.closed:
            return
        if self.piped:
            self.client.write(data)
            return
        if self.r_buf:
            self.r_buf += data
            buf: Buf = self.r_buf
        else:
            buf = data
        size = len(buf)
        off = start = 0
        while size - off >= h2.HEADER_LEN:
            length, ftype, flags, sid = h2.read_head(buf, off)
            end = off + h2.HEADER_LEN + length
            if end > size:
                break
            body = off + h2.HEADER_LEN
            if ftype == h2.DATA:
                action = self._runtime_data(sid, flags, buf, body, end, start)
            elif ftype == h2.HEADERS or ftype == h2.CONTINUATION:
                action = self._runtime_headers(ftype, flags, sid, buf, body, end)
            elif ftype == h2.WINDOW_UPDATE:
                action = self._runtime_window(sid, buf[body:end], buf, start, off)
            elif ftype == h2.SETTINGS and not flags & h2.ACK:
                action = self._runtime_settings(buf[body:end])
            elif ftype == h2.RST_STREAM:
                action = self._runtime_reset(sid)
            elif ftype == h2.GOAWAY:
                action = self._runtime_goaway(buf[body:end], buf, start, off)
            else:
                action = _PASS
            if action != _PASS:
                if action == _SKIP:
                    self._to_client(buf[start:off])
                start = end
            off = end
            if not self.r_block.open and self.deferred_r2c:
                self._to_client(buf[start:off])
                start = off
                deferred, self.deferred_r2c = self.deferred_r2c, []
                self._to_client(b"".join(deferred))
        self._to_client(buf[start:off])
        _keep_rest(self, "r_buf", buf, off)

    def _to_client(self, chunk: Buf) -> None:
        if chunk and self.client is not None:
            self.client.write(chunk)

    def _inject_r2c(self, chunk: Buf) -> None:
        """A frame of our own for the client; never inside the runtime's open header block."""
        if self.r_block.open:
            self.deferred_r2c.append(chunk)
        else:
            self._to_client(chunk)

    def _runtime_data(self, sid: int, flags: int, buf: Buf, start: int, end: int, span: int) -> int:
        """Track a response's message boundaries (size limit) and copy it for a post hook."""
        st = self.streams.get(sid)
        if st is None:
            if sid in self.dropping:
                self._inject_c2r(h2.window_update(0, end - start))  # the client will never see them
                return _SKIP
            return _PASS
        if flags & h2.PADDED:
            content = h2.unpad(flags, bytes(buf[start:end]))
            too_big = _scan(st, content, 0, len(content), self.relay.message_limit)
        else:
            content = b""
            too_big = _scan(st, buf, start, end, self.relay.message_limit)
        if too_big:
            self._to_client(buf[span : start - h2.HEADER_LEN])  # what came before goes first
            self._drop_response(st, too_big, end - start)
            return _DONE
        if st.hook is not None and st.hook.hooks.post is not None:
            st.hook.response += content if flags & h2.PADDED else buf[start:end]
        if flags & h2.END_STREAM:
            del self.streams[sid]
        return _PASS

    def _drop_response(self, st: _Stream, size: int, flow: int) -> None:
        """A response message over the limit: end the call with RESOURCE_EXHAUSTED, as grpc mode does."""
        del self.streams[st.id]
        self._measure(st, _RESOURCE_EXHAUSTED, upstream=True)
        self.dropping.add(st.id)
        limit = self.relay.message_limit
        message = f"cri-proxy: response larger than max ({size} vs. {limit})"
        self._inject_r2c(
            h2.status_frames(st.id, _RESOURCE_EXHAUSTED, message, False, h2.DEFAULT_MAX_FRAME_SIZE)
        )
        self._inject_c2r(h2.rst_stream(st.id, h2.CANCEL))
        self._inject_c2r(h2.window_update(0, flow))

    def _runtime_headers(self, ftype: int, flags: int, sid: int, buf: Buf, start: int, end: int) -> int:
        block = self.r_block
        if not block.feed(ftype, flags, sid, buf, start, end):
            return _PASS
        try:
            headers = block.decode()
        except hpack.HPACKError as exc:
            self._fatal(f"runtime header block does not decode: {exc}")
            return _SKIP
        if block.end:
            self.dropping.discard(block.sid)
        st = self.streams.get(block.sid)
        if st is not None:
            st.responded = True
            if block.end:
                del self.streams[st.id]
                if st.measured and headers is not None:
                    self._measure(st, _status(headers), upstream=True)
                self._observe(st, headers)
        return _PASS

    def _runtime_window(self, sid: int, payload: Buf, buf: Buf, start: int, off: int) -> int:
        increment = h2.window_increment(bytes(payload))
        if sid != 0:
            st = self.streams.get(sid)
            if st is not None and st.hook is not None:
                st.hook.window += increment
                self._pump(st)
            return _PASS
        self.conn_window += increment
        self._drain()
        if self.withheld <= 0:
            return _PASS
        self._to_client(buf[start:off])
        if increment > self.withheld:  # credit for rewritten bytes: the client had it already
            self._to_client(h2.window_update(0, increment - self.withheld))
            self.withheld = 0
        else:
            self.withheld -= increment
        return _DONE

    def _runtime_settings(self, payload: Buf) -> int:
        for ident, value in h2.settings_pairs(bytes(payload)):
            if ident == h2.SETTINGS_INITIAL_WINDOW_SIZE:
                change, self.initial_window = value - self.initial_window, value
                for st in list(self.streams.values()):
                    if st.hook is not None:
                        st.hook.window += change
                        self._pump(st)
            elif ident == h2.SETTINGS_MAX_FRAME_SIZE:
                self.max_frame = value
            elif ident == h2.SETTINGS_HEADER_TABLE_SIZE and self.c_block.dec is not None:
                self.c_block.dec.max_allowed_table_size = value
        return _PASS

    def _runtime_reset(self, sid: int) -> int:
        st = self._reset(sid)
        hook = None if st is None else st.hook
        if hook is not None and hook.request is not None and hook.hooks.failed is not None:
            self._spawn(_run_observer(hook.hooks.failed, hook.request, grpc.StatusCode.CANCELLED, hook.info))
        self.dropping.discard(sid)
        return _PASS

    def _runtime_goaway(self, payload: Buf, buf: Buf, start: int, off: int) -> int:
        """A GOAWAY with an error ends every open call: end them first, naming the runtime."""
        self.goaway_forwarded = True
        code = int.from_bytes(payload[4:8], "big") if len(payload) >= 8 else h2.NO_ERROR
        if code == h2.NO_ERROR or not self.streams:
            return _PASS
        self._to_client(buf[start:off])
        text = bytes(payload[8:]).decode("utf-8", "replace")
        self._end_open_calls(
            f"runtime {self.relay.endpoint} closed the connection (HTTP/2 error {code}: {text})"
        )
        return self._forward_after(buf, off)

    def _forward_after(self, buf: Buf, off: int) -> int:
        """Write the frame at `off` now (after frames we injected) and report it written."""
        length = h2.read_head(buf, off)[0]
        self._to_client(buf[off : off + h2.HEADER_LEN + length])
        return _DONE

    def _end_open_calls(self, why: str) -> None:
        """Answer every open call with UNAVAILABLE (trailers-only when no response headers went out)."""
        message = f"cri-proxy: {why}"
        if self.streams:
            logger.warning("{} ({} calls open)", message, len(self.streams))
        if self.client is not None and not self.r_block.open:  # mid header block nothing may be added
            self.client.writelines(
                [
                    h2.status_frames(sid, _UNAVAILABLE, message, not st.responded, h2.DEFAULT_MAX_FRAME_SIZE)
                    for sid, st in self.streams.items()
                ]
            )
        for st in self.streams.values():
            self._measure(st, _UNAVAILABLE, upstream=True)
            if st.hook is not None and st.hook.task is not None:
                st.hook.task.cancel()
        self.streams.clear()

    def runtime_lost(self, exc: Exception | None) -> None:
        """End every open call with UNAVAILABLE naming the runtime, then GOAWAY and close."""
        self.runtime = None
        if self.closed or self.client is None:
            return
        if self.piped:  # the internal server closed the connection: so does its client
            self.client.close()
            return
        reason = f": {exc}" if exc else ""
        self._end_open_calls(f"lost the connection to runtime {self.relay.endpoint}{reason}")
        if not self.goaway_forwarded and not self.r_block.open:
            self.client.write(h2.goaway(self.last_stream, h2.NO_ERROR))
        self.client.close()


def _status(headers: _Headers) -> int:
    """The grpc-status of a trailers block (UNKNOWN when missing or malformed)."""
    raw = h2.header_value(headers, b"grpc-status")
    return int(raw) if raw is not None and raw.isdigit() else grpc.StatusCode.UNKNOWN.value[0]


def _peer_pid(transport: asyncio.Transport) -> int | None:
    """The client's process id (SO_PEERCRED), when the transport tells."""
    sock = transport.get_extra_info("socket")
    try:
        pid: int = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))[0]
    except (AttributeError, OSError, struct.error):
        return None
    return pid if pid > 0 else None


def _decoder() -> hpack.Decoder:
    dec = hpack.Decoder()
    dec.max_header_list_size = _HEADER_LIST_LIMIT
    return dec


def _keep_rest(link: Link, attr: str, buf: Buf, off: int) -> None:
    """Keep an incomplete frame's bytes for the next read."""
    kept: bytearray = getattr(link, attr)
    if buf is kept:
        del kept[:off]
    elif off < len(buf):
        setattr(link, attr, bytearray(buf[off:]))


def _scan(st: _Stream, buf: Buf, start: int, end: int, limit: int) -> int:
    """Follow gRPC message boundaries in a response; the size of a message over `limit`, else 0."""
    at = start
    while at < end:
        if st.need:
            take = min(st.need, end - at)
            st.need -= take
            at += take
            continue
        take = min(5 - len(st.head), end - at)
        st.head += bytes(buf[at : at + take])
        at += take
        if len(st.head) == 5:
            size = int.from_bytes(st.head[1:5], "big")
            st.head = b""
            if size > limit:
                return size
            st.need = size
    return 0


async def _run_observer(hook: Any, *args: Any) -> None:
    """Run a post/failed hook; its failure is logged, never shown to the caller."""
    try:
        await hook(*args)
    except Exception as exc:
        logger.opt(exception=exc).error("post hook failed: {}", exc)


class _Unreachable:
    """Stands in for an unreachable runtime: a minimal HTTP/2 server answering UNAVAILABLE."""

    def __init__(self, client: asyncio.Transport, message: str) -> None:
        self.client = client
        self.message = message
        self.buf = bytearray()
        self.preface_left = len(h2.PREFACE)
        self.last_stream = 0
        self.answered: set[int] = set()
        client.write(h2.settings())
        self.timer = asyncio.get_running_loop().call_later(_UNREACHABLE_LIFETIME, self.finish)

    def feed(self, data: bytes) -> None:
        self.buf += data
        if self.preface_left:
            take = min(self.preface_left, len(self.buf))
            self.preface_left -= take
            del self.buf[:take]
        off = 0
        while len(self.buf) - off >= h2.HEADER_LEN:
            length, ftype, flags, sid = h2.read_head(self.buf, off)
            end = off + h2.HEADER_LEN + length
            if end > len(self.buf):
                break
            self._frame(ftype, flags, sid, bytes(self.buf[off + h2.HEADER_LEN : end]))
            off = end
        del self.buf[:off]

    def _frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if ftype == h2.SETTINGS and not flags & h2.ACK:
            self.client.write(h2.SETTINGS_ACK)
        elif ftype == h2.PING and not flags & h2.ACK:
            self.client.write(h2.frame(h2.PING, h2.ACK, 0, payload))
        elif ftype == h2.DATA and payload:
            self.client.write(h2.window_update(0, len(payload)))
        elif ftype in (h2.HEADERS, h2.CONTINUATION) and flags & h2.END_HEADERS and sid not in self.answered:
            self.answered.add(sid)
            self.last_stream = max(self.last_stream, sid)
            frames = h2.status_frames(sid, _UNAVAILABLE, self.message, True, h2.DEFAULT_MAX_FRAME_SIZE)
            self.client.write(frames)
            if len(self.answered) == 1:
                self.timer.cancel()
                self.timer = asyncio.get_running_loop().call_later(_UNREACHABLE_LINGER, self.finish)

    def finish(self) -> None:
        """GOAWAY and close, so the client's next call makes a fresh attempt at the runtime."""
        self.timer.cancel()
        if not self.client.is_closing():
            self.client.write(h2.goaway(self.last_stream, h2.NO_ERROR))
            self.client.close()

    def cancel(self) -> None:
        self.timer.cancel()


def bind_unix(path: str) -> socket.socket:
    """A bound Unix stream socket for the frame relay (the caller sets the umask around this)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise EndpointError(f"cannot listen on {path}: {exc.strerror or exc}") from exc
    return sock
