"""What the frame relay keeps per connection (a Link's state), per stream and per header block.

The Link itself is in fastpath.py; its frame parsing in framelink.py, its hooked streams in hooked.py.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import grpc
import hpack
from google.protobuf.message import Message

from cri_proxy.relay import frames as h2
from cri_proxy.relay.forward import CallObserver
from cri_proxy.relay.hooks import Hooks
from cri_proxy.relay.methods import MethodInfo

if TYPE_CHECKING:
    from cri_proxy.relay.fastpath import FrameRelay
    from cri_proxy.relay.unreachable import _Unreachable

Buf: TypeAlias = bytes | bytearray
_Headers: TypeAlias = list[tuple[bytes, bytes]]  # hpack.Decoder.decode(raw=True) gives a list of these

_CODES: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}
_OK = 0
_INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]
_RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
_INTERNAL = grpc.StatusCode.INTERNAL.value[0]
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
_HEADER_LIST_LIMIT = 1 << 30  # the peers enforce their own limits; ours must never be the tighter one

# what the parse loops do with a frame
_PASS = 0  # forward unchanged
_SKIP = 1  # consumed (held, dropped, or replaced): not forwarded
_DONE = 2  # already written by the handler, together with the frames before it


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


class _LinkState(asyncio.Protocol):
    """A Link's state: its two transports, both directions' parse state, its streams and windows."""

    observer: CallObserver | None  # metrics, set as the client connects

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

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task


def _status(headers: _Headers) -> int:
    """The grpc-status of a trailers block (UNKNOWN when missing or malformed)."""
    raw = h2.header_value(headers, b"grpc-status")
    return int(raw) if raw is not None and raw.isdigit() else grpc.StatusCode.UNKNOWN.value[0]


def _decoder() -> hpack.Decoder:
    dec = hpack.Decoder()
    dec.max_header_list_size = _HEADER_LIST_LIMIT
    return dec


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
