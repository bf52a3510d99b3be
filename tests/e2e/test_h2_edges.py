"""HTTP/2 edge cases, sent with a raw client (the `h2` library) to containerd directly and through the
proxy: the outcome must be the same (status, error code, stream or connection scope).

Each case runs twice, `direct` and `proxy`; what the proxy does differently from containerd today is
marked xfail (strict) naming issue 12, so the case turns red the day the relay gets it right.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import h2.errors
import h2.events
import h2.settings
import pytest
from conftest import ProxyProcess
from containerd import PrivateContainerd

try:
    from tests.h2raw import VERSION, Call, H2Client
except ImportError:  # run as `pytest tests/e2e/...` without the repository on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.h2raw import VERSION, Call, H2Client

pytestmark = pytest.mark.e2e
CREATE = "/runtime.v1.RuntimeService/CreateContainer"


@pytest.fixture(params=["direct", "proxy"])
def target(request: pytest.FixtureRequest, containerd: PrivateContainerd) -> Iterator[Path]:
    """The socket to talk to: containerd's own, or the session proxy's in front of it."""
    if request.param == "direct":
        yield Path(containerd.address.removeprefix("unix://"))
        return
    proxy: ProxyProcess = request.getfixturevalue("proxy")
    assert proxy.proc is not None and proxy.proc.poll() is None, "the session's proxy died"
    yield proxy.socket


def test_settings_acked_and_ping_answered_before_any_request(target: Path) -> None:
    with H2Client(target) as client:
        client.conn.ping(b"edge-001")
        client.flush()
        client.wait_for_event(h2.events.RemoteSettingsChanged)
        client.wait_for_event(h2.events.SettingsAcknowledged)
        ack = client.wait_for_event(h2.events.PingAckReceived)
        assert isinstance(ack, h2.events.PingAckReceived) and ack.ping_data == b"edge-001"
        assert client.goaway is None and not client.closed
        call = client.call(VERSION)
        assert call.grpc_status == 0 and call.data


def test_a_table_size_change_then_calls_at_once(target: Path) -> None:
    """SETTINGS_HEADER_TABLE_SIZE=0 from the client and calls right away: every call answers, no
    COMPRESSION_ERROR (the proxy's decoder takes the new size when the runtime ACKs it)."""
    with H2Client(target, settings={h2.settings.SettingCodes.HEADER_TABLE_SIZE: 0}) as client:
        sids = [client.start_call(VERSION, headers=[("x-n", str(i) * 200)]) for i in range(20)]
        for sid in sids:
            assert client.finish(sid).grpc_status == 0
        assert client.goaway is None


def test_a_header_list_over_sixteen_mebibytes_ends_that_stream_only(target: Path) -> None:
    """A small header block that decodes past 16 MiB: containerd ends that stream; the next call on
    the same connection works (HPACK state kept in step)."""
    with H2Client(target) as client:
        client.wait_for_event(h2.events.SettingsAcknowledged)
        sid = client.start_call(VERSION, headers=[("x-big", "v" * 4000)] * 4300)
        call = client.finish(sid)
        assert call.reset is not None or (call.grpc_status or 0) != 0
        after = client.call(VERSION, headers=[("x-big", "v" * 4000)])
        assert after.grpc_status == 0
        assert client.goaway is None


def test_a_request_over_the_message_limit_is_refused_at_once(target: Path) -> None:
    """The length prefix says 17 MiB and the rest never comes: RESOURCE_EXHAUSTED without waiting."""
    with H2Client(target) as client:
        client.wait_for_event(h2.events.SettingsAcknowledged)
        sid = client.conn.get_next_available_stream_id()
        client.calls[sid] = Call()
        client.conn.send_headers(
            sid,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", CREATE),
                (":authority", "x"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
        )
        client.conn.send_data(sid, (17 << 20).to_bytes(5, "big") + b"\0" * 100)
        client.flush()
        call = client.finish(sid, timeout=5)
        assert call.grpc_status == 8  # RESOURCE_EXHAUSTED


def test_a_client_ignoring_flow_control_is_cut_off(proxy: ProxyProcess) -> None:
    """DATA past the connection window the proxy's client was given: GOAWAY FLOW_CONTROL_ERROR.

    Proxy only: containerd (grpc-go) credits DATA on a finished stream at once, so one byte over
    goes unnoticed there; it cuts off only a client that runs far ahead. The proxy holds the client
    to the window it was given, which no conforming client notices, and so never buffers for it."""
    with H2Client(proxy.socket) as client:
        client.wait_for_event(h2.events.SettingsAcknowledged)
        client.listen(0.2)  # take the server's early WINDOW_UPDATEs
        window = client.conn.outbound_flow_control_window
        sid = client.start_call(VERSION, end=False)
        block = bytearray()
        sent = 0
        while sent <= window:
            piece = min(16384, window + 1 - sent)
            block += piece.to_bytes(3, "big") + b"\x00\x00"  # length, DATA, no flags
            block += sid.to_bytes(4, "big") + b"\0" * piece
            sent += piece
        client.raw(bytes(block))
        assert client.wait_closed(10)
        assert (
            client.goaway is not None and client.goaway.error_code == h2.errors.ErrorCodes.FLOW_CONTROL_ERROR
        )
