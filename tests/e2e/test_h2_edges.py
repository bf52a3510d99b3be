"""HTTP/2 edge cases, sent with a raw client (the `h2` library) to containerd directly and through the
proxy: the outcome must be the same (status, error code, stream or connection scope).

Each case runs twice, `direct` and `proxy`; what the proxy does differently from containerd today is
marked xfail (strict) naming issue 12, so the case turns red the day the relay gets it right.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import h2.events
import pytest
from conftest import ProxyProcess
from containerd import PrivateContainerd

try:
    from tests.h2raw import VERSION, H2Client
except ImportError:  # run as `pytest tests/e2e/...` without the repository on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.h2raw import VERSION, H2Client

pytestmark = pytest.mark.e2e


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
