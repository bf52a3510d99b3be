"""A runtime's read passed before it was followed that is one call's whole answer, read in one pass
(`LinkCore._one_answer`), must leave everything as the general way (`_runtime_frames`, then the
rest of `read_answers`) does: the same bytes each way, the same calls measured, the same hooks
asked for, the same state and the same decoder table. Two cores are fed the same random
conversation (hooked and unhooked calls; answers usual, trailers only, with two DATA or none,
padded, continued, with a DATA that ends the stream or another stream's trailers, whose header
block does not decode, over the message limit, two in one read, cut anywhere; to calls reset,
whose pre hook runs, whose trailers wait for it or are decoded in steps; answers read right after
their write or at the next call into the core), one of them never taking the one pass, and
compared after each step. The `@example`s are the cases each guard of the one pass is for."""

from __future__ import annotations

import struct
from typing import Any

import hpack
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cri_proxy.relay import wire
from cri_proxy.relay.core import Limits, LinkCore, Readied, RunFailed, RunPost
from cri_proxy.relay.hooks import Hooks, Ready
from cri_proxy.relay.methods import MethodInfo
from tests.h2raw import request_headers
from tests.unit import reads as reads_
from tests.unit.one_pass import OnePass

CREATE = "/runtime.v1.RuntimeService/CreateContainer"
VERSION = "/runtime.v1.RuntimeService/Version"
LIMIT = 64  # message limit


async def _hook(*_: Any) -> None:  # never run: the events are compared
    return None


def _ready(message: bytes, info: MethodInfo) -> Ready | None:
    """Ready, but for a request b"n": its pre hook runs (and never ends here)."""
    return None if message == b"n" else Ready(b"", lambda _: None)


HOOKS = Hooks(post=_hook, failed=_hook, ready=_ready)
SHAPES = (
    "usual",
    "trailers",
    "two",
    "none",
    "padded",
    "continued",
    "broken",
    "broken-head",
    "big",
    "error",
    "data-ends",
    "other-trailers",
    "probed",
)


class Side:
    """A core, what it gave and what it measured."""

    def __init__(self, one_pass: bool) -> None:
        self.measured: list[tuple[str, int]] = []
        self.core = LinkCore(
            lambda path: HOOKS if path == CREATE else None,
            Limits(message=LIMIT),
            observer=lambda path, code, total, upstream: self.measured.append((path, code)),
        )
        self.one_pass = OnePass(self.core, "_one_answer", one_pass)
        self.to_client = bytearray()
        self.to_runtime = bytearray()
        self.events: list[tuple[object, ...]] = []

    def take(self) -> None:
        core = self.core
        self.to_client += b"".join(bytes(c) for c in core.take_client())
        self.to_runtime += b"".join(bytes(c) for c in core.take_runtime())
        for event in core.take_events():
            if isinstance(event, RunPost):
                self.events.append(("post", event.stream, event.request, event.response))
            elif isinstance(event, RunFailed):
                self.events.append(("failed", event.stream, event.request, event.code))
            elif isinstance(event, Readied):
                self.events.append(("ready", event.stream))
            else:
                self.events.append((type(event).__name__,))

    def state(self) -> tuple[object, ...]:
        core = self.core
        decoder = core.r_block.decoder
        table = list(decoder.header_table.dynamic_entries) if decoder is not None else None
        return (
            bytes(self.to_client),
            bytes(self.to_runtime),
            self.events,
            self.measured,
            {
                sid: (s.responded, bytes(s.hook.response) if s.hook else b"")
                for sid, s in core.streams.items()
            },
            sorted(core.dropping),
            core.closing,
            core.warnings,
            core.r_block.open,
            core.answered_early,
            (core.win.runtime_window, core.win.client_allowance, core.win.withheld, core.win.queued),
            core.held_pings,
            table,
            [(s.id if s is not None else None, block, at) for s, block, at in core.answers],
            core.unread is None,
        )


def grpc(body: bytes) -> bytes:
    return struct.pack(">BI", 0, len(body)) + body


def answer(encoder: hpack.Encoder, sid: int, shape: str) -> list[bytes]:
    """The runtime's answer to stream `sid` in `shape`, as frames."""
    head = encoder.encode([(b":status", b"200"), (b"content-type", b"application/grpc")])
    ok = encoder.encode([(b"grpc-status", b"0"), (b"grpc-message", b"")])
    data = wire.frame(wire.DATA, 0, sid, grpc(b"r" * 10))
    headers = wire.frame(wire.HEADERS, wire.END_HEADERS, sid, head)
    trailers = wire.frame(wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, sid, ok)
    if shape == "trailers":
        return [wire.frame(wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, sid, head + ok)]
    if shape == "two":
        return [headers, data, data, trailers]
    if shape == "none":
        return [headers, trailers]
    if shape == "padded":
        return [
            headers,
            wire.frame(wire.DATA, wire.PADDED, sid, b"\x03" + grpc(b"r" * 10) + b"\0" * 3),
            trailers,
        ]
    if shape == "continued":
        return [headers, data, wire.frame(wire.HEADERS, wire.END_STREAM, sid, ok[:1]),
                wire.frame(wire.CONTINUATION, wire.END_HEADERS, sid, ok[1:])]  # fmt: skip
    if shape == "broken":  # an index past the table: the client's decoder rejects it too
        return [headers, data, wire.frame(wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, sid, b"\xff\x7f")]
    if shape == "broken-head":
        return [wire.frame(wire.HEADERS, wire.END_HEADERS, sid, b"\xff\x7f"), data, trailers]
    if shape == "big":  # a message over the limit: the core ends the call itself
        return [headers, wire.frame(wire.DATA, 0, sid, grpc(b"r" * (LIMIT + 1))), trailers]
    if shape == "data-ends":  # the DATA ends the stream: the trailers after it are the runtime's error
        return [headers, wire.frame(wire.DATA, wire.END_STREAM, sid, grpc(b"r" * 10)), trailers]
    if shape == "other-trailers":  # the next stream's trailers
        return [headers, data, wire.frame(wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, sid + 2, ok)]
    if shape == "probed":  # grpc-go's WINDOW_UPDATE and PING (the probe on the request's DATA) first
        probe = wire.window_update(0, 17 + sid) + wire.frame(wire.PING, 0, 0, bytes([sid]) * 8)
        return [probe, headers, data, trailers]
    if shape == "error":
        failed = encoder.encode([(b"grpc-status", b"5"), (b"grpc-message", b"not found")])
        return [headers, wire.frame(wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, sid, failed)]
    return [headers, data, trailers]


CALL = st.tuples(
    st.sampled_from((CREATE, VERSION)),
    st.sampled_from(SHAPES),
    st.sampled_from(("open", "reset", "pre", "trailers", "big-trailers")),
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@example([(CREATE, "usual", "open")] * 3, [("frames", 3)] * 3, [True] * 3)  # the usual: all in one pass
@example([(VERSION, "usual", "open")] * 2, [("frames", 6)], [True])  # two answers in one read
@example([(CREATE, "usual", "open")], [("frames", 2)], [True])  # the trailers in a read of their own
@example([(CREATE, "broken", "open"), (CREATE, "usual", "open")], [("frames", 3)] * 2, [True] * 2)
@example([(CREATE, "broken-head", "open")], [("frames", 3)], [True])
@example([(CREATE, "big", "open")], [("frames", 3)], [True])
@example([(CREATE, "padded", "open")], [("frames", 3)], [True])
@example([(CREATE, "usual", "reset")], [("frames", 3)], [False])  # to a stream that is gone
@example([(CREATE, "usual", "pre")], [("frames", 3)], [True])  # while its pre hook runs
@example([(CREATE, "data-ends", "open")], [("frames", 3)], [True])
@example([(VERSION, "usual", "big-trailers")], [("frames", 3)], [True])
@example([(CREATE, "usual", "trailers"), (VERSION, "usual", "open")], [("frames", 3)] * 2, [True] * 2)
@example([(CREATE, "other-trailers", "open"), (VERSION, "usual", "open")], [("frames", 3)], [True])
@example([(VERSION, "usual", "open"), (CREATE, "usual", "open")], [("frames", 3)] * 2, [False, True])
@example([(VERSION, "probed", "open")] * 2, [("frames", 4)] * 2, [True] * 2)  # grpc-go's quick call
@example([(CREATE, "trailers", "open"), (CREATE, "usual", "open")], [], [])  # four frames, two answers
@example([(CREATE, "probed", "open")], [("frames", 4)], [True])  # its PING held: the general way
@example([(VERSION, "probed", "open")], [("frames", 1), ("frames", 3)], [True] * 2)  # the probe alone
@given(
    calls=st.lists(CALL, min_size=1, max_size=5),
    reads=st.lists(
        st.one_of(
            st.tuples(st.just("call"), st.integers(1, 2)),
            st.tuples(st.just("frames"), st.integers(1, 4)),
            st.tuples(st.just("bytes"), st.integers(1, 60)),
        ),
        max_size=12,
    ),
    at_once=st.lists(st.booleans(), max_size=12),
)
def test_an_answer_read_in_one_pass_leaves_all_as_the_general_way(
    calls: list[tuple[str, str, str]], reads: list[tuple[str, int]], at_once: list[bool]
) -> None:
    """`calls`: (path, the answer's shape, the call when it comes: "open", "reset" by the client
    first, or, for a create, its "pre" hook running, or that of a request ended by "trailers",
    or its "big-trailers" being decoded, in steps for an unhooked call).
    `at_once`: whether a read's answers are read
    right after its write (the adapter's way), else at the next call into the core."""
    sides = [Side(True), Side(False)]
    client, runtime = hpack.Encoder(), hpack.Encoder()
    for side in sides:
        side.core.receive_from_client(wire.PREFACE + wire.settings())
        side.core.receive_from_runtime(wire.settings())
        side.take()
    frames: list[bytes] = []
    call_ends: list[int] = []
    for i, (path, shape, how) in enumerate(calls):
        sid = 1 + 2 * i
        block = client.encode(request_headers(path))
        request = wire.frame(wire.HEADERS, wire.END_HEADERS, sid, block)
        if how == "big-trailers":  # trailers whose decoding takes steps (none is taken here)
            many = [(f"x-{k}", "v") for k in range(400)]
            request += wire.frame(wire.DATA, 0, sid, grpc(b"q"))
            request += wire.frame(wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, sid, client.encode(many))
        elif how == "trailers":  # its pre hook runs, the client's next frames wait for it (`stalled`)
            request += wire.frame(wire.DATA, 0, sid, grpc(b"q"))
            request += wire.frame(
                wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, sid, client.encode([("x-t", "1")])
            )
        else:
            request += wire.frame(wire.DATA, wire.END_STREAM, sid, grpc(b"n" if how == "pre" else b"q"))
        if how == "reset":
            request += wire.rst_stream(sid, wire.CANCEL)
        for side in sides:
            side.core.receive_from_client(request, 1.0)
            side.take()
        frames += answer(runtime, sid, shape)
        call_ends.append(sum(len(f) for f in frames))
    data = b"".join(frames)
    ends = [sum(len(f) for f in frames[: k + 1]) for k in range(len(frames))]
    for n, read in enumerate(reads_.cut(data, ends, reads, call_ends)):
        for side in sides:
            side.core.receive_from_runtime(read, 2.0, answers_later=True)
            side.take()
            if n >= len(at_once) or at_once[n]:
                side.core.read_answers()
                side.take()
        assert sides[0].state() == sides[1].state()
    for side in sides:
        side.core.read_answers()
        side.take()
    assert sides[0].state() == sides[1].state()
    assert sides[1].one_pass.taken == 0


def test_the_usual_answers_are_read_in_one_pass() -> None:
    """A hooked create's answer and an unhooked call's, each in a read of its own, take it; the
    hooks after the create get its request and response."""
    side = Side(True)
    core = side.core
    core.receive_from_client(wire.PREFACE + wire.settings())
    core.receive_from_runtime(wire.settings())
    client, runtime = hpack.Encoder(), hpack.Encoder()
    window = core.win.runtime_window
    # (grpc-go's probe first: once the core has sent a create's request of its own, the runtime's
    # credit for it is not the client's, and a WINDOW_UPDATE no longer passes unchanged)
    for sid, path, shape in (
        (1, VERSION, "probed"),
        (3, CREATE, "usual"),
        (5, VERSION, "usual"),
        (7, CREATE, "usual"),
    ):
        block = client.encode(request_headers(path))
        request = wire.frame(wire.HEADERS, wire.END_HEADERS, sid, block)
        core.receive_from_client(request + wire.frame(wire.DATA, wire.END_STREAM, sid, grpc(b"q")), 1.0)
        core.receive_from_runtime(b"".join(answer(runtime, sid, shape)), 2.0, answers_later=True)
        assert core.unread is not None  # passed before it was followed
        side.take()
        core.read_answers()
        side.take()
    assert side.one_pass.taken == 4
    assert [e[0] for e in side.events] == ["ready", "post", "ready", "post"]
    assert side.events[1] == ("post", 3, b"q", b"r" * 10)
    assert side.measured == [(VERSION, 0), (CREATE, 0), (VERSION, 0), (CREATE, 0)]
    assert core.win.runtime_window == window - 4 * len(grpc(b"q")) + 17 + 1  # the probe's credit
    assert not core.streams and core.unread is None and not core.r_split.pending()
