"""The link core: one client connection and its runtime connection as a pure object (sans-IO).

Fed bytes from either side (`receive_from_client`, `receive_from_runtime`), the end of a pre hook
(`hook_finished`) and the loss of either side, it says what to write where (`take_client`,
`take_runtime`), which hooks to run (`events`) and whether to close (`closing`). It reads no clock
(callers pass `now`), opens no socket and runs no task.

Frames pass through unchanged, so SETTINGS, PING, WINDOW_UPDATE, GOAWAY and stream ids are the
two peers' own from the first byte. The core adds frames of its own only: a hooked request's DATA
(within the runtime's windows), WINDOW_UPDATEs for request bytes it holds, RST_STREAM and status
HEADERS of calls it ends, and GOAWAY when it cuts a client off. Those never touch either side's
HPACK dynamic table and never go inside an open header block.

One exception: a PING the runtime sends while a slow call is open (`methods.SLOW`:
CreateContainer, RunPodSandbox, PullImage, ...) is answered by the core (PING is hop-by-hop), and
its ACK waits (`held_pings`) for the next write that goes to the runtime anyway (`take_runtime`),
or until the adapter's timer says it waited long enough (`answer_pings`); later PINGs wait behind
it. grpc-go sends one for each request it reads. Passed through at once, in the middle of a
create, it woke the client and the proxy twice while the runtime worked (0.04-0.16 ms more per
CreateContainer against containerd on 2 vCPUs); passed to the client after the answer, the
client's ACK went back through the proxy to the runtime just as the client's next call did (the
core's ACK instead: 0.09-0.25 ms less per create that follows its RunPodSandbox); written on its
own right after the answer, the core's ACK woke the runtime once more per slow call, as the
client's next call came (riding with that call: 0.02-0.08 ms less per create). During a quick
read it still passes to the client at once, and the client's ACK rides with its next call (below).

The client's reads that hold only what no peer waits on (`_quiet`: the ACKs of the runtime's
PINGs, and connection WINDOW_UPDATEs while no call is open) wait in `quiet` for the next write to
the runtime, or until the adapter's timer says they waited long enough (`release_quiet`). A grpc
client sends the ACK of the PING grpc-go sends for each request on its own, just as its next call
comes: written on its own, it woke the runtime once more per call (containerd's CPU a sequential
`Version` call through the proxy: 194-221 us so, 153-174 us with the ACK riding with the next
call; 176-193 us direct).

Reading an answer comes after writing it: with `answers_later` (the adapter's way) the runtime's
header blocks pass on undecoded and `read_answers` decodes them once the adapter has written the
read's bytes, then measures the calls they end and asks for their hooks (0.05-0.08 ms less per
CreateContainer on a busy 2-vCPU VM). A read that goes to the client as it came whatever its
frames say (an answer's frames alone: `_passes_as_is`) goes before its frames are even followed
(`unread`; 0.02-0.15 ms less per CreateContainer in paired runs); the usual one, a call's whole
answer, is then read in one pass (`_one_answer`). More input (from either side,
a hook's end, the timer) and the end of calls read them first, and so does whatever depends on the
decoder's table (the runtime's SETTINGS ACK, the core's own status blocks). A block that does not
decode has then reached the client, whose decoder rejects it as it would the runtime's directly.

Protocol errors: what the runtime would reject (bad preface, oversized frame, broken header
block) is passed to the runtime, which answers with its own error code and scope; the client's
later bytes are dropped. DATA past the client's window goes on too (the runtime judges it), never
held. The core answers itself only for its own limits: a header block over the cap (GOAWAY
PROTOCOL_ERROR), a header list over 16 MiB (RST_STREAM FRAME_SIZE_ERROR, that stream only, as grpc-go
does; the limit is announced to the client in the runtime's first SETTINGS). A big header block is
decoded a bounded step at a time (`decoding`, `decode_more`): the client's next frames wait for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from google.protobuf.message import Message

from cri_proxy.relay import messages, wire
from cri_proxy.relay.flow import Budget, Windows
from cri_proxy.relay.headerblock import BlockError, HeaderBlocks, Headers, header_value
from cri_proxy.relay.hooks import Hooks, Ready
from cri_proxy.relay.methods import UNARY_PATHS, MethodInfo
from cri_proxy.relay.streams import HookedRequest, Stream
from cri_proxy.relay.wire import Buf

# gRPC status codes (numbers, so that the core needs no gRPC import)
OK = 0
CANCELLED = 1
UNKNOWN = 2
RESOURCE_EXHAUSTED = 8
INTERNAL = 13
UNAVAILABLE = 14

CLIENT_KEEP = frozenset((b":path", b"grpc-encoding"))  # the request header fields the core reads
RUNTIME_KEEP = frozenset((b"grpc-status",))
CREDIT_BATCH = 16 << 10  # connection credit owed to the client for held requests, sent once this much
CREDIT_LOW = 32 << 10  # ... or at once while the client may send less than this
DECODE_BUDGET = 4096  # HPACK work a client's block may take per loop turn (~1-2 ms; hpackstep.py)
PINGS_HELD = 8  # runtime PINGs held while slow calls are open, at most: then the core answers them
QUIET_HELD = 16  # the client's quiet reads held, at most: then they go
# connection credit a held WINDOW_UPDATE may carry: more goes at once (toward an overflow, which the
# runtime judges at once)
QUIET_CREDIT = 1 << 30

Observer = Callable[[str, int, float, float], None]  # (path, code, total seconds, runtime seconds)


# -- what the core asks its adapter to do -----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RunPre:
    """Run the pre hook on the request `message` (None: not readable, `why` says why)."""

    stream: int
    info: MethodInfo
    hooks: Hooks
    message: bytes | None
    why: str = ""


@dataclass(frozen=True, slots=True)
class RunPost:
    """The runtime answered OK: run the post hook (`request` as forwarded; bytes: a ready request
    not decoded yet, its `Readied` came first)."""

    stream: int
    info: MethodInfo
    hooks: Hooks
    request: Message | bytes
    response: bytes


@dataclass(frozen=True, slots=True)
class RunFailed:
    """The call did not succeed: run the failed hook (`request` as for `RunPost`)."""

    stream: int
    info: MethodInfo
    hooks: Hooks
    request: Message | bytes
    code: int


@dataclass(frozen=True, slots=True)
class CancelPre:
    stream: int


@dataclass(frozen=True, slots=True)
class Readied:
    """A request went on with what its hooks had ready (`Hooks.ready`): decode it as sent, for
    `ready.after` and the hooks after the call, before these (`RunPost`/`RunFailed` of `stream`)
    and no sooner than need be: not while the runtime works on the call (`request_decoded`)."""

    stream: int
    info: MethodInfo
    ready: Ready
    request: bytes


Event = RunPre | RunPost | RunFailed | CancelPre | Readied


@dataclass(frozen=True, slots=True)
class Limits:
    """What bounds a link (from the config)."""

    message: int = 16 << 20  # largest gRPC message either way
    buffer: int = 32 << 20  # bytes a link may hold (held requests, frames waiting for window)
    header_list: int = 16 << 20  # decoded header list limit: grpc-go's default (containerd's, unannounced)
    header_block: int = 2 << 20  # encoded bytes of one header block (bounds decoding; then GOAWAY)


@dataclass(frozen=True, slots=True)
class PreDone:
    """What the adapter hands back when a pre hook ended: the request to send, or a refusal."""

    message: bytes | None  # the request to send instead of the caller's (None: the caller's)
    request: Message | None  # as forwarded, for the post/failed hooks
    refuse: tuple[int, str] | None = None  # (gRPC code, message): answer the caller with this


class OwnStatus(NamedTuple):
    """A call we end ourselves: its block is made when it is written (see `LinkCore._status`)."""

    sid: int
    code: int
    message: str
    trailers_only: bool


class LinkCore:
    """A client connection relayed to the runtime, as state fed with bytes."""

    def __init__(
        self,
        hooks: Callable[[str], Hooks | None],
        limits: Limits,
        budget: Budget | None = None,
        observer: Observer | None = None,
        decode_client: bool = True,
        decode_runtime: bool = True,
        runtime_name: str = "runtime",
        as_is: Callable[[Hooks], bool] | None = None,
    ) -> None:
        self.hooks = hooks
        # whether a request whose method is hooked only after its call goes on as it came, decoded
        # for those hooks only when the call ended (`HookRunner.as_is`); None: never
        self.as_is = as_is
        self.limits = limits
        self.budget = budget if budget is not None else Budget(1 << 62)
        self.observer = observer
        self.runtime_name = runtime_name
        self.c_split = wire.FrameSplitter(preface=True)
        self.r_split = wire.FrameSplitter(preface=False)
        self.r_split.max_frame = (1 << 24) - 1  # the runtime is trusted with its frame sizes
        self.c_block = HeaderBlocks(decode_client, limits.header_block, limits.header_list, CLIENT_KEEP)
        self.r_block = HeaderBlocks(decode_runtime, 1 << 62, 1 << 62, RUNTIME_KEEP)
        self.win = Windows()
        self.streams: dict[int, Stream] = {}
        self.last_stream = 0
        self.dropping: set[int] = set()  # response streams we ended ourselves
        self.out_c: list[Buf] = []
        self.out_r: list[Buf] = []
        # our frames for the client, waiting for a frame boundary (a status: rendered when it goes)
        self.own_c: list[Buf | OwnStatus] = []
        self.own_r: list[tuple[Buf, int]] = []  # ... for the runtime, with their flow
        self.credit: dict[int, int] = {}  # stream (0: connection) -> WINDOW_UPDATE owed to the client
        self.events: list[Event] = []
        self.held = 0  # request bytes held for hooks on this link
        self.stalled = 0  # a stream whose hooked request must go before the client's next frames
        self.client_dead = False  # the client broke the protocol: its further bytes are dropped
        self.runtime_lost_code = 0  # the runtime went away: the calls it had end with this
        self.goaway_sent = False  # a GOAWAY reached the client (the runtime's or ours)
        self.list_announced = False  # the runtime's first SETTINGS went on, with the header list limit
        self.early: list[bytes] = []  # the runtime's bytes before the client's connection preface
        self.held_pings: list[bytes] = []  # the runtime's PINGs (payloads) waiting for slow calls to end
        self.quiet: list[bytes] = []  # the client's reads no peer waits on, for the next write (`_quiet`)
        # the runtime's header blocks passed on undecoded (`answers_later`): (the call it ended, if
        # any; the block; when it came), decoded in order by `read_answers`
        self.answers: list[tuple[Stream | None, bytes, float]] = []
        self.r_later = False  # this read's header blocks wait for `read_answers`
        # a read of the runtime's already passed to the client, its frames not yet followed
        # (`_passes_as_is`): `read_answers` follows them first
        self.unread: tuple[Buf, list[wire.Frame], float] | None = None
        self.answered_early = False  # the runtime ended the stream whose block is being decoded
        self.closing = False  # close both connections once the output is written
        self.warnings: list[str] = []
        # pre hooks cancelled with their call: if one finished first, its work is rolled back
        self.orphans: dict[int, tuple[MethodInfo, Hooks, int]] = {}
        # hooked requests that went ready (`Hooks.ready`) in this read: sent once the read's frames
        # before theirs went on (their HEADERS among them)
        self.ready_now: list[Stream] = []

    # -- output -----------------------------------------------------------------------------------
    def take_client(self) -> list[Buf]:
        out, self.out_c = self.out_c, []
        return out

    def take_runtime(self) -> list[Buf]:
        if self.held_pings and self.out_r:  # the held ACKs ride with a write that goes anyway
            self._answer_held()
        if self.quiet and self.out_r:  # so do the client's quiet frames, first: they came first
            self.release_quiet()
        out, self.out_r = self.out_r, []
        return out

    def release_quiet(self) -> None:
        """The client's quiet reads go now (they waited long enough: the adapter's timer), before
        anything else the runtime is sent."""
        if self.quiet:
            self.out_r[:0] = self.quiet
            self.quiet = []

    def take_events(self) -> list[Event]:
        out, self.events = self.events, []
        return out

    def buffered(self) -> int:
        """Bytes the link holds (what its bound is about): frames in progress, held, waiting."""
        return (
            self.c_split.pending()
            + self.r_split.pending()
            + self.held
            + self.win.queued
            + sum(len(c) if not isinstance(c, OwnStatus) else len(c.message) + 64 for c in self.own_c)
            + sum(len(c) for c, _ in self.own_r)
            + self.c_block.pending_bytes()
            + self.r_block.pending_bytes()
            + sum(len(c) for c in self.early)
            + sum(len(c) for c in self.quiet)
            + len(self.held_pings) * (wire.HEADER_LEN + 8)
            + sum(len(block) for _, block, _ in self.answers)
            + (len(self.unread[0]) if self.unread is not None else 0)
        )

    def wants_client(self) -> bool:
        """Whether the client's bytes should be read now (False while its frames wait or pile up)."""
        return (
            not self.stalled
            and not self.c_block.decoding
            and self.win.queued + self.held < self.limits.buffer
        )

    def decoding(self) -> bool:
        """Whether a client's header block is half decoded: call `decode_more` on a later loop turn."""
        return self.c_block.decoding and not self.closing

    def _own_to_runtime(self, chunk: Buf, flow: int = 0) -> None:
        self.own_r.append((chunk, flow))

    def _own_to_client(self, chunk: Buf | OwnStatus) -> None:
        self.own_c.append(chunk)

    def _flush_own_r(self) -> None:
        if self.own_r and not self.c_block.open:
            own, self.own_r = self.own_r, []
            for chunk, flow in own:
                self.win.send(chunk, flow, self.out_r)

    def _flush_own_c(self) -> None:
        if self.own_c and not self.r_block.open:
            if (self.answers or self.unread) and any(isinstance(c, OwnStatus) for c in self.own_c):
                self.read_answers()  # a status is rendered against the table those blocks leave
            self.out_c.extend(c if not isinstance(c, OwnStatus) else self._status(*c) for c in self.own_c)
            self.own_c = []

    def _status(self, sid: int, code: int, message: str, trailers_only: bool) -> bytes:
        """Our own block ending a call, written now, between the runtime's blocks: when the client
        has shrunk its HPACK table since the runtime's last block, this block is the first it sees
        and must start with the size update; our view of the client's table shrinks with it."""
        shrink = None
        decoder = self.r_block.decoder
        if decoder is not None and decoder.max_allowed_table_size < decoder.header_table.maxsize:
            shrink = decoder.header_table.maxsize = decoder.max_allowed_table_size
        return wire.status_frames(sid, code, message, trailers_only, wire.DEFAULT_MAX_FRAME_SIZE, shrink)

    # -- client -> runtime ------------------------------------------------------------------------
    def receive_from_client(self, data: bytes, now: float = 0.0) -> None:
        if self.answers or self.unread:
            self.read_answers()
        if self.client_dead or self.closing:
            return
        try:
            buf, off, frames = self.c_split.feed(data)
        except (wire.PrefaceError, wire.FrameTooLarge):
            self._client_broke(bytes(self.c_split.buf) if self.c_split.buf else data)
        else:
            # a read opening with a frame on a stream (a request, most often) is never quiet
            if buf is data and frames and not frames[0][4] and self._quiet(data, off, frames):
                self.quiet.append(data)
            elif buf is not data or not frames or not self._whole_request(data, off, frames, now):
                self._client_frames(buf, off, frames, now)
        if self.early and (self.client_dead or not self.c_split.preface_left):
            early, self.early = self.early, []
            for chunk in early:
                self.receive_from_runtime(chunk, now)

    def _quiet(self, data: bytes, off: int, frames: list[wire.Frame]) -> bool:
        """Whether a read (whole frames, nothing before it waiting) holds only what no peer waits
        on: ACKs of the runtime's PINGs, and connection WINDOW_UPDATEs while no call is open (the
        runtime has nothing to send with the credit). Anything malformed, and a read behind other
        bytes for the runtime, goes as it came."""
        if (
            off
            or not frames
            or frames[-1][1] != len(data)
            or self.out_r
            or self.own_r
            or self.win.backlog
            or self.c_block.open
            or self.stalled
            or len(self.quiet) >= QUIET_HELD
        ):
            return False
        for at, end, ftype, flags, sid in frames:
            if sid or end - at != wire.HEADER_LEN + (8 if ftype == wire.PING else 4):
                return False
            if ftype == wire.PING:
                quiet = flags & wire.ACK
            else:
                quiet = (
                    ftype == wire.WINDOW_UPDATE
                    and not self.streams
                    and 0 < wire.window_increment(data[at + wire.HEADER_LEN : end]) < QUIET_CREDIT
                )
            if not quiet:
                return False
        return True

    def _whole_request(self, data: bytes, off: int, frames: list[wire.Frame], now: float) -> bool:
        """The usual read of a client's, taken in one pass: a new call's whole request (one HEADERS
        ending its block, then one DATA ending its stream) with only WINDOW_UPDATEs and PINGs
        around it, whole frames, nothing of the link's waiting. The same as `_client_frames` does
        with the read, in fewer steps: a hooked create's request leaves 7-12 us sooner with the
        caches cold, and takes ~8 % less CPU warm (`bench/core.py --create [--cold 16]`). False:
        nothing done, `_client_frames` takes the read. Past the header block, any other case goes
        on as `_client_frames` would; `tests/unit/test_relay_whole.py` holds the two to one outcome."""
        block = self.c_block
        if (
            off
            or frames[-1][1] != len(data)
            or self.win.backlog
            or block.open
            or block.decoding
            or block.decoder is None
        ):
            return False
        head = body = -1
        for i, (_, _, ftype, _, _) in enumerate(frames):
            if ftype == wire.HEADERS and head < 0:
                head = i
            elif ftype == wire.DATA and head >= 0 > body:
                body = i
            elif ftype != wire.WINDOW_UPDATE and ftype != wire.PING:
                return False
        if body < 0:
            return False
        h_at, h_end, _, h_flags, sid = frames[head]
        d_at, d_end, _, d_flags, d_sid = frames[body]
        if (
            h_flags != wire.END_HEADERS
            or d_flags != wire.END_STREAM
            or d_sid != sid
            or sid <= self.last_stream  # trailers, or a stream `_client_block` ignores
            or h_end - h_at - wire.HEADER_LEN > block.max_block
        ):
            return False
        block.headers(wire.END_HEADERS, sid, data[h_at + wire.HEADER_LEN : h_end])
        try:
            decoded = block.decode(DECODE_BUDGET)
        except BlockError:
            self._client_broke(data)  # as `_client_frames`: nothing of the read went before it
            return True
        if decoded is not None:
            self._client_block(decoded, now)
            st = self.streams.get(sid)
            if st is not None and self._whole_data(st, data, d_at, d_end):
                self._read_done()
                return True
        # the rest of the read as `_client_frames` takes it after the HEADERS frame
        start = 0
        if self.own_r:  # the stream's refusal follows its block
            self.out_r.append(data[:h_end])
            start = h_end
            self._flush_own_r()
        self._client_frames(data, off, frames[head + 1 :], now, start)
        return True

    def _whole_data(self, st: Stream, data: bytes, at: int, end: int) -> bool:
        """The DATA ending a new call's request (`_whole_request`) handled as `_client_frames` would
        when it needs no window to wait for, and, for a hooked call, holds one whole message that
        fits the limits: True, the read's bytes written (a hooked request's around its DATA, which
        goes at once when ready and the windows take it whole, else as `_read_done` and the pre hook
        send it). False: nothing done."""
        flow = end - at - wire.HEADER_LEN
        win = self.win
        hook = st.hook
        if hook is None:
            if flow > win.runtime_window and win.client_allowance >= flow:
                return False  # it waits for the runtime's window
            win.client_allowance -= flow
            win.runtime_window -= flow
            self.out_r.append(data)
            return True
        limits = self.limits
        prefix_at = at + wire.HEADER_LEN
        message_at = prefix_at + messages.PREFIX_LEN
        if (
            not message_at <= end <= message_at + limits.message
            or hook.encoding
            or self.held + flow > limits.buffer
            or not self.budget.room(flow)
            or data[prefix_at]  # compressed (or not a prefix at all): the general path
            or int.from_bytes(data[prefix_at + 1 : message_at], "big") != end - message_at
        ):
            return False
        # as `_hold` and `_end_request` take it
        win.client_allowance -= flow
        self.credit[0] = self.credit.get(0, 0) + flow
        self.out_r.append(data[:at])
        if end < len(data):
            self.out_r.append(data[end:])
        hook.released = True
        hook.out = data[prefix_at:end]
        message = data[message_at:end]
        ready = self._send_ready(st, hook, message)
        if ready and self._send_whole(st, hook):
            return True  # held and given back at once: never counted
        self.held += flow
        hook.held_bytes = flow
        self.budget.take(flow)
        if ready:
            self.ready_now.append(st)
        else:
            self.events.append(RunPre(st.id, hook.info, hook.hooks, message))
            hook.running = True
        return True

    def _client_frames(
        self, buf: Buf, off: int, frames: list[wire.Frame], now: float, start: int = 0
    ) -> None:
        """Follow the client's frames; `start`: where the bytes not yet written begin."""
        win = self.win
        out = self.out_r
        streams = self.streams
        for at, end, ftype, flags, sid in frames:
            if self.stalled or self.c_block.decoding:
                end = at
                break
            if self.c_block.open and ftype != wire.CONTINUATION:
                return self._client_broke(buf[start:])
            keep = True
            if ftype == wire.DATA:
                flow = end - at - wire.HEADER_LEN
                win.client_allowance -= flow
                st = streams.get(sid)
                if st is not None and st.hook is not None and not st.hook.released:
                    keep = False
                    try:
                        self._hold(st, st.hook, flags, buf, at + wire.HEADER_LEN, end, flow)
                    except wire.FrameError:
                        return self._client_broke(buf[start:])
                elif win.client_allowance < 0 and not win.backlog:
                    # past the window it was given: the runtime judges it, as it would directly
                    # (grpc-go lets some through); nothing is held for it here
                    win.runtime_window -= flow
                elif win.backlog or flow > win.runtime_window:
                    if start < at:
                        win.send(buf[start:at], 0, out)
                    win.send(buf[at:end], flow, out)
                    keep = False
                else:
                    win.runtime_window -= flow
            elif ftype == wire.HEADERS or ftype == wire.CONTINUATION:
                try:
                    keep = self._client_headers(ftype, flags, sid, buf, at, end, now)
                except BlockError as exc:
                    if self.c_block.size > self.limits.header_block:
                        if start < at:
                            win.send(buf[start:at], 0, out)
                        return self._cut_off(wire.PROTOCOL_ERROR, str(exc))
                    return self._client_broke(buf[start:])
                if self.stalled:  # trailers of a hooked request: they wait for it
                    end = at
                    break
            elif ftype == wire.RST_STREAM:
                self._reset(sid, CANCELLED)
            elif ftype == wire.SETTINGS:
                if flags & wire.ACK:
                    self.c_block.acknowledged()  # of the runtime's SETTINGS: its table size binds the client
                else:  # the client's table size binds the runtime's encoder once the runtime ACKs it
                    self.r_block.announced(buf[at + wire.HEADER_LEN : end])
            if not keep:
                if start < at:
                    win.send(buf[start:at], 0, out)
                start = end
            if self.own_r and not self.c_block.open:
                if start < end:
                    win.send(buf[start:end], 0, out)
                start = end
                self._flush_own_r()
        else:
            end = frames[-1][1] if frames else off
        if start < end:
            chunk = buf if start == 0 and end == len(buf) and isinstance(buf, bytes) else buf[start:end]
            if win.backlog:
                win.send(chunk, 0, out)
            else:
                out.append(chunk)  # what `win.send` does with no flow and nothing waiting
        self.c_split.keep(buf, end)
        self._read_done()

    def _read_done(self) -> None:
        """What a client's read leaves due: ready requests sent, our frames, credit."""
        if self.ready_now:
            ready, self.ready_now = self.ready_now, []
            for st in ready:
                self._pump(st)
        if self.own_r:
            self._flush_own_r()
        if self.credit and self._credit_due():
            self._give_credit()
        if self.own_c:
            self._flush_own_c()

    def _client_headers(
        self, ftype: int, flags: int, sid: int, buf: Buf, at: int, end: int, now: float
    ) -> bool:
        """Follow the client's header blocks; True when the frame passes (always, unless it must wait)."""
        block = self.c_block
        payload = buf[at + wire.HEADER_LEN : end]
        if ftype == wire.HEADERS:
            st = self.streams.get(sid)
            if st is not None and st.hook is not None and not st.hook.released and not block.open:
                # trailers: the held request goes first, so these frames wait until it went
                self._end_request(st, st.hook, trailers=True)
                if self.stalled:
                    return True
            done = block.headers(flags, sid, payload)
        else:
            done = block.continuation(flags, sid, payload)
        if not done:
            return True
        if block.decoder is None:
            self._client_block(None, now)
            return True
        decoded = block.decode(DECODE_BUDGET)
        if decoded is not None:
            self._client_block(decoded, now)
        return True  # else decode_more goes on with it; the client's next frames wait

    def decode_more(self, now: float = 0.0) -> None:
        """Decode more of the client's half-decoded header block; then its next frames go on."""
        if self.answers or self.unread:
            self.read_answers()
        if not self.c_block.decoding or self.closing:
            return
        try:
            decoded = self.c_block.decode(DECODE_BUDGET)
        except BlockError:
            # the runtime has the whole block and answers it with its own error: the client's bytes
            # that waited go to it as they would have (it judges them), later ones are dropped
            self._client_broke(bytes(self.c_split.buf))
            return
        if decoded is None:
            return
        self._client_block(decoded, now)
        self._flush_own_r()  # a refusal's RST_STREAM goes right after the block, as when decoded at once
        self._client_resume(now)
        self._after()

    def _ended_while_decoding(self, sid: int) -> None:
        """The runtime ended a stream whose request headers we are still decoding (it was quicker)."""
        if self.c_block.decoding and sid == self.c_block.sid:
            self.answered_early = True

    def _client_block(self, decoded: tuple[Headers, int] | None, now: float) -> None:
        """A client's header block is decoded: a new stream's request is read from it."""
        block = self.c_block
        sid = block.sid
        early, self.answered_early = self.answered_early, False
        if sid in self.streams or sid <= self.last_stream or not sid & 1:
            return  # trailers, or a stream the runtime will judge
        self.last_stream = sid
        if early:
            return  # the runtime answered (or reset) it meanwhile: nothing of it to follow
        if decoded is None:
            return
        headers, size = decoded
        if size > self.limits.header_list:
            # the runtime has the block (its HPACK state must follow); the stream ends here
            self.dropping.add(sid)
            self._own_to_runtime(wire.rst_stream(sid, wire.CANCEL))
            self._own_to_client(wire.rst_stream(sid, wire.FRAME_SIZE_ERROR))
            return
        raw_path = header_value(headers, b":path")
        info = UNARY_PATHS.get(raw_path) if raw_path is not None else None
        if info is not None:
            path = info.path
            st = Stream(sid, path, began=now, sent_at=now) if self.observer is not None else Stream(sid)
            st.slow = info.slow
            self.streams[sid] = st
            hooks = self.hooks(path)
            if hooks is not None and not block.end_stream:
                st.hook = HookedRequest(info, hooks, self.win.initial_window)
                st.hook.encoding = header_value(headers, b"grpc-encoding")
        else:
            self.streams[sid] = Stream(sid)

    def _hold(
        self, st: Stream, hook: HookedRequest, flags: int, buf: Buf, start: int, end: int, flow: int
    ) -> None:
        """A hooked request's DATA: held (credited to the client: `_credit_due`) until it ends."""
        if flow:
            self.credit[0] = self.credit.get(0, 0) + flow
            if not flags & wire.END_STREAM:
                self.credit[st.id] = self.credit.get(st.id, 0) + flow
        if flags & wire.PADDED:
            content: Buf = wire.unpad(flags, bytes(buf[start:end]))
            start, end, buf = 0, len(content), content
        size = end - start
        limit = self.limits.message
        over = hook.prefix.feed(buf, start, end, limit)
        if over or hook.held_bytes + size > limit + messages.PREFIX_LEN:
            hook.released = True
            text = (
                f"cri-proxy: request larger than max ({over} vs. {limit})"
                if over
                else (f"cri-proxy: request larger than max (> {limit})")
            )
            return self._refuse(st, RESOURCE_EXHAUSTED, text)
        if size:
            if self.held + size > self.limits.buffer or not self.budget.take(size):
                hook.released = True
                return self._refuse(st, RESOURCE_EXHAUSTED, "cri-proxy: relay buffers are full; retry")
            self.held += size
            hook.held_bytes += size
            hook.held.append(bytes(buf[start:end]))
        if flags & wire.END_STREAM:
            self._end_request(st, hook, trailers=False)

    def _end_request(
        self, st: Stream, hook: HookedRequest, trailers: bool, body: bytes | None = None
    ) -> None:
        """The client ended its hooked request (`body`, else what was held): unpack it and ask for
        the pre hook, or send it on now with what its hooks have ready (`Hooks.ready`; not for a
        compressed one, nor one with trailers, which wait for it)."""
        hook.released = True
        hook.trailers = trailers
        if body is None:
            body = b"".join(hook.held)
        hook.held = []
        hook.out = body  # sent as it came unless the pre hook changes it
        try:
            message, _ = messages.unpack(body, hook.encoding, self.limits.message)
        except messages.MessageError as exc:
            self.events.append(RunPre(st.id, hook.info, hook.hooks, None, str(exc)))
        else:
            if not hook.encoding and not trailers and self._send_ready(st, hook, message):
                self.ready_now.append(st)
                return
            self.events.append(RunPre(st.id, hook.info, hook.hooks, message))
        hook.running = True
        if trailers:
            self.stalled = st.id

    def _send_ready(self, st: Stream, hook: HookedRequest, message: bytes) -> bool:
        """Whether the request goes on now with what its hooks have ready (`Hooks.ready`), or as it
        came when its method has hooks only after the call (`as_is`): then it is what `hook.out`
        sends (the caller sends it)."""
        hooks = hook.hooks
        ready = hooks.ready
        if ready is None:
            if self.as_is is None or not self.as_is(hooks):
                return False
            # nothing to do before the call (a StartContainer's): no pre hook's turn on its path
            hook.sending = True
            st.sent_at = st.began
            hook.request = message  # decoded for the hooks after the call (`HookRunner.post`)
            return True
        try:
            r = ready(message, hook.info)
        except Exception as exc:  # a hook's bug: the pre hook's path, where the runner judges it
            self.warnings.append(f"{hook.info.path}: ready hook failed: {exc!r}; the pre hook runs")
            return False
        if r is None:
            return False
        raw = b"".join((message, r.patch))
        hook.out = messages.pack(raw, False)
        hook.sending = True
        st.sent_at = st.began
        hook.request = raw  # decoded after the write (`Readied`), for the hooks after the call
        self.events.append(Readied(st.id, hook.info, r, raw))
        return True

    def _reset(self, sid: int, code: int) -> Stream | None:
        """A stream reset by either side: forget it; stop its hook; let its hooks roll back."""
        st = self.streams.pop(sid, None)
        if st is not None and st.hook is not None:
            hook = st.hook
            if hook.running:
                self._stop_pre(sid, hook, code)
            else:
                self._failed(sid, hook, code)
            self._settle(hook)
            if self.stalled == sid:
                self.stalled = 0
        return st

    def _stop_pre(self, sid: int, hook: HookedRequest, code: int) -> None:
        """The call ended while its pre hook runs: cancel it; if it ends first, its work rolls back."""
        hook.running = False
        self.events.append(CancelPre(sid))
        self.orphans[sid] = (hook.info, hook.hooks, code)
        if self.stalled == sid:
            self.stalled = 0

    def _client_broke(self, rest: Buf) -> None:
        """The client broke the protocol in a way the runtime judges: it gets these bytes and answers
        with its own error; the client's later bytes are dropped."""
        self.client_dead = True
        self.out_r.append(rest)  # past any backlog: the runtime must see the error now
        self.c_split = wire.FrameSplitter(preface=False)

    def _cut_off(self, code: int, why: str) -> None:
        """A limit of our own: GOAWAY to the client with `code`, every open call ended, close."""
        self.warnings.append(f"client cut off: {why}")
        self.client_dead = True
        self._end_calls(UNAVAILABLE, f"cri-proxy: {why}", answer=False)
        if not self.r_block.open:
            self.out_c.append(wire.goaway(self.last_stream, code, why.encode()))
            self.goaway_sent = True
        self.closing = True

    # -- hooks ------------------------------------------------------------------------------------
    def hook_finished(self, sid: int, done: PreDone, now: float = 0.0) -> None:
        """A pre hook ended: send its request on, or refuse the call."""
        if self.answers or self.unread:
            self.read_answers()
        st = self.streams.get(sid)
        if st is None or st.hook is None or not st.hook.running:
            # the call ended meanwhile (reset, runtime lost): the hook's work must be rolled back
            self._orphan_failed(sid, done)
            return
        hook = st.hook
        hook.running = False
        if done.refuse is not None:
            self._refuse(st, done.refuse[0], done.refuse[1])
        else:
            if done.message is not None:
                hook.out = messages.pack(done.message, hook.encoding == b"gzip")
            hook.request = done.request
            hook.sending = True
            st.sent_at = now
            self._pump(st)
        self._after()

    def request_decoded(self, sid: int, request: Message | None) -> None:
        """A request that went on ready (`Readied`), decoded after the write: what the hooks after
        its call get, not its bytes again; None: it did not decode, and they run for it no more
        than for one the pre hook's path forwarded undecoded."""
        st = self.streams.get(sid)
        if st is not None and st.hook is not None and isinstance(st.hook.request, bytes):
            st.hook.request = request

    def hook_cancelled(self, sid: int) -> None:
        """A pre hook was cancelled before it ended (its call had ended): nothing to roll back."""
        self.orphans.pop(sid, None)

    def _orphan_failed(self, sid: int, done: PreDone) -> None:
        info_hooks = self.orphans.pop(sid, None)
        if info_hooks is not None and done.request is not None:
            info, hooks, code = info_hooks
            if hooks.failed is not None:
                self.events.append(RunFailed(sid, info, hooks, done.request, code))

    def _unstall(self, sid: int) -> None:
        if self.stalled != sid:
            return
        st = self.streams.get(sid)
        hook = None if st is None else st.hook
        if hook is not None and (hook.running or (hook.sending and not hook.finished)):
            return  # its hook runs, or its request is still going out (window): the trailers wait
        self.stalled = 0
        self._client_resume()

    def _client_resume(self, now: float = 0.0) -> None:
        """The client's frames that waited (for a hooked request, or a header block's decoding) go on."""
        if self.c_split.pending() and not self.client_dead:
            try:
                buf, off, frames = self.c_split.feed(b"")
            except (wire.FrameTooLarge, wire.PrefaceError):
                self._client_broke(bytes(self.c_split.buf))
                return
            self._client_frames(buf, off, frames, now)

    def _pump(self, st: Stream) -> None:
        """Send what the stream's window allows of its hooked request, in frames the runtime takes."""
        hook = st.hook
        assert hook is not None
        if self._send_whole(st, hook):
            return
        while hook.sending and not hook.finished:
            left = len(hook.out) - hook.out_at
            size = min(left, hook.window, self.win.max_frame)
            if size <= 0 and left > 0:
                return  # wait for the runtime's WINDOW_UPDATE on this stream
            piece = hook.out[hook.out_at : hook.out_at + size]
            hook.out_at += size
            hook.window -= size
            self.win.withheld += size
            last = hook.out_at >= len(hook.out)
            end = wire.END_STREAM if last and not hook.trailers else 0
            self._own_to_runtime(wire.frame(wire.DATA, end, st.id, piece), size)
            if last:
                hook.finished = True
                self._settle(hook)
        self._flush_own_r()

    def _send_whole(self, st: Stream, hook: HookedRequest) -> bool:
        """The usual request: one frame the windows take now, sent as `_pump`'s loop and
        `_flush_own_r` would send it, in fewer steps: True. False: nothing done."""
        win = self.win
        size = len(hook.out)
        if (
            not hook.sending
            or hook.finished
            or hook.out_at
            or hook.trailers
            or self.own_r
            or win.backlog
            or not 0 < size <= min(hook.window, win.max_frame, win.runtime_window)
            or self.c_block.open
        ):
            return False
        hook.out_at = size
        hook.window -= size
        win.withheld += size
        win.runtime_window -= size
        self.out_r.append(wire.frame(wire.DATA, wire.END_STREAM, st.id, hook.out))
        hook.finished = True
        self._settle(hook)
        return True

    def _settle(self, hook: HookedRequest) -> None:
        """The stream sends nothing more of its own to the runtime: its held bytes are free."""
        if hook.held_bytes:
            self.held -= hook.held_bytes
            self.budget.give(hook.held_bytes)
            hook.held_bytes = 0
        hook.held = []
        hook.out = b""
        hook.sending = False

    def _credit_due(self) -> bool:
        """Whether the credit owed to the client goes now: a stream's at once (a request larger
        than its window goes on only with it), the connection's in batches of CREDIT_BATCH, as a
        receiver batches its WINDOW_UPDATEs (one per hooked call would be a write and a client
        wake-up each), and at once while the client's allowance runs low."""
        credit = self.credit
        return (
            len(credit) > 1
            or 0 not in credit
            or credit[0] >= CREDIT_BATCH
            or self.win.client_allowance < CREDIT_LOW
        )

    def _give_credit(self) -> None:
        """WINDOW_UPDATEs owed to the client for request bytes we hold."""
        credit, self.credit = self.credit, {}
        self.win.client_allowance += credit.get(0, 0)
        self._own_to_client(b"".join(wire.window_update(sid, n) for sid, n in credit.items() if n > 0))

    def _refuse(self, st: Stream, code: int, message: str) -> None:
        """Answer the call ourselves and cancel it at the runtime (which has its headers only)."""
        if self.streams.get(st.id) is not st:
            return
        del self.streams[st.id]
        self.dropping.add(st.id)
        self._measure(st, code, 0.0, upstream=False)
        self._own_to_client(OwnStatus(st.id, code, message, not st.responded))
        self._own_to_runtime(wire.rst_stream(st.id, wire.CANCEL))
        if st.hook is not None:
            self._settle(st.hook)
            st.hook.finished = True
            if self.stalled == st.id:
                self.stalled = 0

    def _failed(self, sid: int, hook: HookedRequest, code: int) -> None:
        if hook.request is not None and hook.hooks.failed is not None:
            self.events.append(RunFailed(sid, hook.info, hook.hooks, hook.request, code))
            hook.request = None  # once

    def _measure(self, st: Stream, code: int, now: float, upstream: bool) -> None:
        if st.path and self.observer is not None:
            total = max(0.0, now - st.began) if now else 0.0
            self.observer(st.path, code, total, max(0.0, now - st.sent_at) if upstream and now else 0.0)

    def _after(self) -> None:
        """What an input may have made due: a stalled stream, credit, our own frames."""
        if not (self.stalled or self.credit or self.own_r or self.own_c):
            return
        if self.stalled:
            self._unstall(self.stalled)
        if self.credit and self._credit_due():
            self._give_credit()
        self._flush_own_r()
        self._flush_own_c()

    # -- runtime -> client ------------------------------------------------------------------------
    def receive_from_runtime(self, data: bytes, now: float = 0.0, answers_later: bool = False) -> None:
        """The runtime's bytes. With `answers_later`, its header blocks are passed on undecoded: the
        caller writes what goes to the client, then calls `read_answers` (which decodes them,
        measures the calls they end and asks for their hooks), so that an answer leaves before the
        work of reading it. More input, and the end of calls, read them first."""
        if self.answers or self.unread:
            self.read_answers()
        if self.closing:
            return
        if self.c_split.preface_left and not self.client_dead:
            # until the client has shown it speaks HTTP/2, the runtime's first SETTINGS waits: then it
            # goes with the header list limit added (or as it is, to a client that does not)
            self.early.append(data)
            return
        try:
            buf, off, frames = self.r_split.feed(data)
        except (wire.FrameTooLarge, wire.PrefaceError) as exc:
            return self._runtime_broke(str(exc))
        if answers_later and self._passes_as_is(buf, off, frames):
            self.out_c.append(buf)  # the caller writes it at once; its frames are followed after
            self.unread = (buf, frames, now)
            return
        self._runtime_frames(buf, off, frames, now, answers_later, passed=False)

    def _passes_as_is(self, buf: Buf, off: int, frames: list[wire.Frame]) -> bool:
        """Whether this read goes to the client exactly as it came, whatever following its frames
        finds, so that it may go first (a create's answer then leaves ~0.08 ms sooner): whole frames of
        answers, after connection frames that pass unchanged (`_passes_unchanged`). Each answer frame
        is a header block in one HEADERS frame, or the read's one DATA frame, unpadded, holding at
        most one message within the limit; no frame of ours waits to go."""
        if off or not frames or frames[-1][1] != len(buf) or buf is self.r_split.buf:
            return False
        if self.r_block.open or self.own_c:  # (ours wait only while the runtime's block is open)
            return False
        streams = self.streams
        seen_data = answers = False
        for at, end, ftype, flags, sid in frames:
            if ftype == wire.HEADERS:
                if flags != wire.END_HEADERS and flags != wire.END_HEADERS | wire.END_STREAM:
                    return False
                answers = True
            elif ftype == wire.DATA and not seen_data and not flags & wire.PADDED:
                seen_data = answers = True
                st = streams.get(sid)
                if st is None:
                    if sid in self.dropping:  # dropped, not passed
                        return False
                elif not st.response.fits(buf, at + wire.HEADER_LEN, end, self.limits.message):
                    return False  # perhaps a message over the limit: the call is ended instead
            elif answers or not self._passes_unchanged(ftype, sid, end - at):
                return False
        return True

    def _passes_unchanged(self, ftype: int, sid: int, size: int) -> bool:
        """Whether a connection frame of the runtime's that the core may keep or change passes as it
        came, now: a WINDOW_UPDATE while none of the runtime's credit is the core's to keep back
        (`_runtime_window`; what waits for window goes after it), a PING while none is held and no
        slow call is open (`_runtime_ping`). grpc-go sends the two (its probe on a request's DATA)
        ahead of a quick call's answer, in the same read: that read then goes first too, and is read
        in one pass (`_one_answer`): a `Version` call 0.005-0.04 ms sooner against containerd."""
        if sid:
            return False
        if ftype == wire.WINDOW_UPDATE:
            return size == wire.HEADER_LEN + 4 and not self.win.withheld
        return ftype == wire.PING and size == wire.HEADER_LEN + 8 and not self._pings_wait()

    def _runtime_frames(
        self, buf: Buf, off: int, frames: list[wire.Frame], now: float, later: bool, passed: bool
    ) -> None:
        """Follow the runtime's frames; `passed`: they went to the client already (`_passes_as_is`)."""
        start = 0
        out = self.out_c
        streams = self.streams
        end = off
        self.r_later = later
        for at, end, ftype, flags, sid in frames:
            keep = True
            if ftype == wire.DATA:
                if sid in streams:
                    keep = self._runtime_data(streams[sid], flags, buf, at, end, start, now)
                    if not keep:
                        start = end
                        continue
                elif sid in self.dropping:
                    self._span(buf, start, at)
                    self._own_to_runtime(wire.window_update(0, end - at - wire.HEADER_LEN))
                    keep = False
            elif ftype == wire.HEADERS or ftype == wire.CONTINUATION:
                try:
                    self._runtime_headers(ftype, flags, sid, buf, at, end, now)
                except BlockError as exc:
                    if start < at:
                        out.append(buf[start:at])
                    self.r_later = False
                    return self._runtime_broke(str(exc))
            elif ftype == wire.WINDOW_UPDATE:
                keep = self._runtime_window(sid, buf, at, end, start)
            elif ftype == wire.SETTINGS:
                if flags & wire.ACK:
                    if self.answers:  # the blocks before the ACK decode under the table size before it
                        self._span(buf, start, at)  # out first: reading may add frames of ours
                        start = at
                        self.read_answers()
                    self.r_block.acknowledged()
                else:
                    keep = self._runtime_settings(buf, at, end, start)
            elif ftype == wire.RST_STREAM:
                self._reset(sid, CANCELLED)
                self.dropping.discard(sid)
                self._ended_while_decoding(sid)
            elif ftype == wire.GOAWAY:
                keep = self._runtime_goaway(buf, at, end)
            elif ftype == wire.PING and self._pings_wait():
                keep = self._runtime_ping(flags, sid, buf, at, end, start)
            if not keep:
                start = end
            elif self.own_c and not self.r_block.open:
                if start < end:
                    out.append(buf[start:end])
                start = end
                self._flush_own_c()
        self.r_later = False
        if start < end and not passed:
            out.append(buf if start == 0 and end == len(buf) and isinstance(buf, bytes) else buf[start:end])
        self.r_split.keep(buf, end)
        self._after()

    def _span(self, buf: Buf, start: int, at: int) -> None:
        """Write the passed-through frames before `at` (a frame of ours, or a changed one, follows)."""
        if start < at:
            self.out_c.append(buf[start:at])

    def _runtime_data(
        self, st: Stream, flags: int, buf: Buf, at: int, end: int, start: int, now: float
    ) -> bool:
        body = at + wire.HEADER_LEN
        content: Buf | None = None  # the DATA's content, when needed
        if flags & wire.PADDED:
            try:
                content = wire.unpad(flags, bytes(buf[body:end]))
            except wire.FrameError:
                return True  # the client will object; nothing of ours to do
            too_big = st.response.feed(content, 0, len(content), self.limits.message)
        else:
            too_big = st.response.feed(buf, body, end, self.limits.message)
        if too_big:
            self._span(buf, start, at)
            del self.streams[st.id]
            self._measure(st, RESOURCE_EXHAUSTED, now, upstream=True)
            self.dropping.add(st.id)
            message = f"cri-proxy: response larger than max ({too_big} vs. {self.limits.message})"
            self._own_to_client(OwnStatus(st.id, RESOURCE_EXHAUSTED, message, False))
            self._own_to_runtime(wire.rst_stream(st.id, wire.CANCEL))
            self._own_to_runtime(wire.window_update(0, end - body))
            if st.hook is not None:
                self._failed(st.id, st.hook, RESOURCE_EXHAUSTED)
            self._flush_own_c()
            return False
        if st.hook is not None and st.hook.hooks.post is not None and st.hook.request is not None:
            st.hook.response += buf[body:end] if content is None else content
        if flags & wire.END_STREAM:
            del self.streams[st.id]
            if st.hook is not None and st.hook.running:
                self._stop_pre(st.id, st.hook, CANCELLED)
        return True

    def _runtime_headers(
        self, ftype: int, flags: int, sid: int, buf: Buf, at: int, end: int, now: float
    ) -> None:
        block = self.r_block
        payload = buf[at + wire.HEADER_LEN : end]
        done = (
            block.headers(flags, sid, payload)
            if ftype == wire.HEADERS
            else block.continuation(flags, sid, payload)
        )
        if not done:
            return
        later = self.r_later and block.decoder is not None
        decoded = None if later else block.decode()
        if block.end_stream:
            if self.dropping:
                self.dropping.discard(sid)
            if self.c_block.decoding:
                self._ended_while_decoding(sid)
        st = self.streams.get(sid)
        if st is not None:
            st.responded = True
            if block.end_stream:
                del self.streams[st.id]
            else:
                st = None
        if later:
            self.answers.append((st, block.take(), now))
        elif st is not None:
            self._answered(st, decoded, now)

    def read_answers(self) -> None:
        """Follow the frames of a read passed before they were (`unread`), then decode the runtime's
        header blocks passed on undecoded (`answers_later`), in their order: the calls they ended
        are measured and their hooks asked for. A block that does not decode reached the client,
        which rejects it too: its call and the later ones end UNAVAILABLE."""
        if self.unread is not None:
            (buf, frames, now), self.unread = self.unread, None
            if self._one_answer(buf, frames, now):
                return
            self._runtime_frames(buf, 0, frames, now, later=True, passed=True)
        answers, self.answers = self.answers, []
        for i, (st, block, now) in enumerate(answers):
            try:
                if self.closing:  # after a block that did not decode: the table is not the client's
                    raise BlockError("the link is closing")
                decoded = self.r_block.decode_taken(block)
            except BlockError as exc:
                for lost, _, _ in answers[i:]:
                    if lost is not None:
                        self._call_ended(lost, UNAVAILABLE)
                if not self.closing:
                    self._runtime_broke(str(exc))
                return
            if st is not None:
                self._answered(st, decoded, now)
        self._after()

    def posts_first(self) -> bool:
        """Whether a call whose post hook comes before its answer is written (`Hooks.post_first`)
        ends in what was passed on but not read yet (`unread`, `answers`)."""
        if self.unread is not None:
            streams = self.streams
            for _, _, _, flags, sid in self.unread[1]:
                st = streams.get(sid) if flags & wire.END_STREAM else None
                if st is not None and st.hook is not None and st.hook.hooks.post_first:
                    return True
        for ended, _, _ in self.answers:
            if ended is not None and ended.hook is not None and ended.hook.hooks.post_first:
                return True
        return False

    def _one_answer(self, buf: Buf, frames: list[wire.Frame], now: float) -> bool:
        """The usual read of the runtime's, passed before it was followed (`unread`), read in one
        pass: one open call's whole answer (its HEADERS, one DATA and its trailers, each whole and
        plain; no block of an earlier read waits: the read came after they were read), after the
        connection frames that pass unchanged (grpc-go's WINDOW_UPDATE and PING). The same as
        `_runtime_frames` and then the rest of `read_answers` do with it, in fewer steps: 5-12 µs
        (a fifth to a third) less a call with the cache cold (`bench/core.py --create --cold 16`).
        False: nothing done, they take it. `tests/unit/test_relay_one_answer.py` holds the two to
        one outcome."""
        lead = len(frames) - 3
        if lead < 0 or self.closing or self.c_block.decoding:
            return False
        (h_at, h_end, h_type, h_flags, sid), (d_at, d_end, d_type, d_flags, d_sid), trailers = frames[lead:]
        t_at, t_end, t_type, t_flags, t_sid = trailers
        if (
            h_type != wire.HEADERS
            or h_flags != wire.END_HEADERS
            or d_type != wire.DATA
            or d_flags
            or d_sid != sid
            or t_type != wire.HEADERS
            or t_flags != wire.END_HEADERS | wire.END_STREAM
            or t_sid != sid
        ):
            return False
        st = self.streams.get(sid)
        block = self.r_block
        hook = st.hook if st is not None else None
        if st is None or block.decoder is None or (hook is not None and hook.running):
            return False  # (a call answered while its pre hook runs: the general way stops that)
        if lead:  # (connection frames: `_passes_as_is` found them to pass unchanged)
            if any(ftype != wire.WINDOW_UPDATE and ftype != wire.PING for _, _, ftype, _, _ in frames[:lead]):
                return False  # another call's answer
            for at, end, ftype, _, _ in frames[:lead]:
                if ftype == wire.WINDOW_UPDATE:  # as `_runtime_window` takes it then
                    self.win.credited(wire.window_increment(buf[at + wire.HEADER_LEN : end]), self.out_r)
        if hook is not None and hook.hooks.post is not None and hook.request is not None:
            hook.response += buf[d_at + wire.HEADER_LEN : d_end]  # (it ends here: no limit to watch)
        del self.streams[sid]  # (whole frames, passed as they came: the splitter keeps nothing)
        try:  # each block whole in its one frame: decoded from it (`headers` sets up the next one)
            block.decode_taken(bytes(buf[h_at + wire.HEADER_LEN : h_end]))
            decoded = block.decode_taken(bytes(buf[t_at + wire.HEADER_LEN : t_end]))
        except BlockError as exc:  # it reached the client, which rejects it too
            self._after()
            self._call_ended(st, UNAVAILABLE)
            self._runtime_broke(str(exc))
            return True
        self._answered(st, decoded, now)
        self._after()
        return True

    def _answered(self, st: Stream, decoded: tuple[Headers, int] | None, now: float) -> None:
        """The runtime ended a call (`decoded`: its last header block, None when not read)."""
        code = UNKNOWN
        if decoded is not None:
            raw = header_value(decoded[0], b"grpc-status")
            code = int(raw) if raw is not None and raw.isdigit() else UNKNOWN
        self._measure(st, code, now, upstream=True)
        hook = st.hook
        if hook is not None and hook.running:  # answered before its request went (its deadline)
            self._stop_pre(st.id, hook, code if code != OK else CANCELLED)
            return
        if hook is None or hook.request is None or decoded is None:
            return
        if code == OK and hook.hooks.post is not None:
            response = messages.single(bytes(hook.response))
            if response is None:
                self.warnings.append(
                    f"{hook.info.path}: response is not one uncompressed message; no post hook"
                )
            else:
                self.events.append(RunPost(st.id, hook.info, hook.hooks, hook.request, response))
        elif code != OK:
            self._failed(st.id, hook, code)

    def _runtime_window(self, sid: int, buf: Buf, at: int, end: int, start: int) -> bool:
        increment = wire.window_increment(buf[at + wire.HEADER_LEN : end])
        if sid != 0:
            st = self.streams.get(sid)
            if st is None or st.hook is None:
                return True
            # a hooked request's stream: the runtime credits the DATA we sent, the client has had
            # its own credit for what it sent from us (`_hold`); passed on, it would have it twice
            st.hook.window += increment
            if st.hook.sending:
                self._pump(st)
            self._span(buf, start, at)
            return False
        passed = self.win.credited(increment, self.out_r)
        if passed == increment:
            return True
        self._span(buf, start, at)
        if passed:
            self.out_c.append(wire.window_update(0, passed))
        return False

    def _runtime_settings(self, buf: Buf, at: int, end: int, start: int) -> bool:
        payload = bytes(buf[at + wire.HEADER_LEN : end])
        self.c_block.announced(payload)
        for ident, value in wire.settings_pairs(payload):
            if ident == wire.SETTINGS_INITIAL_WINDOW_SIZE:
                change, self.win.initial_window = value - self.win.initial_window, value
                for st in list(self.streams.values()):
                    if st.hook is not None:
                        st.hook.window += change
                        if st.hook.sending:
                            self._pump(st)
            elif ident == wire.SETTINGS_MAX_FRAME_SIZE:
                self.win.max_frame = value
                self.c_split.max_frame = value
        if self.list_announced:
            return True
        self.list_announced = True
        if (
            len(payload) % 6
            or any(ident == wire.SETTINGS_MAX_HEADER_LIST_SIZE for ident, _ in wire.settings_pairs(payload))
            or self.client_dead
        ):
            # the runtime announces its own limit (or a broken frame), or the client does not speak
            # HTTP/2: passed as it is
            return True
        # the runtime's first SETTINGS, plus the header list limit the relay holds the client to (grpc-go's
        # default, which containerd enforces without announcing): a client can then fail fast itself
        self._span(buf, start, at)
        limit = min(self.limits.header_list, wire.MAX_SETTING)
        self.out_c.append(wire.settings_frame(payload, ((wire.SETTINGS_MAX_HEADER_LIST_SIZE, limit),)))
        return False

    def _runtime_ping(self, flags: int, sid: int, buf: Buf, at: int, end: int, start: int) -> bool:
        """A PING (not an ACK) while a slow call is open, or PINGs wait, waits for the core's ACK,
        which goes with the next write to the runtime (see the module's docstring): later ones keep
        their order. False when held."""
        if flags & wire.ACK or sid != 0 or end - at != wire.HEADER_LEN + 8:
            return True  # an ACK of the client's, or a malformed one: the client judges it
        self._span(buf, start, at)
        self.held_pings.append(bytes(buf[at + wire.HEADER_LEN : end]))
        if len(self.held_pings) >= PINGS_HELD:
            self.answer_pings()
        return False

    def _pings_wait(self) -> bool:
        """Whether a runtime PING now waits for the core's ACK (`_runtime_ping`): some wait already
        (later ones keep their order), or a slow call is open (asked once per PING)."""
        return bool(self.held_pings) or any(st.slow for st in self.streams.values())

    def _answer_held(self) -> None:
        """Something goes to the runtime anyway, or the PINGs waited long enough: the core ACKs
        them, in order (the client never sees them)."""
        held, self.held_pings = self.held_pings, []
        for payload in held:
            self._own_to_runtime(wire.frame(wire.PING, wire.ACK, 0, payload))
        self._flush_own_r()

    def answer_pings(self) -> None:
        """The runtime's PINGs waited long enough (the adapter's timer), or too many wait: the core
        answers them."""
        if self.answers or self.unread:
            self.read_answers()
        if self.closing:
            return
        self._answer_held()

    def _runtime_goaway(self, buf: Buf, at: int, end: int) -> bool:
        """The runtime's GOAWAY goes to the client as it came, whatever its code. The calls above its
        last stream it never took: the client, told so by the same frame, counts them as refused
        (a gRPC client tries them again), so they end here unanswered, their hooks' failure path
        run. The others end as the runtime answers them, or when it closes (`runtime_lost`), as
        they would directly."""
        self.goaway_sent = True
        payload = buf[at + wire.HEADER_LEN : end]
        if len(payload) >= 8:  # a shorter one goes as it came too: the client judges it
            last = int.from_bytes(payload[:4], "big") & wire.MAX_WINDOW
            for sid in [sid for sid in self.streams if sid > last]:
                self._call_ended(self.streams.pop(sid), UNAVAILABLE)
                if self.stalled == sid:
                    self.stalled = 0
        return True

    def _runtime_broke(self, why: str) -> None:
        """The runtime sent what the relay cannot follow: end the client's calls, GOAWAY, close."""
        self.warnings.append(f"runtime broke the protocol: {why}")
        self._end_calls(
            UNAVAILABLE, f"cri-proxy: runtime {self.runtime_name} broke the protocol", answer=False
        )
        self.closing = True

    # -- the ends ---------------------------------------------------------------------------------
    def _end_calls(self, code: int, message: str, answer: bool) -> None:
        """End every open call with `code` (answering the client when `answer`); hooks roll back."""
        if self.answers or self.unread:  # the calls the runtime answered just before end as it
            self.read_answers()  # said (and the client's answers, e.g. after it left, were written)
        if self.streams:
            self.warnings.append(f"{message} ({len(self.streams)} calls open)")
        if answer:
            streams = self.streams.items()
            self.out_c.extend(self._status(sid, code, message, not st.responded) for sid, st in streams)
        for st in self.streams.values():
            self._call_ended(st, code)
        self.streams.clear()
        self.stalled = 0

    def _call_ended(self, st: Stream, code: int) -> None:
        """A call ended with `code` without the runtime's answer (as far as we know): measured; its
        pre hook stopped or its hooks' failure path asked for."""
        self._measure(st, code, 0.0, upstream=True)
        hook = st.hook
        if hook is None:
            return
        if hook.running:
            self._stop_pre(st.id, hook, code)
        else:
            self._failed(st.id, hook, code)
        self._settle(hook)

    def runtime_lost(self, why: str) -> None:
        """The runtime connection is gone: every open call ends UNAVAILABLE, its hooks' failure path
        runs, then GOAWAY (unless one went already) and close."""
        if self.closing:
            return
        self._end_calls(
            UNAVAILABLE,
            f"cri-proxy: lost the connection to runtime {self.runtime_name}{why}",
            answer=not self.r_block.open,
        )
        self.closing = True  # as the runtime left it: closed, with no GOAWAY of ours

    def client_lost(self) -> None:
        """The client went away: its calls are cancelled; their hooks' failure path runs."""
        self._end_calls(CANCELLED, "client went away", answer=False)
        self.closing = True

    def go_away(self) -> None:
        """Ask the client to open no new streams (graceful: every stream it sent may complete)."""
        if not self.goaway_sent:
            self._own_to_client(wire.goaway(wire.MAX_WINDOW, wire.NO_ERROR))
            self._flush_own_c()

    def busy(self) -> bool:
        return bool(self.streams) and not self.closing
