"""HTTP/2 edge cases, sent with a raw client to containerd directly and through the proxy: the outcome
must be the same (grpc-status, RST_STREAM or GOAWAY code, stream or connection scope).

Each case runs its scenario against both sockets and compares what a client observes. Where the
proxy differs from containerd today the case is marked xfail (strict) naming issue 12: it documents
the gap, and turns red (an unexpected pass) the day the relay gets it right, so the mark goes too.
Every read has a deadline; no case waits longer than a few seconds for an answer that never comes.
"""

from __future__ import annotations

import gzip
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h2.events
import pytest
from conftest import ProxyProcess
from containerd import PrivateContainerd

from cri_api.v1 import api_pb2

try:
    from tests import h2raw
except ImportError:  # run as `pytest tests/e2e/...` without the repository on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests import h2raw
from hpack.hpack import encode_integer

from tests.processes import rss_bytes, wait_until

pytestmark = pytest.mark.e2e

VERSION = "/runtime.v1.RuntimeService/Version"
UPDATE = "/runtime.v1.RuntimeService/UpdateContainerResources"  # hooked by the proxy
LIMIT = 16 * 1024 * 1024  # both containerd's and the proxy's message limit
MAX_HEADER_LIST_SIZE = 0x6  # SETTINGS_MAX_HEADER_LIST_SIZE


@pytest.fixture(scope="module")
def edges_proxy(containerd: PrivateContainerd) -> Iterator[ProxyProcess]:
    """A proxy of this module's own: a case that upsets it cannot upset the other tests' proxy."""
    # metrics on, as on a node that is scraped: the proxy then decodes the runtime's headers too
    process = ProxyProcess(containerd, "--dry-run", "--metrics-address", "127.0.0.1:0", name="edges").start()
    try:
        yield process
    finally:
        code = process.stop()
        assert code == 0, f"cri-proxy exited {code}: {process.log_path.read_text()[-2000:]}"


@pytest.fixture
def sockets(containerd: PrivateContainerd, edges_proxy: ProxyProcess) -> dict[str, Path]:
    assert edges_proxy.proc is not None and edges_proxy.proc.poll() is None, "the edges proxy died"
    return {"direct": Path(containerd.address.removeprefix("unix://")), "proxy": edges_proxy.socket}


def same(sockets: dict[str, Path], scenario: Callable[[Path], Any]) -> None:
    """Run `scenario` against containerd and through the proxy; what each observed must match."""
    seen = {name: scenario(path) for name, path in sockets.items()}
    assert seen["proxy"] == seen["direct"], f"direct: {seen['direct']}; through the proxy: {seen['proxy']}"


def update_request(size: int) -> bytes:
    """An UpdateContainerResourcesRequest of about `size` bytes, for a container that does not exist."""
    body = api_pb2.UpdateContainerResourcesRequest(container_id="edge-no-such-container")
    base = len(body.SerializeToString())
    body.annotations["edge"] = "x" * max(0, size - base - 16)
    return body.SerializeToString()


def _ended(conn: h2raw.RawH2, sid: int, timeout: float = 10) -> tuple[str, bool]:
    """A stream's outcome and whether the connection lived on."""
    outcome = str(conn.outcome(sid, timeout))
    return outcome, conn.alive()


# -- from the connection's start -----------------------------------------------------------------


@pytest.fixture(params=["direct", "proxy"])
def target(request: pytest.FixtureRequest, sockets: dict[str, Path]) -> Path:
    return sockets[request.param]


def test_settings_acked_and_ping_answered_before_any_request(target: Path) -> None:
    with h2raw.H2Client(target) as client:
        client.conn.ping(b"edge-001")
        client.flush()
        client.wait_for_event(h2.events.RemoteSettingsChanged)
        client.wait_for_event(h2.events.SettingsAcknowledged)
        ack = client.wait_for_event(h2.events.PingAckReceived)
        assert isinstance(ack, h2.events.PingAckReceived) and ack.ping_data == b"edge-001"
        assert client.goaway is None and not client.closed
        call = client.call(VERSION)
        assert call.grpc_status == 0 and call.data


def test_the_proxy_announces_the_header_list_limit_containerd_enforces(sockets: dict[str, Path]) -> None:
    """containerd announces no SETTINGS_MAX_HEADER_LIST_SIZE but enforces grpc-go's 16 MiB; the proxy
    passes containerd's SETTINGS with that limit added, so a client can hold to it by itself."""
    seen = {}
    for name, path in sockets.items():
        with h2raw.RawH2(path) as conn:
            assert conn.wait(lambda: conn.settings_acked > 0 and bool(conn.server_settings), 5)
            seen[name] = dict(conn.server_settings)
    assert MAX_HEADER_LIST_SIZE not in seen["direct"]
    assert seen["proxy"] == {**seen["direct"], MAX_HEADER_LIST_SIZE: 16 << 20}


def test_an_idle_connection_is_not_closed_through_the_proxy(edges_proxy: ProxyProcess) -> None:
    """No request for longer than the old 10 s first-request timeout: no GOAWAY, still usable."""
    with h2raw.H2Client(edges_proxy.socket) as client:
        client.wait_for_event(h2.events.SettingsAcknowledged)
        client.listen(11.0)  # reads all along: whatever the proxy sends is seen
        assert client.goaway is None and not client.closed
        assert client.call(VERSION).grpc_status == 0


# -- header blocks -------------------------------------------------------------------------------


def test_header_table_size_zero_then_header_heavy_requests(sockets: dict[str, Path]) -> None:
    heavy = [(f"x-edge-{i}", f"value-{i}-" + "v" * 40) for i in range(30)]

    def scenario(path: Path) -> Any:
        with h2raw.RawH2(path) as conn:
            first = [conn.call(VERSION, b"", heavy) for _ in range(3)]
            before = [str(conn.outcome(sid)) for sid in first]
            # many requests, then the new setting while their answers are on the way
            after = []
            batch = []
            for _ in range(100):
                sid = conn.new_stream()
                after.append(sid)
                block = conn.header_block(h2raw.request_headers(VERSION, heavy))
                batch.append(h2raw.frame(h2raw.HEADERS, h2raw.END_HEADERS, sid, block))
                batch.append(h2raw.frame(h2raw.DATA, h2raw.END_STREAM, sid, h2raw.grpc_message(b"")))
            conn.send(b"".join(batch))
            conn.send(h2raw.settings_frame({h2raw.HEADER_TABLE_SIZE: 0}))
            again = [conn.call(VERSION, b"", heavy) for _ in range(10)]
            outcomes = {str(conn.outcome(sid)) for sid in after + again}
            return before, outcomes, conn.alive()

    def rounds(path: Path) -> Any:
        """The crossing is a race: eight connections, the first that goes wrong is the outcome."""
        first = scenario(path)
        for _ in range(7):
            seen = scenario(path)
            if seen != first:
                return seen
        return first

    same(sockets, rounds)


def test_one_megabyte_header_block(sockets: dict[str, Path]) -> None:
    name, value = b"x-edge-big", b"a" * (1 << 20)  # a literal without indexing, not Huffman-coded
    big = b"\x00" + encode_integer(len(name), 7) + name + encode_integer(len(value), 7) + value

    def scenario(path: Path) -> Any:
        with h2raw.RawH2(path) as conn:
            sid = conn.new_stream()
            block = conn.header_block(h2raw.request_headers(VERSION)) + big  # `big` leaves no table entry
            first, rest = block[:16384], block[16384:]
            out = [h2raw.frame(h2raw.HEADERS, 0, sid, first)]
            while rest:
                chunk, rest = rest[:16384], rest[16384:]
                out.append(h2raw.frame(h2raw.CONTINUATION, 0 if rest else h2raw.END_HEADERS, sid, chunk))
            conn.send(b"".join(out))
            conn.send_data(sid, h2raw.grpc_message(b""))
            return _ended(conn, sid, 30)

    same(sockets, scenario)


def test_small_block_that_expands_huge(sockets: dict[str, Path]) -> None:
    value = b"b" * 4000
    name = b"x-edge-bomb"
    insert = b"\x40" + encode_integer(len(name), 7) + name + encode_integer(len(value), 7) + value
    count = (1 << 30) // (len(name) + len(value) + 32) + 1000  # each index byte: one more copy

    def scenario(path: Path) -> Any:
        with h2raw.RawH2(path) as conn:
            sid = conn.new_stream()
            block = conn.header_block(h2raw.request_headers(VERSION)) + insert + b"\xbe" * count
            first, rest = block[:16384], block[16384:]
            out = [h2raw.frame(h2raw.HEADERS, h2raw.END_STREAM, sid, first)]
            while rest:
                chunk, rest = rest[:16384], rest[16384:]
                out.append(h2raw.frame(h2raw.CONTINUATION, 0 if rest else h2raw.END_HEADERS, sid, chunk))
            conn.send(b"".join(out))
            return _ended(conn, sid, 20)

    same(sockets, scenario)


def _literal(name: bytes, value: bytes, index: bool = False, huffman: bool = False) -> bytes:
    """A literal field with a new name; the value Huffman-coded when asked (only for 8-byte runs of 'a')."""
    if huffman:
        coded = b"\x18\xc6\x31\x8c\x63" * (len(value) // 8)  # eight 'a's: 40 bits of code '00011'
        string = bytearray(encode_integer(len(coded), 7))
        string[0] |= 0x80
        encoded = bytes(string) + coded
    else:
        encoded = bytes(encode_integer(len(value), 7)) + value
    return (b"\x40" if index else b"\x00") + bytes(encode_integer(len(name), 7)) + name + encoded


BIG_BLOCKS = {  # ~1.9 MB of fields each: under the proxy's 2 MiB block cap, a list containerd takes
    "many-small": _literal(b"x-f", b"v" * 8) * 140_000,
    "huffman": _literal(b"x-huff", b"a" * 3_000_000, huffman=True),
    "incremental": b"".join(_literal(b"x-inc-%d" % (i % 4), b"i" * 4000, index=True) for i in range(470)),
}


@pytest.mark.parametrize("kind", sorted(BIG_BLOCKS))
def test_biggest_header_blocks_then_the_table_still_agrees(sockets: dict[str, Path], kind: str) -> None:
    """A block near the cap (decoded over many loop turns by the proxy), then calls on the same
    connection whose headers use the dynamic table: answered alike, the connection lives on."""

    def scenario(path: Path) -> Any:
        with h2raw.RawH2(path) as conn:
            sid = conn.new_stream()
            block = conn.header_block(h2raw.request_headers(VERSION)) + BIG_BLOCKS[kind]
            first, rest = block[:16384], block[16384:]
            out = [h2raw.frame(h2raw.HEADERS, 0, sid, first)]
            while rest:
                chunk, rest = rest[:16384], rest[16384:]
                out.append(h2raw.frame(h2raw.CONTINUATION, 0 if rest else h2raw.END_HEADERS, sid, chunk))
            conn.send(b"".join(out))
            if kind == "incremental":  # the client's encoder must know what the server's table holds
                for i in range(470):
                    conn.enc.header_table.add(b"x-inc-%d" % (i % 4), b"i" * 4000)
            conn.send_data(sid, h2raw.grpc_message(b""))
            big = str(conn.outcome(sid, 30))
            after = [str(conn.outcome(conn.call(VERSION, b"", [("x-after", "1")]), 10)) for _ in range(3)]
            return big, after, conn.alive()

    same(sockets, scenario)


def test_expanding_block_ends_its_stream_only(sockets: dict[str, Path]) -> None:
    """A small block that expands past 16 MiB via the dynamic table: that stream is reset, and the
    next calls on the connection (their headers referring to the table) are answered."""
    value, name = b"e" * 4000, b"x-edge-expand"
    insert = _literal(name, value, index=True)
    count = (17 << 20) // (len(name) + len(value) + 32)

    def scenario(path: Path) -> Any:
        with h2raw.RawH2(path) as conn:
            sid = conn.new_stream()
            block = conn.header_block(h2raw.request_headers(VERSION)) + insert + b"\xbe" * count
            conn.send(h2raw.frame(h2raw.HEADERS, h2raw.END_HEADERS, sid, block))
            conn.enc.header_table.add(name, value)  # what the server's table now holds
            conn.send_data(sid, h2raw.grpc_message(b""))
            expanded = str(conn.outcome(sid, 20))
            after = [str(conn.outcome(conn.call(VERSION, b"", [("x-after", "1")]), 10)) for _ in range(3)]
            return expanded, after, conn.alive()

    same(sockets, scenario)


def test_endless_continuation(sockets: dict[str, Path]) -> None:
    """HEADERS without END_HEADERS, then CONTINUATION frames that never end it (up to 64 MiB)."""
    filler = b"\x00" + encode_integer(7, 7) + b"x-edge-" + encode_integer(16000, 7) + b"c" * 16000

    def scenario(path: Path) -> Any:
        with h2raw.RawH2(path) as conn:
            sid = conn.new_stream()
            conn.send(h2raw.frame(h2raw.HEADERS, 0, sid, conn.header_block(h2raw.request_headers(VERSION))))
            piece = h2raw.frame(h2raw.CONTINUATION, 0, sid, filler) * 64  # 1 MiB
            stalled = False
            for _ in range(64):
                if conn.goaway is not None or conn.closed:
                    break
                conn.sock.settimeout(5)
                try:
                    conn.sock.sendall(piece)
                except TimeoutError:
                    stalled = True  # the server stopped reading
                    break
                except OSError:
                    break  # closed under us
                conn.read(h2raw.time.monotonic() + 0.01)
            conn.wait(lambda: conn.goaway is not None, 5)
            ended = "goaway" if conn.goaway is not None else "closed" if conn.closed else "open"
            return ended, conn.goaway, stalled

    same(sockets, scenario)


# -- DATA and flow control -----------------------------------------------------------------------


def test_flood_ignoring_flow_control_without_reading(sockets: dict[str, Path]) -> None:
    """14 MiB past every window, nothing read meanwhile: the connection lives on and answers a call.

    (The proxy's memory under such a client is the issue-12 gap; it is measured in bench/, not here.)
    """

    def scenario(path: Path) -> Any:
        with h2raw.RawH2(path) as conn:
            conn.wait(lambda: conn.settings_acked > 0, 5)
            sid = conn.new_stream()
            conn.headers(sid, h2raw.request_headers(VERSION))
            # one message announced at 15 MiB, its bytes sent with no regard for the windows
            head = h2raw.frame(
                h2raw.DATA, 0, sid, h2raw.grpc_message(b"")[:1] + (15 << 20).to_bytes(4, "big")
            )
            conn.send(head)
            piece = h2raw.frame(h2raw.DATA, 0, sid, bytes(16384)) * 64  # 1 MiB
            for _ in range(14):
                conn.sock.settimeout(3)
                try:
                    conn.sock.sendall(piece)
                except (TimeoutError, OSError):
                    break  # cut off, or no longer read
            conn.auto_window = True
            alive = conn.alive(10)
            answer = str(conn.outcome(conn.call(VERSION, b""), 10)) if alive else "none"
            return {"alive": alive, "a new call": answer}

    same(sockets, scenario)


def test_the_proxy_gives_back_what_a_client_that_never_reads_cost(containerd: PrivateContainerd) -> None:
    """Such a client has the proxy hold ~10-17 MiB for 60,000 calls (their streams, answers it does
    not read). Once it has gone, the RSS comes back near where it was: the heap is trimmed (logged).
    What stays is the interpreter's arenas that a few live objects pin (`relay/heap.py`): 0.5-1.9 MiB
    on an idle machine, up to 9 MiB under CPU load (other tests beside it); without the trim 5.0-6.9
    MiB stay on an idle machine. A proxy of its own without metrics, and a fixed count of calls, not
    a time: what stays grows with both."""
    proxy = ProxyProcess(containerd, "--dry-run", name="heap").start()
    try:
        assert proxy.proc is not None
        pid = proxy.proc.pid
        h2raw.never_reading_client(proxy.socket, 0.5)  # the one-off growth of a first such client
        time.sleep(1.5)
        baseline = rss_bytes(pid)
        logged = len(proxy.log_path.read_text())
        calls = h2raw.never_reading_client(proxy.socket, 10.0, 60000)
        assert calls > 20000, calls
        grown = rss_bytes(pid) - baseline
        trims: list[tuple[float, float]] = []

        def given_back() -> bool:
            trims[:] = [
                (float(m[1]), float(m[2]))
                for m in re.finditer(
                    r"heap trimmed: RSS ([0-9.]+) -> ([0-9.]+) MiB", proxy.log_path.read_text()[logged:]
                )
            ]
            return bool(trims) and rss_bytes(pid) - baseline < 10 * 2**20

        wait_until(  # a trim waits 1 s after a close, 10 s after the last trim
            given_back,
            timeout=15,
            what=f"a heap trim and the RSS back within 10 MiB of {baseline / 2**20:.1f} MiB"
            f" after {calls} calls (it had grown {grown / 2**20:.1f} MiB)",
        )
        before, after = trims[0]
        # what it gives back follows what the client cost: less when the machine was too busy for it
        # to make many calls (seen in CI beside the unit tests: 63.5 -> 62.0 MiB)
        wanted = min(2.0, grown / 2**20 / 3)
        assert before - after > wanted, (
            f"the trim gave back little: {before} -> {after} MiB, after {calls} calls that grew the"
            f" proxy {grown / 2**20:.1f} MiB"
        )
    finally:
        assert proxy.stop() == 0, proxy.log_path.read_text()[-2000:]


def test_padded_request_just_under_the_limit_to_a_hooked_method(sockets: dict[str, Path]) -> None:
    message = update_request(LIMIT - 65536)

    def scenario(path: Path) -> Any:
        with h2raw.RawH2(path) as conn:
            return _ended(conn, conn.call(UPDATE, message, pad=255), 60)

    same(sockets, scenario)


def test_over_limit_request_to_a_hooked_method(sockets: dict[str, Path]) -> None:
    message = update_request(LIMIT + 65536)

    def scenario(path: Path) -> Any:
        with h2raw.RawH2(path) as conn:
            return _ended(conn, conn.call(UPDATE, message), 60)

    same(sockets, scenario)


def test_hooked_request_with_client_trailers(sockets: dict[str, Path]) -> None:
    """Trailers from the client end the request: an answer comes (containerd itself answers either
    NOT_FOUND or RST_STREAM PROTOCOL_ERROR, by a race of its own), never a hang."""

    def scenario(path: Path) -> Any:
        with h2raw.RawH2(path) as conn:
            sid = conn.new_stream()
            conn.headers(sid, h2raw.request_headers(UPDATE))
            conn.send_data(sid, h2raw.grpc_message(update_request(100)), end_stream=False)
            conn.headers(sid, [("x-edge-trailer", "1")], end_stream=True)
            outcome, alive = _ended(conn, sid, 5)
            return outcome in ("status 5", "reset 1"), alive

    same(sockets, scenario)


def test_gzip_request_to_a_hooked_method(sockets: dict[str, Path]) -> None:
    body = gzip.compress(update_request(200))

    def scenario(path: Path) -> Any:
        with h2raw.RawH2(path) as conn:
            sid = conn.new_stream()
            conn.headers(sid, h2raw.request_headers(UPDATE, [("grpc-encoding", "gzip")]))
            conn.send_data(sid, bytes([1]) + len(body).to_bytes(4, "big") + body)
            return _ended(conn, sid)

    same(sockets, scenario)


# -- frames a client may send --------------------------------------------------------------------


def test_unknown_frame_types_are_ignored(sockets: dict[str, Path]) -> None:
    def scenario(path: Path) -> Any:
        with h2raw.RawH2(path) as conn:
            conn.send(h2raw.frame(0xFA, 0xFF, 0, b"on the connection"))
            sid = conn.new_stream()
            conn.headers(sid, h2raw.request_headers(VERSION))
            conn.send(h2raw.frame(0xFB, 0, sid, b"on an open stream"))
            conn.send_data(sid, h2raw.grpc_message(b""))
            return _ended(conn, sid)

    same(sockets, scenario)


@pytest.mark.parametrize("path", [VERSION, UPDATE], ids=["plain", "hooked"])
def test_rst_stream_mid_request(sockets: dict[str, Path], path: str) -> None:
    def scenario(target: Path) -> Any:
        with h2raw.RawH2(target) as conn:
            sid = conn.new_stream()
            conn.headers(sid, h2raw.request_headers(path))
            conn.send_data(sid, h2raw.grpc_message(update_request(100))[:20], end_stream=False)
            conn.send(h2raw.frame(h2raw.RST_STREAM, 0, sid, (8).to_bytes(4, "big")))  # CANCEL
            nxt = conn.call(VERSION, b"")
            return str(conn.outcome(nxt)), conn.streams[sid].ended, conn.alive()

    same(sockets, scenario)


# -- protocol errors: the code, and whether the connection or only the stream ends ---------------

_W = h2raw.WINDOW_UPDATE
BAD_FRAMES: dict[str, Callable[[int], bytes]] = {
    # `sid` is a stream the client has open (its HEADERS sent, no END_STREAM)
    "window update of 0 on the connection": lambda sid: h2raw.frame(_W, 0, 0, bytes(4)),
    "window update of 0 on a stream": lambda sid: h2raw.frame(_W, 0, sid, bytes(4)),
    "window overflow on the connection": lambda sid: (
        h2raw.frame(_W, 0, 0, (0x7FFFFFFF).to_bytes(4, "big")) * 2
    ),
    "DATA on stream 0": lambda sid: h2raw.frame(h2raw.DATA, 0, 0, b"x"),
    "HEADERS on an even stream": lambda sid: h2raw.frame(h2raw.HEADERS, h2raw.END_HEADERS, 2, b"\x82"),
    "PING of 7 bytes": lambda sid: h2raw.frame(h2raw.PING, 0, 0, bytes(7)),
    "SETTINGS on a stream": lambda sid: h2raw.frame(h2raw.SETTINGS, 0, sid, b""),
    "SETTINGS initial window too large": lambda sid: h2raw.settings_frame(
        {h2raw.INITIAL_WINDOW_SIZE: 0x80000000}
    ),
    "RST_STREAM on an idle stream": lambda sid: h2raw.frame(h2raw.RST_STREAM, 0, sid + 100, bytes(4)),
    "CONTINUATION without HEADERS": lambda sid: h2raw.frame(h2raw.CONTINUATION, h2raw.END_HEADERS, sid, b""),
    "DATA padding longer than the frame": lambda sid: h2raw.frame(h2raw.DATA, h2raw.PADDED, sid, b"\x09abc"),
    "a stream depending on itself": lambda sid: h2raw.frame(2, 0, sid, sid.to_bytes(4, "big") + b"\x10"),
}


# containerd closes some of these without a GOAWAY: so does the proxy (it passes them to the
# runtime, which judges them, and closes the client's side as the runtime closed its own)


@pytest.mark.parametrize(
    "bad",
    [pytest.param(name, id=name) for name in BAD_FRAMES],
)
def test_protocol_errors_end_what_containerd_ends(sockets: dict[str, Path], bad: str) -> None:
    def scenario(path: Path) -> Any:
        with h2raw.RawH2(path) as conn:
            conn.wait(lambda: conn.settings_acked > 0, 5)
            sid = conn.new_stream()
            conn.headers(sid, h2raw.request_headers(VERSION))
            conn.send(BAD_FRAMES[bad](sid))
            conn.wait(lambda: conn.goaway is not None or conn.streams[sid].reset is not None, 3)
            seen = {"goaway": conn.goaway, "stream reset": conn.streams[sid].reset, "alive": conn.alive(3)}
            return {**seen, "closed": conn.closed}

    same(sockets, scenario)


@pytest.mark.parametrize(
    "opening",
    [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n", b"\x00" * 24],
    ids=["http/1.1", "bad preface", "zeros"],
)
def test_not_http2_is_answered_as_containerd_answers_it(sockets: dict[str, Path], opening: bytes) -> None:
    def scenario(path: Path) -> Any:
        with socket.socket(socket.AF_UNIX) as raw:
            raw.connect(str(path))
            raw.sendall(opening)
            got, deadline = b"", time.monotonic() + 5
            while time.monotonic() < deadline:
                raw.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    chunk = raw.recv(65536)
                except TimeoutError:
                    return got, "open"
                except OSError:
                    return got, "ended"  # reset: close and reset are one to a client here
                if not chunk:
                    return got, "ended"
                got += chunk
            return got, "open"

    same(sockets, scenario)
