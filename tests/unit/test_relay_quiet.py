"""The client's quiet reads: ACKs of the runtime's PINGs, and connection WINDOW_UPDATEs while no
call is open, wait for the next write to the runtime (they ride with it), or until the adapter's
timer (QUIET_WAIT), or until too many wait. Whatever else, or anything malformed, goes as it came.
First on a LinkCore between two `h2` peers, then on real sockets."""

from __future__ import annotations

import asyncio

import h2.events
import pytest

from cri_proxy.relay import transport, wire
from cri_proxy.relay.core import QUIET_CREDIT, QUIET_HELD
from tests.h2raw import request_headers
from tests.unit.relay_support import RawRuntime, bed, run
from tests.unit.test_relay_h2_edges import RawClient, of, status_of
from tests.unit.test_relay_pings import BODY, VERSION, Pair, _peer


def _ack(payload: bytes) -> bytes:
    return wire.frame(wire.PING, wire.ACK, 0, payload)


def _written(pair: Pair) -> bytes:
    return b"".join(bytes(c) for c in pair.core.take_runtime())


def test_an_ack_rides_with_the_next_call_before_it() -> None:
    pair = Pair()
    pair.ping(b"quiet-01")
    assert pair.client_pings() == [b"quiet-01"] and pair.runtime_acks() == []
    sid = pair.client.get_next_available_stream_id()
    pair.client.send_headers(sid, request_headers(VERSION))
    pair.client.send_data(sid, BODY, end_stream=True)
    pair.core.receive_from_client(pair.client.data_to_send())
    write = _written(pair)  # one write: the ACK, then the call
    events = pair.runtime.receive_data(write)
    kinds = [type(e) for e in events]
    assert kinds.index(h2.events.PingAckReceived) < kinds.index(h2.events.RequestReceived)
    assert not pair.core.quiet


def test_the_timer_lets_them_go_in_their_order() -> None:
    pair = Pair()
    for n in range(3):
        pair.ping(b"timer-%02d" % n)
    assert pair.runtime_acks() == [] and len(pair.core.quiet) == 3
    pair.core.release_quiet()
    pair.move()
    assert pair.runtime_acks() == [b"timer-%02d" % n for n in range(3)]
    assert not pair.core.quiet


def test_too_many_go_at_once() -> None:
    pair = Pair()
    for n in range(QUIET_HELD + 1):
        pair.ping(bytes([n]) * 8)
    # QUIET_HELD reads wait; the next one finds the queue full and goes, the waiting ones first
    assert pair.runtime_acks() == [bytes([n]) * 8 for n in range(QUIET_HELD + 1)]
    assert not pair.core.quiet


def test_connection_credit_waits_only_while_no_call_is_open() -> None:
    pair = Pair()
    credit = wire.window_update(0, 1000)
    pair.core.receive_from_client(credit)
    assert _written(pair) == b"" and pair.core.quiet == [credit]
    pair.core.release_quiet()
    assert _written(pair) == credit
    sid = pair.call(VERSION)  # open: the runtime may be waiting for this credit to answer it
    pair.core.receive_from_client(credit)
    assert _written(pair) == credit and not pair.core.quiet
    pair.answer(sid)
    pair.core.receive_from_client(credit)  # the call ended: nothing waits for it again
    assert _written(pair) == b""


@pytest.mark.parametrize(
    "frame",
    [
        wire.frame(wire.PING, 0, 0, b"notanack"),  # a PING of the client's: the runtime answers it
        wire.frame(wire.PING, wire.ACK, 1, b"onstream"),  # on a stream: the runtime judges it
        wire.frame(wire.PING, wire.ACK, 0, b"short"),  # the wrong length
        wire.window_update(0, 0),  # no increment: a PROTOCOL_ERROR the runtime answers at once
        wire.window_update(0, QUIET_CREDIT),  # toward an overflow: a FLOW_CONTROL_ERROR as well
        wire.window_update(1, 1000),  # a stream's
        wire.frame(wire.WINDOW_UPDATE, 0, 0, b"\x00\x00\x01\x00\x00"),  # malformed
        wire.frame(wire.SETTINGS, wire.ACK, 0, b""),  # another frame
    ],
    ids=[
        "ping",
        "ack-on-stream",
        "short-ack",
        "zero-credit",
        "huge-credit",
        "stream-credit",
        "long-credit",
        "settings-ack",
    ],
)
def test_anything_else_goes_as_it_came(frame: bytes) -> None:
    pair = Pair()
    pair.core.receive_from_client(frame)
    assert _written(pair) == frame and not pair.core.quiet


def test_a_quiet_read_behind_bytes_of_a_frame_goes_with_them() -> None:
    pair = Pair()
    ack = _ack(b"split-01")
    pair.core.receive_from_client(ack[:5])
    pair.core.receive_from_client(ack[5:])
    assert _written(pair) == ack and not pair.core.quiet
    pair.core.receive_from_client(ack + wire.frame(wire.SETTINGS, wire.ACK, 0, b""))
    assert _written(pair).startswith(ack) and not pair.core.quiet


def test_counted_in_what_the_link_holds() -> None:
    pair = Pair()
    before = pair.core.buffered()
    pair.core.receive_from_client(_ack(b"counted!"))
    assert pair.core.buffered() == before + 17


# -- on real sockets ---------------------------------------------------------------------------------
class PingingRuntime(RawRuntime):
    """A raw HTTP/2 runtime that PINGs on each request it reads (as grpc-go does) and answers it at
    once; keeps what each of its reads held."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[float, list[h2.events.Event]]] = []

    def __repr__(self) -> str:
        return f"PingingRuntime(reads[-4:]={self.reads[-4:]})"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _peer(False)
        writer.write(conn.data_to_send())
        loop = asyncio.get_running_loop()
        n = 0
        while data := await reader.read(65536):
            events = conn.receive_data(data)
            self.reads.append((loop.time(), events))
            for event in events:
                if isinstance(event, h2.events.StreamEnded):
                    n += 1
                    conn.ping(b"quick%03d" % n)
                    sid = event.stream_id
                    conn.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
                    conn.send_data(sid, BODY)
                    conn.send_headers(sid, [("grpc-status", "0")], end_stream=True)
            writer.write(conn.data_to_send())
            self.changed.set()

    def read_with_ack(self, payload: bytes) -> tuple[float, list[h2.events.Event]] | None:
        for read in self.reads:
            if any(isinstance(e, h2.events.PingAckReceived) and e.ping_data == payload for e in read[1]):
                return read
        return None


def test_the_clients_ack_reaches_the_runtime_with_its_next_call_or_after_quiet_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transport, "QUIET_WAIT", 0.3)

    async def main() -> None:
        runtime = PingingRuntime()
        async with bed(start_runtime=False) as b, runtime.serving(b):
            client = await RawClient.open(b.proxy_endpoint)
            loop = asyncio.get_running_loop()
            # the first call's ACK goes with the client's SETTINGS ACK, at once
            sid = client.request(VERSION, BODY)
            assert await client.until(status_of(sid)) == "0"
            await runtime.until(lambda: runtime.read_with_ack(b"quick001"))
            # an ACK on its own, with no call after it, waits for the timer
            sid = client.request(VERSION, BODY)
            assert await client.until(status_of(sid)) == "0"
            await client.until(of(h2.events.PingReceived, ping_data=b"quick002"))
            acked = loop.time()  # the client wrote its ACK as it read the PING
            at, _ = await runtime.until(lambda: runtime.read_with_ack(b"quick002"))
            assert at - acked >= 0.2
            # ... and rides with the next call when one comes: one read, the ACK first
            sid = client.request(VERSION, BODY)
            assert await client.until(status_of(sid)) == "0"
            await client.until(of(h2.events.PingReceived, ping_data=b"quick003"))
            then = loop.time()
            fourth = client.request(VERSION, BODY)
            at, events = await runtime.until(lambda: runtime.read_with_ack(b"quick003"))
            assert at - then < 0.2
            kinds = [type(e) for e in events]
            assert kinds.index(h2.events.PingAckReceived) < kinds.index(h2.events.RequestReceived)
            assert any(isinstance(e, h2.events.RequestReceived) and e.stream_id == fourth for e in events)
            assert await client.until(status_of(fourth)) == "0"
            client.close()

    run(main())
