"""The runtime's answers are written to the client before they are read (`answers_later`): their
header blocks are decoded after the write (`read_answers`), then the calls they end are measured
and their hooks asked for. On a LinkCore between two `h2` peers; the adapter's side is in
test_relay_turns.py, and the state machine (test_relay_core_props.py) reads answers now, after
the write or at the next call into the core, at random."""

from __future__ import annotations

import struct
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings

from cri_api.v1 import api_pb2 as pb
from cri_proxy.relay import wire
from cri_proxy.relay.core import UNAVAILABLE, Limits, LinkCore, PreDone, RunFailed, RunPost, RunPre
from cri_proxy.relay.hooks import Hooks
from tests.h2raw import request_headers

CREATE = "/runtime.v1.RuntimeService/CreateContainer"
REPLY = pb.CreateContainerResponse(container_id="c1").SerializeToString()


async def _hook(*_: Any) -> None:  # never run: the test hands the core its outcomes itself
    return None


class Pair:
    """A client and a runtime (`h2`) through a LinkCore hooking CreateContainer, measured."""

    def __init__(self) -> None:
        self.measured: list[tuple[str, int]] = []
        self.core = LinkCore(
            lambda path: Hooks(pre=_hook, post=_hook, failed=_hook) if path == CREATE else None,
            Limits(),
            observer=lambda path, code, total, upstream: self.measured.append((path, code)),
        )
        cfg = h2.config.H2Configuration
        self.client = h2.connection.H2Connection(cfg(client_side=True, header_encoding=None))
        self.runtime = h2.connection.H2Connection(cfg(client_side=False, header_encoding=None))
        self.client.initiate_connection()
        self.runtime.initiate_connection()
        self.client_events: list[h2.events.Event] = []
        self.move()

    def move(self) -> None:
        """Deliver everything queued both ways until nothing moves (answers read as they pass)."""
        moved = True
        while moved:
            moved = False
            for data, into in (
                (self.client.data_to_send(), self.core.receive_from_client),
                (self.runtime.data_to_send(), self.core.receive_from_runtime),
            ):
                if data:
                    into(data)
                    moved = True
            out = b"".join(bytes(c) for c in self.core.take_runtime())
            if out:
                self.runtime.receive_data(out)
                moved = True
            moved |= self.to_client()

    def to_client(self) -> bool:
        out = b"".join(bytes(c) for c in self.core.take_client())
        if out:
            self.client_events += self.client.receive_data(out)
        return bool(out)

    def hooked_call(self) -> int:
        """A CreateContainer whose pre hook ended (the request went on unchanged)."""
        sid: int = self.client.get_next_available_stream_id()
        self.client.send_headers(sid, request_headers(CREATE))
        self.client.send_data(sid, struct.pack(">BI", 0, 0), end_stream=True)
        self.move()
        events = self.core.take_events()
        assert [type(e) for e in events] == [RunPre]
        self.core.hook_finished(sid, PreDone(None, pb.CreateContainerRequest()))
        self.move()
        return sid

    def answer(self, sid: int, trailers: bytes | None = None) -> bytes:
        """The runtime's answer (OK, REPLY), not yet delivered; `trailers`: a block of its own."""
        self.runtime.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
        self.runtime.send_data(sid, struct.pack(">BI", 0, len(REPLY)) + REPLY)
        if trailers is None:
            self.runtime.send_headers(sid, [("grpc-status", "0")], end_stream=True)
            return self.runtime.data_to_send()
        head = self.runtime.data_to_send()
        return head + wire.frame(wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, sid, trailers)

    def client_statuses(self) -> dict[int, bytes]:
        return {
            e.stream_id: dict(e.headers)[b"grpc-status"]
            for e in self.client_events
            if isinstance(e, h2.events.TrailersReceived)
        }


def test_an_answer_is_written_before_it_is_read() -> None:
    pair = Pair()
    sid = pair.hooked_call()
    pair.core.receive_from_runtime(pair.answer(sid), answers_later=True)
    assert pair.to_client()
    assert pair.client_statuses() == {sid: b"0"}  # the client has the whole answer ...
    assert pair.core.unread is not None  # ... whose frames the core has not even followed yet
    assert not pair.core.answers and sid in pair.core.streams
    assert not pair.core.take_events() and not pair.measured
    assert pair.core.buffered() > 0

    pair.core.read_answers()
    events = pair.core.take_events()
    assert len(events) == 1 and isinstance(events[0], RunPost) and events[0].response == REPLY
    assert pair.measured == [(CREATE, 0)]
    assert sid not in pair.core.streams
    assert pair.core.unread is None and not pair.core.answers and pair.core.buffered() == 0
    assert not pair.core.take_client()  # nothing more for the client


def test_answers_not_read_yet_are_read_first_by_the_next_call_into_the_core() -> None:
    pair = Pair()
    sid = pair.hooked_call()
    pair.core.receive_from_runtime(pair.answer(sid), answers_later=True)
    pair.to_client()
    pair.client.ping(b"12345678")
    pair.core.receive_from_client(pair.client.data_to_send())
    assert [type(e) for e in pair.core.take_events()] == [RunPost]
    assert pair.measured == [(CREATE, 0)]
    # and the dynamic tables are still those the client's decoder has
    pair.move()
    ours = pair.core.r_block.decoder
    assert ours is not None
    assert list(ours.header_table.dynamic_entries) == list(pair.client.decoder.header_table.dynamic_entries)


def test_an_answer_that_does_not_decode_reaches_the_client_and_its_call_ends_unavailable() -> None:
    """Read later, a block that does not decode has gone to the client (whose decoder rejects it,
    as it would from the runtime directly); the core then ends its call UNAVAILABLE (the hooks'
    failure path), as it does when it reads the block as it passes, and closes the link."""
    pair = Pair()
    sid = pair.hooked_call()
    bad = b"\xff\xff\xff\xff\x0f"  # an index far past any table
    pair.core.receive_from_runtime(pair.answer(sid, trailers=bad), answers_later=True)
    written = b"".join(bytes(c) for c in pair.core.take_client())
    assert bad in written
    pair.core.read_answers()
    events = pair.core.take_events()
    assert len(events) == 1 and isinstance(events[0], RunFailed) and events[0].code == UNAVAILABLE
    assert pair.measured == [(CREATE, UNAVAILABLE)]
    assert pair.core.closing
    assert any("does not decode" in w for w in pair.core.warnings)

    now = Pair()  # read as it passes: the block is not passed on; the call ends the same way
    sid = now.hooked_call()
    now.core.receive_from_runtime(now.answer(sid, trailers=bad))
    assert bad not in b"".join(bytes(c) for c in now.core.take_client())
    events = now.core.take_events()
    assert len(events) == 1 and isinstance(events[0], RunFailed) and events[0].code == UNAVAILABLE
    assert now.measured == [(CREATE, UNAVAILABLE)] and now.core.closing


def test_a_settings_ack_after_an_answer_reads_the_answer_first() -> None:
    """A SETTINGS ACK after an answer in the same read makes the core read the answer first (the
    table size the ACK brings binds later blocks only). The PING it held for the slow call gets the
    core's ACK with the client's SETTINGS (the next write to the runtime); the client sees the
    answer, then the SETTINGS ACK, no PING."""
    pair = Pair()
    sid = pair.hooked_call()  # CreateContainer: slow, so the runtime's PING waits
    pair.runtime.ping(b"held-001")
    pair.core.receive_from_runtime(pair.runtime.data_to_send())
    assert pair.core.held_pings
    pair.client.update_settings({h2.settings.SettingCodes.HEADER_TABLE_SIZE: 4096})
    pair.core.receive_from_client(pair.client.data_to_send())
    with_settings = pair.runtime.receive_data(b"".join(bytes(c) for c in pair.core.take_runtime()))
    acks = [e.ping_data for e in with_settings if isinstance(e, h2.events.PingAckReceived)]
    assert acks == [b"held-001"] and not pair.core.held_pings
    ack = pair.runtime.data_to_send()
    assert ack == wire.SETTINGS_ACK
    pair.core.receive_from_runtime(pair.answer(sid) + ack, answers_later=True)
    events = pair.client.receive_data(b"".join(bytes(c) for c in pair.core.take_client()))
    kinds = [type(e) for e in events]
    assert h2.events.StreamEnded in kinds and h2.events.PingReceived not in kinds
    assert kinds[-1] is h2.events.SettingsAcknowledged
    assert pair.core.take_runtime() == []  # nothing of its own after the answer
    pair.core.read_answers()
    assert [type(e) for e in pair.core.take_events()] == [RunPost]


def test_answers_not_read_when_the_runtime_is_lost_count_as_answered() -> None:
    """The runtime goes away right after an answer that was passed on, unread: that call is over
    and its post hook runs; a call still open ends UNAVAILABLE (its failure hook runs)."""
    pair = Pair()
    answered = pair.hooked_call()
    still_open = pair.hooked_call()
    pair.core.receive_from_runtime(pair.answer(answered), answers_later=True)
    pair.to_client()
    pair.core.runtime_lost(": connection reset")
    events = pair.core.take_events()
    assert [type(e) for e in events] == [RunPost, RunFailed]
    assert isinstance(events[1], RunFailed) and events[1].code == UNAVAILABLE
    assert pair.measured == [(CREATE, 0), (CREATE, UNAVAILABLE)]
    assert pair.core.closing and not pair.core.answers
    assert still_open not in pair.core.streams


def _frames(data: bytes) -> list[tuple[int, int]]:
    """(type, stream) of each whole frame in `data`."""
    out, at = [], 0
    while at + wire.HEADER_LEN <= len(data):
        size = int.from_bytes(data[at : at + 3], "big")
        out.append((data[at + 3], int.from_bytes(data[at + 5 : at + 9], "big") & wire.MAX_WINDOW))
        at += wire.HEADER_LEN + size
    return out


def test_trailers_then_a_reset_in_one_read_end_the_call_as_the_trailers_say() -> None:
    """A runtime may follow a call's trailers with RST_STREAM (NO_ERROR), as gRPC's C core does
    with a client that has not half-closed: in one read, the answer counts, not the reset (its
    trailers ended the call, even when they are read after the write): the post hook runs, the
    call is measured OK, not CANCELLED."""
    for later in (True, False):
        pair = Pair()
        sid = pair.hooked_call()
        reset = wire.frame(wire.RST_STREAM, 0, sid, (0).to_bytes(4, "big"))
        pair.core.receive_from_runtime(pair.answer(sid) + reset, answers_later=later)
        pair.to_client()
        pair.core.read_answers()
        assert [type(e) for e in pair.core.take_events()] == [RunPost], later
        assert pair.measured == [(CREATE, 0)]
        assert pair.client_statuses() == {sid: b"0"}


def test_calls_above_the_runtimes_goaway_end_unanswered_and_roll_back() -> None:
    """The runtime's GOAWAY names the last stream it took. The client gets the frame as it came, and
    counts the calls above it as refused: the core ends those without a word to the client (their
    failure path runs, UNAVAILABLE), now and when the runtime closes. The call at or below it is
    answered as the runtime answers it."""
    pair = Pair()
    first, second, third = pair.hooked_call(), pair.hooked_call(), pair.hooked_call()
    answer = pair.answer(first)  # sent after its GOAWAY, as a runtime finishing what it took
    pair.core.receive_from_runtime(wire.goaway(first, wire.NO_ERROR) + answer, answers_later=True)
    written = b"".join(bytes(c) for c in pair.core.take_client())
    pair.core.read_answers()
    events = pair.core.take_events()
    assert [(type(e), e.stream) for e in events] == [
        (RunFailed, second),
        (RunFailed, third),
        (RunPost, first),
    ]
    assert all(e.code == UNAVAILABLE for e in events if isinstance(e, RunFailed))
    pair.core.runtime_lost(": connection reset")
    written += b"".join(bytes(c) for c in pair.core.take_client())
    frames = _frames(written)
    assert frames[0] == (wire.GOAWAY, 0)
    assert {sid for _, sid in frames[1:]} == {first}  # nothing on the refused ones, then or later
    assert not pair.core.take_events() and not pair.core.streams
