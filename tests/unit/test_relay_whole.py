"""A client's read that holds a new call's whole request, taken in one pass
(`LinkCore._whole_request`), must leave everything as the general loop (`_client_frames`) does:
the same bytes each way, the same hooks asked for, the same state. Two cores are fed the same
random conversation (hooked, unhooked and unknown calls; header blocks padded, prioritised,
continued, compressed, broken, decoded in steps, over the list or the block limit, never ended;
stream ids even or used again; messages split, short, over the limit, ended by an empty DATA;
trailers; PINGs, window updates, resets and SETTINGS around them; the link's buffer or the relay's
budget full; the runtime's windows and frame size changing, its header block left open; a core that
does not decode; reads cut anywhere), one of them never taking the one pass, and compared after
each read. The `@example`s are the cases each guard of the one pass is for."""

from __future__ import annotations

import struct
from typing import Any

import hpack
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cri_proxy.relay import wire
from cri_proxy.relay.core import Limits, LinkCore, PreDone, Readied, RunPre
from cri_proxy.relay.flow import Budget
from cri_proxy.relay.hooks import Hooks, Ready
from cri_proxy.relay.methods import MethodInfo
from tests.unit import reads as reads_
from tests.unit.one_pass import OnePass

CREATE = "/runtime.v1.RuntimeService/CreateContainer"
VERSION = "/runtime.v1.RuntimeService/Version"
OTHER = "/runtime.v1.Unknown/Call"
PATHS = (CREATE, VERSION, OTHER)
LIMIT = 64  # message limit


async def _hook(*_: Any) -> None:  # never run: the test ends the hooks itself
    return None


def _ready(message: bytes, info: MethodInfo) -> Ready | None:
    """Ready for a message starting with b"r" (a patch of its second byte's size), None for b"n",
    a hook's bug for b"x"."""
    if message[:1] == b"x":
        raise ValueError("a bug")
    if message[:1] != b"r":
        return None
    return Ready(b"\x12" + bytes([message[1] % 100]) + b"p" * (message[1] % 100), lambda _: None)


HOOKS = Hooks(pre=_hook, post=_hook, failed=_hook, ready=_ready)


class Side:
    """A core and what it gave: bytes each way, events."""

    def __init__(
        self, whole: bool, buffer: int = 1 << 12, budget: int = 1 << 62, decode: bool = True
    ) -> None:
        self.core = LinkCore(
            lambda path: HOOKS if path == CREATE else None,
            Limits(message=LIMIT, header_list=4096, buffer=buffer, header_block=12_000),
            Budget(budget),
            observer=lambda path, code, total, upstream: None,
            decode_client=decode,
        )
        self.one_pass = OnePass(self.core, "_whole_request", whole)
        self.to_client = bytearray()
        self.to_runtime = bytearray()
        self.events: list[tuple[object, ...]] = []
        self.pres: list[int] = []  # streams whose pre hook runs

    def take(self) -> None:
        core = self.core
        self.to_client += b"".join(bytes(c) for c in core.take_client())
        self.to_runtime += b"".join(bytes(c) for c in core.take_runtime())
        for event in core.take_events():
            if isinstance(event, RunPre):
                self.events.append(("pre", event.stream, event.message, event.why))
                self.pres.append(event.stream)
            elif isinstance(event, Readied):
                self.events.append(("ready", event.stream, event.request, event.ready.patch))
            else:
                self.events.append((type(event).__name__,))

    def state(self) -> tuple[object, ...]:
        core = self.core
        win = core.win
        hooks = {
            sid: (s.hook.released, s.hook.running, s.hook.finished, s.hook.window, s.hook.held_bytes)
            for sid, s in core.streams.items()
            if s.hook is not None
        }
        return (
            bytes(self.to_client),
            bytes(self.to_runtime),
            self.events,
            sorted(core.streams),
            hooks,
            sorted(core.dropping),
            (win.runtime_window, win.client_allowance, win.withheld, win.queued),
            core.credit,
            core.held,
            core.budget.used,
            core.last_stream,
            core.stalled,
            core.client_dead,
            core.closing,
            core.warnings,
            core.buffered(),
        )


def grpc(first: bytes, size: int, declared: int | None = None, compressed: int = 0) -> bytes:
    """A gRPC message of `size` bytes starting with `first` (its prefix may declare another size)."""
    body = (first + bytes([size % 7, 0]) + b"m" * size)[:size]
    return struct.pack(">BI", compressed, size if declared is None else declared) + body


# one call: (path, how its headers go, how its body goes, the message's first byte, its size)
CALL = st.tuples(
    st.sampled_from(PATHS),
    st.sampled_from(
        ["plain"] * 6
        + ["padded", "priority", "continued", "end", "gzip", "index", "even", "again"]
        + ["unfinished", "broken", "huge", "giant"]
    ),
    st.sampled_from(
        ["whole"] * 6 + ["padded", "split", "short", "over", "compressed", "trailers", "none", "big", "open"]
    ),
    st.sampled_from([b"r", b"r", b"n", b"x"]),
    st.integers(2, LIMIT + 2),
)
# what goes between the calls' frames: (kind, variant)
EXTRA = st.tuples(
    st.sampled_from(["window", "ping", "ack", "rst", "settings", "sack", "none"]), st.integers(0, 3)
)


def call_frames(encoder: hpack.Encoder, sid: int, call: tuple[str, str, str, bytes, int]) -> list[bytes]:
    path, head, body, first, size = call
    fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x")]
    if head == "gzip":
        fields.append(("grpc-encoding", "gzip"))
    if head == "index":  # a literal the table keeps: later blocks refer to it, or evict it
        fields.append(("grpc-timeout", f"{sid * 7919 % 100000}u"))
    if head in ("huge", "giant"):  # decoded in steps, over the list limit; over the block limit
        fields.append(("x-big", "m" * (10_000 if head == "huge" else 17_000)))
    block = b"\x80" if head == "broken" else encoder.encode(fields)  # index 0: does not decode
    end = wire.END_STREAM if head == "end" or body == "none" else 0
    frames: list[bytes] = []
    if head == "unfinished":  # its block never ends: the next HEADERS breaks the protocol
        frames.append(wire.frame(wire.HEADERS, end, sid, block))
    elif head == "padded":
        frames.append(
            wire.frame(wire.HEADERS, wire.END_HEADERS | wire.PADDED | end, sid, b"\x02" + block + b"\0\0")
        )
    elif head == "priority":
        frames.append(
            wire.frame(
                wire.HEADERS, wire.END_HEADERS | wire.PRIORITY_FLAG | end, sid, b"\0\0\0\0\x10" + block
            )
        )
    elif head == "continued":
        frames.append(wire.frame(wire.HEADERS, end, sid, block[:3]))
        frames.append(wire.frame(wire.CONTINUATION, wire.END_HEADERS, sid, block[3:]))
    else:
        frames.append(wire.frame(wire.HEADERS, wire.END_HEADERS | end, sid, block))
    if end:
        return frames
    message = grpc(first, size)
    if body == "whole":
        frames.append(wire.frame(wire.DATA, wire.END_STREAM, sid, message))
    elif body == "padded":
        frames.append(wire.frame(wire.DATA, wire.END_STREAM | wire.PADDED, sid, b"\x01" + message + b"\0"))
    elif body == "split":
        frames.append(wire.frame(wire.DATA, 0, sid, message[:3]))
        frames.append(wire.frame(wire.DATA, wire.END_STREAM, sid, message[3:]))
    elif body == "short":  # the prefix declares more than comes
        frames.append(wire.frame(wire.DATA, wire.END_STREAM, sid, grpc(first, size, declared=size + 1)))
    elif body == "over":
        frames.append(wire.frame(wire.DATA, wire.END_STREAM, sid, grpc(first, LIMIT + 1)))
    elif body == "big":  # most of the runtime's connection window, in frames of the largest size
        big = grpc(first, 65_500)
        frames += [wire.frame(wire.DATA, 0, sid, big[at : at + 15_000]) for at in range(0, 60_000, 15_000)]
        frames.append(wire.frame(wire.DATA, wire.END_STREAM, sid, big[60_000:]))
    elif body == "open":  # a whole message, the stream ended by an empty DATA after it
        frames.append(wire.frame(wire.DATA, 0, sid, message))
        frames.append(wire.frame(wire.DATA, wire.END_STREAM, sid, b""))
    elif body == "compressed":
        frames.append(wire.frame(wire.DATA, wire.END_STREAM, sid, grpc(first, size, compressed=1)))
    else:  # trailers
        frames.append(wire.frame(wire.DATA, 0, sid, message))
        frames.append(
            wire.frame(wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, sid, encoder.encode([("x-t", "1")]))
        )
    return frames


def extra_frame(kind: str, variant: int, sid: int) -> bytes:
    if kind == "window":
        return wire.window_update(sid if variant % 2 else 0, 1 + variant * 1000)
    if kind == "ping":
        return wire.frame(wire.PING, 0, 0, bytes([variant]) * 8)
    if kind == "ack":
        return wire.frame(wire.PING, wire.ACK, 0, bytes([variant]) * 8)
    if kind == "rst":
        return wire.rst_stream(sid, wire.CANCEL)
    if kind == "settings":
        return wire.settings(((wire.SETTINGS_INITIAL_WINDOW_SIZE, 1 << 16),))
    if kind == "sack":
        return wire.frame(wire.SETTINGS, wire.ACK, 0)
    return b""


def runtime_frame(kind: int) -> bytes:
    """The runtime's frames that change what a request may send: windows, frame size."""
    return (
        wire.settings(((wire.SETTINGS_INITIAL_WINDOW_SIZE, 40),)),  # smaller than a patched request
        wire.settings(((wire.SETTINGS_INITIAL_WINDOW_SIZE, 1 << 16),)),
        wire.settings(((wire.SETTINGS_MAX_FRAME_SIZE, 1 << 14),)),
        wire.window_update(0, 50),
        wire.window_update(0, 60_000),
        wire.window_update(1, 200),
        wire.frame(wire.SETTINGS, wire.ACK, 0),
        # an answer's header block left open (our frames for the client wait), then closed
        wire.frame(wire.HEADERS, 0, 1, hpack.Encoder().encode([(":status", "200")])),
        wire.frame(wire.CONTINUATION, wire.END_HEADERS, 1, b""),
    )[kind]


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
# the usual read: a hooked create's whole request, with the client's window updates around it
@example(
    [(CREATE, "plain", "whole", b"r", 20)] * 3,
    [("window", 0)] * 3,
    [("frames", 3)] * 3,
    [],
    [],
    (1 << 12, 1 << 62, True),
)
# a patched request larger than the runtime's stream window: it goes in pieces
@example(
    [(CREATE, "plain", "whole", b"r", 60)],
    [("none", 0)],
    [("frames", 2)],
    [0],
    [True],
    (1 << 12, 1 << 62, True),
)
# each case the one pass leaves to the general loop, alone in its read after the calls before it
@example(
    [
        (VERSION, "plain", "big", b"r", 2),
        (CREATE, "plain", "whole", b"r", 60),
        *[(VERSION, "plain", "whole", b"r", 40)] * 2,
    ],
    [],
    [("call", 1)] * 4,
    [None, 3],
    [],
    (1 << 12, 1 << 62, True),
)  # the runtime's connection window spent (the client's is not: its held request was credited):
# a DATA waits for it, and what comes after it
@example([(CREATE, "plain", "open", b"r", 20)], [], [("frames", 2)], [], [], (1 << 12, 1 << 62, True))
@example([(VERSION, "plain", "whole", b"r", 20)] * 2, [], [("past", 5)], [], [], (1 << 12, 1 << 62, True))
@example([(CREATE, "plain", "whole", b"r", 20)] * 2, [], [("call", 1)] * 2, [], [], (1 << 12, 1 << 62, False))
@example([(CREATE, "plain", "short", b"r", 20)], [], [("call", 1)], [], [], (1 << 12, 1 << 62, True))
@example([(CREATE, "plain", "over", b"r", 20)], [], [("call", 1)], [], [], (1 << 12, 1 << 62, True))
@example(
    [(CREATE, "plain", "whole", b"n", 20), (CREATE, "again", "whole", b"r", 20)],
    [],
    [("call", 1)] * 2,
    [],
    [],
    (1 << 12, 1 << 62, True),
)  # a stream id used again
@example([(CREATE, "plain", "whole", b"n", 60)] * 4, [], [("call", 1)] * 4, [], [], (200, 1 << 62, True))
@example([(CREATE, "plain", "whole", b"n", 60)] * 3, [], [("call", 1)] * 3, [], [], (1 << 12, 150, True))
@example(
    [(CREATE, "plain", "open", b"r", 20), (CREATE, "plain", "compressed", b"r", 20)],
    [],
    [("call", 1)] * 2,
    [],
    [],
    (1 << 12, 1 << 62, True),
)
@example(
    [(CREATE, "huge", "none", b"r", 20), (CREATE, "plain", "whole", b"r", 20)],
    [],
    [("frames", 1), ("call", 1)],
    [],
    [],
    (1 << 12, 1 << 62, True),
)  # the next call comes while a block is decoded in steps
@example(
    [(CREATE, "huge", "whole", b"r", 20)], [], [("call", 1)], [], [], (1 << 12, 1 << 62, True)
)  # a header list over the limit: the stream is refused
@example(
    [(CREATE, "unfinished", "none", b"r", 20), (CREATE, "plain", "whole", b"r", 20)],
    [],
    [("call", 1)] * 2,
    [],
    [],
    (1 << 12, 1 << 62, True),
)
@example([(CREATE, "giant", "whole", b"r", 20)], [], [("call", 1)], [], [], (1 << 12, 1 << 62, True))
@example([(CREATE, "broken", "whole", b"r", 20)], [], [("call", 1)], [], [], (1 << 12, 1 << 62, True))
@given(
    calls=st.lists(CALL, min_size=1, max_size=6),
    extras=st.lists(EXTRA, max_size=6),
    reads=st.lists(
        st.one_of(
            st.tuples(st.just("call"), st.just(1)),
            st.tuples(st.just("call"), st.integers(1, 2)),
            st.tuples(st.just("past"), st.integers(1, 12)),
            st.tuples(st.just("frames"), st.integers(1, 4)),
            st.tuples(st.just("bytes"), st.integers(1, 80)),
        ),
        max_size=24,
    ),
    runtime=st.lists(st.one_of(st.none(), st.integers(0, 8)), max_size=24),
    bounds=st.sampled_from(
        [(1 << 12, 1 << 62, True), (200, 1 << 62, True), (1 << 12, 150, True), (1 << 12, 1 << 62, False)]
    ),
    finish=st.lists(st.booleans(), max_size=24),
)
def test_a_whole_request_taken_in_one_pass_leaves_all_as_the_general_loop(
    calls: list[tuple[str, str, str, bytes, int]],
    extras: list[tuple[str, int]],
    reads: list[tuple[str, int]],
    runtime: list[int | None],
    finish: list[bool],
    bounds: tuple[int, int, bool],
) -> None:
    sides = [Side(True, *bounds), Side(False, *bounds)]
    for side in sides:
        side.core.receive_from_client(wire.PREFACE + wire.settings())
        side.core.receive_from_runtime(wire.settings())
        side.take()
    encoder = hpack.Encoder()
    chunks: list[bytes] = []
    call_ends: list[int] = []  # where each call's frames (and the extra after it) end
    for i, call in enumerate(calls):
        # a client's stream ids are odd and new: "even" and "again" break that
        sid = {"even": 2 + 2 * i, "again": max(1, 2 * i - 1)}.get(call[1], 1 + 2 * i)
        chunks += call_frames(encoder, sid, call)
        if i < len(extras):
            kind, variant = extras[i]
            chunks.append(extra_frame(kind, variant, sid))
        call_ends.append(sum(len(c) for c in chunks))
    chunks = [c for c in chunks if c]
    data = b"".join(chunks)
    ends = [sum(len(c) for c in chunks[: k + 1]) for k in range(len(chunks))]
    for n, read in enumerate(reads_.cut(data, ends, reads, call_ends)):
        for side in sides:
            if n < len(runtime) and runtime[n] is not None:
                side.core.receive_from_runtime(runtime_frame(runtime[n]), 1.0)
                side.take()
            side.core.receive_from_client(read, 1.0)
            side.take()
            if n < len(finish) and finish[n] and side.pres:  # the oldest pre hook ends, changing nothing
                side.core.hook_finished(side.pres.pop(0), PreDone(None, None), 1.0)
                side.take()
        assert sides[0].state() == sides[1].state()


def test_the_usual_reads_are_taken_in_one_pass() -> None:
    """The reads the one pass is for take it: a hooked create's request, ready, with the client's
    window updates around it, and an unhooked call's; a read cut inside a frame does not."""
    side = Side(whole=True)
    core = side.core
    core.receive_from_client(wire.PREFACE + wire.settings())
    core.receive_from_runtime(wire.settings())
    encoder = hpack.Encoder()
    for sid, path in ((1, CREATE), (3, VERSION), (5, CREATE)):
        frames = call_frames(encoder, sid, (path, "plain", "whole", b"r", 20))
        core.receive_from_client(wire.window_update(0, 9) + b"".join(frames) + wire.window_update(0, 9), 1.0)
        side.take()
    assert side.one_pass.taken == 3
    assert [e[0] for e in side.events] == ["ready", "ready"]
    assert core.held == 0 and core.budget.used == 0 and not core.c_split.pending()
    frames = call_frames(encoder, 7, (CREATE, "plain", "whole", b"r", 20))
    core.receive_from_client(frames[0] + frames[1][:5], 1.0)
    core.receive_from_client(frames[1][5:], 1.0)
    side.take()
    assert side.one_pass.taken == 3 and side.events[-1][:2] == ("ready", 7)
