"""Credit for a hooked request's stream: the relay holds the client's DATA and credits the client
for it itself (`LinkCore._hold`); the runtime's WINDOW_UPDATEs for that stream answer the DATA the
relay sent on, so they stay with the relay. The client is credited once for each byte it sent."""

from __future__ import annotations

import struct

import h2.events

from cri_proxy.relay import wire
from cri_proxy.relay.core import PreDone, RunPre
from tests.h2raw import request_headers
from tests.unit.test_relay_answers import CREATE, Pair


def test_the_client_is_credited_once_for_a_held_request() -> None:
    p = Pair()
    sid = p.client.get_next_available_stream_id()
    p.client.send_headers(sid, request_headers(CREATE))
    size = 60_000  # over a quarter of the stream's window: the runtime credits the stream back
    body = struct.pack(">BI", 0, size) + b"x" * size
    for at in range(0, len(body), 16_384):
        p.client.send_data(sid, body[at : at + 16_384], end_stream=at + 16_384 >= len(body))
    p.move()
    assert [type(e) for e in p.core.take_events()] == [RunPre]
    p.core.hook_finished(sid, PreDone(None, None))  # sent on unchanged
    events = p.runtime.receive_data(b"".join(bytes(c) for c in p.core.take_runtime()))
    got = sum(e.flow_controlled_length for e in events if isinstance(e, h2.events.DataReceived))
    assert got == len(body)
    p.runtime.acknowledge_received_data(got, sid)
    credit = p.runtime.data_to_send()  # the runtime's WINDOW_UPDATEs, the stream's among them
    updated, at = [], 0
    while at < len(credit):
        length, ftype = int.from_bytes(credit[at : at + 3], "big"), credit[at + 3]
        if ftype == wire.WINDOW_UPDATE:
            updated.append(int.from_bytes(credit[at + 5 : at + 9], "big") & 0x7FFFFFFF)
        at += wire.HEADER_LEN + length
    assert sid in updated
    p.core.receive_from_runtime(credit)
    p.move()
    credited = sum(
        e.delta for e in p.client_events if isinstance(e, h2.events.WindowUpdated) and e.stream_id == sid
    )
    assert 0 < credited <= len(body)  # its own DATA's worth, not twice that
