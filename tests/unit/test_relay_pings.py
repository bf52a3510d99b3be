"""The runtime's PINGs while a slow call (`methods.SLOW`) is open: answered by the core, the ACKs
held until the next write to the runtime (they ride with it), or until they waited PING_WAIT (the
adapter's timer), or too many wait; the client never sees them. During a quick read they pass at
once (the client's ACK goes back with its next call: test_relay_quiet.py). First on a LinkCore
between two `h2` peers, then on real sockets."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest

from cri_proxy.relay import transport
from cri_proxy.relay.core import PINGS_HELD, Limits, LinkCore
from tests.h2raw import request_headers
from tests.unit.relay_support import RawRuntime, bed, run
from tests.unit.test_relay_h2_edges import RawClient, of, status_of

VERSION = "/runtime.v1.RuntimeService/Version"
CREATE = "/runtime.v1.RuntimeService/CreateContainer"  # slow; not hooked here
BODY = struct.pack(">BI", 0, 2) + b"\x0a\x00"


def _peer(client_side: bool) -> h2.connection.H2Connection:
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=client_side, header_encoding=None)
    )
    conn.initiate_connection()
    return conn


class Pair:
    """A client and a runtime (`h2`) through a LinkCore, every byte delivered at once."""

    def __init__(self) -> None:
        self.core = LinkCore(lambda path: None, Limits())
        self.client, self.runtime = _peer(True), _peer(False)
        self.client_events: list[h2.events.Event] = []
        self.runtime_events: list[h2.events.Event] = []
        self.move()

    def move(self, runtime_bytes: bytes | None = None) -> None:
        """Deliver everything queued both ways until nothing moves (`runtime_bytes`: extra, first)."""
        if runtime_bytes:
            self.core.receive_from_runtime(runtime_bytes)
        while True:
            moved = False
            data = self.client.data_to_send()
            if data:
                self.core.receive_from_client(data)
                moved = True
            data = self.runtime.data_to_send()
            if data:
                self.core.receive_from_runtime(data)
                moved = True
            out = b"".join(bytes(c) for c in self.core.take_runtime())
            if out:
                self.runtime_events += self.runtime.receive_data(out)
                moved = True
            out = b"".join(bytes(c) for c in self.core.take_client())
            if out:
                self.client_events += self.client.receive_data(out)
                moved = True
            if not moved:
                return

    def call(self, path: str = CREATE) -> int:
        sid: int = self.client.get_next_available_stream_id()
        self.client.send_headers(sid, request_headers(path))
        self.client.send_data(sid, BODY, end_stream=True)
        self.move()
        return sid

    def answer(self, sid: int, send: bool = True) -> bytes:
        """The runtime's whole answer to `sid`: sent through (`send`) or returned to be sent."""
        self.runtime.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
        self.runtime.send_data(sid, BODY)
        self.runtime.send_headers(sid, [("grpc-status", "0")], end_stream=True)
        if send:
            self.move()
            return b""
        return self.runtime.data_to_send()

    def ping(self, payload: bytes, send: bool = True) -> bytes:
        self.runtime.ping(payload)
        if send:
            self.move()
            return b""
        return self.runtime.data_to_send()

    def client_pings(self) -> list[bytes]:
        return [e.ping_data for e in self.client_events if isinstance(e, h2.events.PingReceived)]

    def runtime_acks(self) -> list[bytes]:
        return [e.ping_data for e in self.runtime_events if isinstance(e, h2.events.PingAckReceived)]


def test_with_no_call_open_a_runtime_ping_goes_to_the_client_at_once() -> None:
    pair = Pair()
    pair.ping(b"idle-001")
    assert pair.client_pings() == [b"idle-001"]
    assert not pair.core.held_pings
    # the client's own ACK goes back with the next write to the runtime (test_relay_quiet.py)
    assert pair.runtime_acks() == [] and pair.core.quiet
    pair.call(VERSION)
    assert pair.runtime_acks() == [b"idle-001"]


def test_a_ping_during_a_quick_read_goes_to_the_client_at_once() -> None:
    pair = Pair()
    pair.call(VERSION)
    pair.ping(b"read-001")
    assert pair.client_pings() == [b"read-001"]
    assert not pair.core.held_pings
    pair.core.release_quiet()  # the adapter's timer: the client's ACK goes
    pair.move()
    assert pair.runtime_acks() == [b"read-001"]


def test_a_ping_during_a_slow_call_is_answered_by_the_core_with_the_next_call() -> None:
    """Passed to the client with the answer, its ACK would come back with the client's next call
    and go to the runtime just ahead of it; written on its own after the answer, the core's ACK
    would wake the runtime once more. It rides with the client's next call instead: no write of
    its own."""
    pair = Pair()
    sid = pair.call()
    pair.ping(b"busy-001")
    assert pair.client_pings() == [] and pair.runtime_acks() == []
    assert pair.core.held_pings == [b"busy-001"]
    pair.answer(sid)
    assert any(isinstance(e, h2.events.StreamEnded) and e.stream_id == sid for e in pair.client_events)
    assert pair.client_pings() == [] and pair.runtime_acks() == []
    assert pair.core.held_pings == [b"busy-001"]
    nxt = pair.client.get_next_available_stream_id()
    pair.client.send_headers(nxt, request_headers(VERSION))
    pair.client.send_data(nxt, BODY, end_stream=True)
    pair.core.receive_from_client(pair.client.data_to_send())
    write = pair.core.take_runtime()  # one write: the call, and the ACK with it
    events = pair.runtime.receive_data(b"".join(bytes(c) for c in write))
    kinds = [type(e) for e in events]
    assert h2.events.RequestReceived in kinds and h2.events.PingAckReceived in kinds
    assert [e.ping_data for e in events if isinstance(e, h2.events.PingAckReceived)] == [b"busy-001"]
    assert not pair.core.held_pings and pair.client_pings() == []


def test_held_pings_are_answered_before_later_ones() -> None:
    """A PING held during the call, then the answer and another PING in one read: the later one
    waits behind the held one, and the core answers both, in the runtime's order, with the next
    write to the runtime."""
    pair = Pair()
    sid = pair.call()
    pair.ping(b"first-01")
    together = pair.answer(sid, send=False) + pair.ping(b"second-2", send=False)
    pair.move(together)
    assert pair.client_pings() == [] and pair.runtime_acks() == []
    pair.call(VERSION)
    assert pair.client_pings() == []
    assert pair.runtime_acks() == [b"first-01", b"second-2"]


def test_a_ping_that_waited_long_enough_is_answered_by_the_core() -> None:
    pair = Pair()
    sid = pair.call()
    pair.ping(b"waited-1")
    pair.core.answer_pings()  # the adapter's timer
    pair.move()
    assert pair.runtime_acks() == [b"waited-1"]
    pair.answer(sid)
    assert pair.client_pings() == []  # answered once, by the core: the client never sees it


def test_too_many_held_pings_are_answered_at_once() -> None:
    pair = Pair()
    pair.call()
    for n in range(PINGS_HELD):
        pair.ping(bytes([n]) * 8)
    assert pair.runtime_acks() == [bytes([n]) * 8 for n in range(PINGS_HELD)]
    assert not pair.core.held_pings and pair.client_pings() == []


def test_acks_and_malformed_pings_from_the_runtime_are_not_held() -> None:
    """The runtime's ACK of a client PING, and a PING on a stream (the client judges it), pass
    through even while a call is open."""
    pair = Pair()
    pair.call()
    pair.client.ping(b"client-1")
    pair.move()
    assert any(isinstance(e, h2.events.PingAckReceived) for e in pair.client_events)
    bad = struct.pack(">I", 8)[1:] + bytes([6, 0]) + struct.pack(">I", 1) + b"stream-1"
    pair.core.receive_from_runtime(bad)
    assert bad in b"".join(bytes(c) for c in pair.core.take_client())
    assert not pair.core.held_pings


def test_counted_in_what_the_link_holds() -> None:
    pair = Pair()
    pair.call()
    before = pair.core.buffered()
    pair.ping(b"counted!")
    assert pair.core.buffered() == before + 17


# -- on real sockets ---------------------------------------------------------------------------------
class SlowRuntime(RawRuntime):
    """A raw HTTP/2 runtime that PINGs on each request it reads (as grpc-go does) and answers only
    when told to."""

    def __init__(self) -> None:
        super().__init__()
        self.conn: h2.connection.H2Connection | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.events: list[h2.events.Event] = []

    def __repr__(self) -> str:
        return f"SlowRuntime(events[-6:]={self.events[-6:]})"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer, self.conn = writer, _peer(False)
        writer.write(self.conn.data_to_send())
        n = 0
        while data := await reader.read(65536):
            for event in self.conn.receive_data(data):
                self.events.append(event)
                if isinstance(event, h2.events.StreamEnded):
                    n += 1
                    self.conn.ping(b"slow-%03d" % n)
            writer.write(self.conn.data_to_send())
            self.changed.set()

    def answer(self, sid: int) -> None:
        assert self.conn is not None and self.writer is not None
        self.conn.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
        self.conn.send_data(sid, BODY)
        self.conn.send_headers(sid, [("grpc-status", "0")], end_stream=True)
        self.writer.write(self.conn.data_to_send())

    async def seen(self, found: Callable[[list[h2.events.Event]], Any], timeout: float = 5.0) -> Any:
        return await self.until(lambda: found(self.events), timeout)


def test_a_call_the_runtime_holds_gets_its_ping_answered_within_ping_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A long call (an image pull): the runtime's PING is answered by the proxy after PING_WAIT,
    not held for the call's length (grpc-go's keepalive would close the connection); the client
    never sees it. A short call's PING is answered by the proxy with the client's next call."""
    monkeypatch.setattr(transport, "PING_WAIT", 0.2)

    async def main() -> None:
        runtime = SlowRuntime()
        async with bed(start_runtime=False) as b, runtime.serving(b):
            client = await RawClient.open(b.proxy_endpoint)
            loop = asyncio.get_running_loop()
            sid = client.request(CREATE, BODY)
            await runtime.seen(of(h2.events.StreamEnded, stream_id=sid))
            pinged = loop.time()
            ack = await runtime.seen(of(h2.events.PingAckReceived))
            assert ack.ping_data == b"slow-001"
            assert loop.time() - pinged >= 0.1  # held first, not answered at once
            assert not any(isinstance(e, h2.events.PingReceived) for e in client.events)
            runtime.answer(sid)
            assert await client.until(status_of(sid)) == "0"
            assert not any(isinstance(e, h2.events.PingReceived) for e in client.events)

            monkeypatch.setattr(transport, "PING_WAIT", 60.0)  # no timer from here on
            again = client.request(CREATE, BODY)
            await runtime.seen(of(h2.events.StreamEnded, stream_id=again))
            runtime.answer(again)
            assert await client.until(status_of(again)) == "0"
            acked = [e for e in runtime.events if isinstance(e, h2.events.PingAckReceived)]
            assert [e.ping_data for e in acked] == [b"slow-001"]  # slow-002 waits for a write
            client.request(VERSION, BODY)  # the next call takes the ACK with it
            await runtime.seen(of(h2.events.PingAckReceived, ping_data=b"slow-002"))
            assert not any(isinstance(e, h2.events.PingReceived) for e in client.events)
            client.close()

    run(main())
