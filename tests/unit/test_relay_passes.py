"""A read of the runtime's that the core passes to the client before following its frames
(`LinkCore._passes_as_is`) must leave everything as following them first does: the same bytes
each way, the same hooks asked for, the same calls measured, the same state. Two cores are fed the
same random reads (answers with good and bad message prefixes, padding, PINGs, resets, window
updates, frames of ended or refused streams, reads cut anywhere), one of them never passing a read
early, and compared after each read."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cri_api.v1 import api_pb2 as pb
from cri_proxy.relay import wire
from cri_proxy.relay.core import Limits, LinkCore, PreDone, RunPost, RunPre
from cri_proxy.relay.hooks import Hooks
from tests.unit import reads as reads_

CREATE = "/runtime.v1.RuntimeService/CreateContainer"
VERSION = "/runtime.v1.RuntimeService/Version"
LIMIT = 64  # message limit: a prefix may declare more


async def _hook(*_: Any) -> None:  # never run: the test ends the hooks itself
    return None


HOOKS = Hooks(pre=_hook, post=_hook, failed=_hook)


def block(*pairs: tuple[bytes, bytes]) -> bytes:
    return b"".join(wire.literal_new_name(n, v) for n, v in pairs)


def request(path: str) -> bytes:
    return block(
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()), (b":authority", b"x")
    )


class Side:
    """A core and what it gave: bytes each way, events, calls measured."""

    def __init__(self, early: bool) -> None:
        self.measured: list[tuple[str, int]] = []
        self.core = LinkCore(
            lambda path: HOOKS if path == CREATE else None,
            Limits(message=LIMIT, header_list=4096),
            observer=lambda path, code, total, upstream: self.measured.append((path, code)),
        )
        if not early:
            self.core._passes_as_is = lambda *_: False  # type: ignore[method-assign]
        self.to_client: list[wire.Buf] = []  # as written: a transport may keep what it could not send
        self.to_runtime = bytearray()
        self.events: list[tuple[str, int | str, bytes]] = []
        self.passed = 0  # reads passed before their frames were followed

    def take(self) -> None:
        core = self.core
        self.to_client += core.take_client()
        self.to_runtime += b"".join(bytes(c) for c in core.take_runtime())
        for event in core.take_events():
            if isinstance(event, RunPre):
                self.events.append(("pre", event.stream, event.message or b""))
            elif isinstance(event, RunPost):
                self.events.append(("post", event.info.path, event.response))
            else:
                self.events.append((type(event).__name__, "", b""))

    def client_bytes(self) -> bytes:
        return b"".join(bytes(c) for c in self.to_client)

    def state(self) -> tuple[object, ...]:
        core = self.core
        return (
            self.client_bytes(),
            bytes(self.to_runtime),
            self.events,
            self.measured,
            sorted(core.streams),
            sorted(core.dropping),
            core.held_pings,
            core.closing,
            core.warnings,
            core.buffered(),
            (core.win.runtime_window, core.win.client_allowance, core.win.withheld, core.win.queued),
        )


# the runtime's frames: (kind, stream index, variant)
FRAME = st.tuples(
    st.sampled_from(
        ["headers", "data", "data", "trailers"] * 3 + ["ping", "window", "rst", "settings", "cont"]
    ),
    st.integers(0, 5),
    st.integers(0, 9),
)


def message(size: int, body: int) -> bytes:
    """A gRPC message prefix declaring `size`, and `body` bytes of it."""
    return struct.pack(">BI", 0, size) + b"r" * body


def data_frame_bytes(sid: int, variant: int) -> bytes:
    flags, payload = {
        0: (0, message(0, 0)),  # an empty message
        1: (0, message(3, 3)),  # a whole message
        2: (0, message(LIMIT, 24)),  # the start of a message within the limit
        3: (0, message(LIMIT + 1, 24)),  # ... over it
        4: (0, message(1 << 30, 8)),
        5: (wire.PADDED, b"\x01" + message(LIMIT * 100, 10) + b"\0"),  # over it, padded
        6: (wire.END_STREAM, message(20, 20)),
        7: (0, b"r" * 20),  # the middle of a message (or, read as a prefix, one over the limit)
        8: (0, message(3, 3) + message(4, 4)),  # two messages in one frame
        9: (wire.END_STREAM, b""),
    }[variant]
    return wire.frame(wire.DATA, flags, sid, payload)


def runtime_frame(kind: str, sid: int, variant: int) -> bytes:
    if kind == "headers":
        flags = {6: wire.END_HEADERS | wire.PADDED, 7: 0}.get(variant, wire.END_HEADERS)
        payload = block((b":status", b"200"), (b"content-type", b"application/grpc"))
        if flags & wire.PADDED:
            payload = b"\x02" + payload + b"\0\0"
        return wire.frame(wire.HEADERS, flags, sid, payload)
    if kind == "trailers":
        status = (b"0", b"0", b"5", b"13")[variant % 4]
        return wire.frame(
            wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, sid, block((b"grpc-status", status))
        )
    if kind == "cont":  # a CONTINUATION (alone it breaks the block; after an open HEADERS it ends it)
        return wire.frame(wire.CONTINUATION, wire.END_HEADERS, sid, block((b"x-more", b"m")))
    if kind == "data":
        return data_frame_bytes(sid, variant)
    if kind == "ping":
        return wire.frame(wire.PING, wire.ACK if variant == 1 else 0, 0, bytes([variant]) * 8)
    if kind == "window":
        return wire.window_update(sid if variant % 2 else 0, 100 + variant)
    if kind == "rst":
        return wire.rst_stream(sid, wire.CANCEL)
    return (
        wire.settings(((wire.SETTINGS_INITIAL_WINDOW_SIZE, 70000 + variant),)) if variant else wire.settings()
    )


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
# a message begun in an earlier read, then three DATA frames in one: the third holds a prefix
@example([(False, "ended")], [("data", 0, 2), *[("data", 0, 7)] * 3], [("frames", 1), ("frames", 3)], [True])
# a header block left open, and a HEADERS frame in the same read or in one of its own
@example([(False, "ended")], [("headers", 0, 7), ("headers", 0, 0)], [("frames", 2)], [True])
@example([(False, "ended")], [("headers", 0, 7), ("headers", 0, 0)], [("frames", 1), ("frames", 1)], [True])
# grpc-go's probe ahead of a quick call's answer, and the same while a create (slow) is open
@example(
    [(False, "ended")],
    [("window", 4, 0), ("ping", 4, 0), ("headers", 0, 0), ("data", 0, 1)],
    [("frames", 3)] * 2,
    [True] * 2,
)
@example(
    [(True, "ended"), (False, "ended")],
    [("window", 2, 0), ("ping", 2, 0), ("headers", 1, 0)],
    [("frames", 3)],
    [True],
)
# a WINDOW_UPDATE ahead of an answer, once the core has sent a create's request of its own
@example(
    [(True, "ended"), (False, "ended")],
    [("window", 0, 0), *[(k, 1, 1) for k in ("headers", "data", "trailers")]],
    [("frames", 4)],
    [True],
)
# a PING held while a create was open, then one ahead of a quick call's answer: it waits behind
@example(
    [(True, "ended"), (False, "ended")],
    [("ping", 0, 0), *[(k, 0, 1) for k in ("headers", "data", "trailers")], ("ping", 0, 2),
     *[(k, 1, 1) for k in ("headers", "data", "trailers")]],
    [("frames", 4)] * 2,
    [True] * 2,
)  # fmt: skip
# a read that completes a frame cut in the one before
@example([(False, "ended")], [("headers", 0, 0), ("data", 0, 1)], [("bytes", 5), ("frames", 2)], [])
@given(
    calls=st.lists(
        st.tuples(st.booleans(), st.sampled_from(["ended", "running", "refused"])), min_size=1, max_size=5
    ),
    frames=st.lists(FRAME, min_size=2, max_size=24),
    reads=st.lists(
        st.one_of(
            st.tuples(st.just("frames"), st.integers(1, 3)),
            st.tuples(st.just("frames"), st.integers(1, 3)),
            st.tuples(st.just("bytes"), st.integers(1, 60)),
        ),
        max_size=24,
    ),
    read_now=st.lists(st.booleans(), max_size=24),
)
def test_a_read_passed_before_it_is_followed_leaves_all_as_following_it_first(
    calls: list[tuple[bool, str]],
    frames: list[tuple[str, int, int]],
    reads: list[tuple[str, int]],
    read_now: list[bool],
) -> None:
    sides = [Side(early=True), Side(early=False)]
    sids = [1 + 2 * i for i in range(len(calls))]
    for side in sides:
        core = side.core
        core.receive_from_client(wire.PREFACE + wire.settings())
        core.receive_from_runtime(wire.settings())
        for sid, (hooked, fate) in zip(sids, calls, strict=True):
            path = CREATE if hooked else VERSION
            core.receive_from_client(wire.frame(wire.HEADERS, wire.END_HEADERS, sid, request(path)))
            core.receive_from_client(
                wire.frame(wire.DATA, wire.END_STREAM, sid, struct.pack(">BI", 0, 2) + b"rq")
            )
            if hooked and fate != "running":
                refuse = (7, "no") if fate == "refused" else None
                core.hook_finished(
                    sid, PreDone(None, None if refuse else pb.CreateContainerRequest(), refuse)
                )
        side.take()
    # the runtime's bytes, each frame for a stream of the calls (or 0, or one never opened)
    streams = [*sids, 0, 99]
    chunks = [runtime_frame(kind, streams[i % len(streams)], v) for kind, i, v in frames]
    data = b"".join(chunks)
    ends = [sum(len(c) for c in chunks[: k + 1]) for k in range(len(chunks))]
    for n, read in enumerate(reads_.cut(data, ends, reads)):
        now = n < len(read_now) and read_now[n]
        for side in sides:
            side.core.receive_from_runtime(read, answers_later=True)
            side.passed += side.core.unread is not None
            side.take()
            if now:
                side.core.read_answers()
                side.take()
        if now:
            assert sides[0].state() == sides[1].state()
        else:  # one side's bytes for the client may be ahead, never other ones
            early, late = sides[0].client_bytes(), sides[1].client_bytes()
            assert early[: len(late)] == late or late[: len(early)] == early
    for side in sides:
        side.core.read_answers()
        side.take()
    assert sides[0].state() == sides[1].state()
    assert sides[1].passed == 0


PING = wire.frame(wire.PING, 0, 0, b"p" * 8)
PROBE = wire.window_update(0, 35) + PING  # what grpc-go sends on a request's DATA


@pytest.mark.parametrize(
    ("path", "before", "after", "passed"),
    [
        (VERSION, b"", b"", True),  # the case the early pass is for: an answer alone in its read
        (VERSION, PROBE, b"", True),  # grpc-go's probe ahead of a quick call's answer
        (VERSION, b"", PING, False),  # a PING after the answer
        (CREATE, PROBE, b"", False),  # its PING while a slow call is open: the core answers it
    ],
)
def test_an_answer_alone_in_its_read_is_passed_before_it_is_followed(
    path: str, before: bytes, after: bytes, passed: bool
) -> None:
    side = Side(early=True)
    core = side.core
    core.receive_from_client(wire.PREFACE + wire.settings())
    core.receive_from_runtime(wire.settings())
    core.receive_from_client(wire.frame(wire.HEADERS, wire.END_HEADERS, 1, request(path)))
    core.receive_from_client(wire.frame(wire.DATA, wire.END_STREAM, 1, struct.pack(">BI", 0, 0)))
    if path == CREATE:
        core.hook_finished(1, PreDone(None, pb.CreateContainerRequest(), None))
    side.take()
    window = core.win.runtime_window
    answer = runtime_frame("headers", 1, 0) + runtime_frame("data", 1, 1) + runtime_frame("trailers", 1, 0)
    core.receive_from_runtime(before + answer + after, answers_later=True)
    assert (core.unread is not None) is passed
    assert (1 in core.streams) is passed  # not followed yet: the call is still open for the core
    side.take()
    core.read_answers()
    side.take()
    assert 1 not in core.streams and side.measured == [(path, 0)]
    assert core.buffered() == (len(PING) if path == CREATE else 0)  # (the PING held)
    if path == VERSION:
        assert side.client_bytes().endswith(before + answer + after)
        assert core.win.runtime_window == window + 35 * (len(before) > 0)
    else:  # the core ACKs the PING itself, with the next write to the runtime; the client's window
        # is credited for the request the core sent, not twice
        assert side.client_bytes().endswith(wire.window_update(0, 30) + answer)
        assert core.held_pings == [b"p" * 8]
