"""Property tests of the link core: a real HTTP/2 client and server (the `h2` library) talk through
a LinkCore, their bytes cut at random places and interleaved at random, requests hooked or not,
hooks ending at random moments. Invariants: no exception escapes the core and neither peer ever
sees a protocol error (so flow control and header blocks stay valid); each peer gets, in order,
every byte it is owed (a runtime PING only after every frame the runtime sent before it); the
HPACK tables of each pair stay equal; every call is measured with the path its client sent and the
status its runtime sent; held bytes stay within bound."""

from __future__ import annotations

import struct
from collections import Counter, deque

import h2.config
import h2.connection
import h2.events
import h2.settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cri_api.v1 import api_pb2 as v1
from cri_proxy.relay import wire
from cri_proxy.relay.core import OK, CancelPre, Limits, LinkCore, PreDone, Readied, RunPre
from cri_proxy.relay.hooks import Hooks, Ready

VERSION = "/runtime.v1.RuntimeService/Version"
CREATE = "/runtime.v1.RuntimeService/CreateContainer"
LIMITS = Limits(message=4096, buffer=24 * 1024, header_list=8192, header_block=4096)


async def _pre(request, info):  # type: ignore[no-untyped-def]  # never run: the test ends hooks itself
    return request


PATCH = b"\x12\x03\x7a\x01\x00"  # what a ready hook appends (any bytes: the core does not read them)


def _ready(message, info):  # type: ignore[no-untyped-def]
    """Ready for some requests (by their length), as a hook that read its decision ahead is."""
    return Ready(PATCH, lambda sent: None) if len(message) % 2 == 0 else None


HOOKS = Hooks(pre=_pre, ready=_ready)


_GOOD_BLOCK = b"".join(
    wire.literal_new_name(n, v)
    for n, v in (
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", CREATE.encode()),
        (b":authority", b"x"),
    )
)


def status(sid: int) -> str:
    """The runtime's grpc-status for a stream: often 0 (the same block again), else one of its own."""
    return "0" if sid % 3 else str(100 + sid)


def framed(body: bytes) -> bytes:
    return struct.pack(">BI", 0, len(body)) + body


class Link(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.observed: list[tuple[str, int]] = []  # (path, code) of each call the core measured
        self.core = LinkCore(
            lambda path: HOOKS if path == CREATE else None,
            LIMITS,
            observer=lambda path, code, total, upstream: self.observed.append((path, code)),
        )
        cfg = dict(header_encoding=None, validate_inbound_headers=False)
        self.client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, **cfg))
        self.server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, **cfg))
        self.client.initiate_connection()
        self.server.initiate_connection()
        # bytes on the way: client -> core, core -> runtime, runtime -> core, core -> client
        self.c2p: deque[bytes] = deque([self.client.data_to_send()])
        self.r2p: deque[bytes] = deque([self.server.data_to_send()])
        self.p2r: deque[bytes] = deque()
        self.p2c: deque[bytes] = deque()
        self.sent: dict[int, bytes] = {}  # client: request body per stream (as it went out)
        self.unsent: dict[int, tuple[bytes, bool]] = {}  # client: body still to send, trailers?
        self.hooked: set[int] = set()
        self.expect_body: dict[int, bytes] = {}  # what the runtime must receive per stream
        self.refused: set[int] = set()
        self.got: dict[int, bytearray] = {}  # runtime: request bytes per stream
        self.ended: set[int] = set()  # runtime: requests it saw end
        self.reset_at_runtime: set[int] = set()
        self.responses: dict[int, bytes] = {}  # runtime: response body sent
        self.r_unsent: dict[int, bytes] = {}
        self.answered: dict[int, bytearray] = {}  # client: response bytes per stream
        self.statuses: dict[int, bytes] = {}
        self.pres: list[int] = []  # pre hooks asked for, not yet ended
        self.runtime_pinged: list[bytes] = []  # the runtime's PING payloads, in order
        self.runtime_acked: list[bytes] = []  # ... the ACKs it got back
        self.client_pinged: list[bytes] = []  # ... the PINGs the client got
        # per PING payload, in order: what the runtime had sent before it (stream -> (response
        # bytes, trailers too)); the client must have all of it when that PING reaches it
        self.ping_marks: dict[bytes, deque[dict[int, tuple[int, bool]]]] = {}
        self.r_done: set[int] = set()  # runtime: streams whose trailers it sent
        # SETTINGS not yet acknowledged (h2 mishandles a table size change while another is pending,
        # even between two h2 peers directly: one at a time)
        self.client_settings_pending = 1
        self.runtime_settings_pending = 1

    # -- moving bytes -------------------------------------------------------------------------------
    def _pump_out(self) -> None:
        data = self.client.data_to_send()
        if data:
            self.c2p.append(data)
        data = self.server.data_to_send()
        at = 0
        while at < len(data):  # a frame a chunk, so that reads may end where frames do
            end = at + wire.HEADER_LEN + wire.read_head(data, at)[0]
            self.r2p.append(data[at:end])
            at = end
        wrote = self.core.take_runtime()
        # the runtime's PINGs held for slow calls get their ACKs with any write that goes to it
        assert not (wrote and self.core.held_pings), "a write to the runtime left held PINGs behind"
        assert not (wrote and self.core.quiet), "a write to the runtime left the client's quiet reads behind"
        for chunk in wrote:
            self.p2r.append(bytes(chunk))
        for chunk in self.core.take_client():
            self.p2c.append(bytes(chunk))
        for event in self.core.take_events():
            if isinstance(event, RunPre):
                self.pres.append(event.stream)
            elif isinstance(event, Readied):  # sent with its patch, no pre hook to wait for
                self.expect_body[event.stream] = framed(event.request)
            elif isinstance(event, CancelPre) and event.stream in self.pres:
                self.pres.remove(event.stream)
                self.core.hook_cancelled(event.stream)

    @staticmethod
    def _take(queue: deque[bytes], size: int) -> bytes:
        out = bytearray()
        while queue and len(out) < size:
            chunk = queue.popleft()
            room = size - len(out)
            out += chunk[:room]
            if len(chunk) > room:
                queue.appendleft(chunk[room:])
        return bytes(out)

    @precondition(lambda self: bool(self.c2p) and self.core.wants_client())
    @rule(size=st.integers(1, 40000))
    def client_bytes_arrive(self, size: int) -> None:
        self.core.receive_from_client(self._take(self.c2p, size))
        self._pump_out()

    @precondition(
        lambda self: (
            bool(self.c2p)
            and self.core.wants_client()
            and not self.core.c_split.preface_left
            and not self.core.c_split.pending()
        )  # what waits starts with a frame's header
    )
    @rule()
    def client_frame_arrives(self) -> None:
        """One whole frame a read (an ACK alone is what the core may hold, `LinkCore._quiet`)."""
        waiting = b"".join(self.c2p)
        if len(waiting) < wire.HEADER_LEN:
            return
        self.c2p.clear()
        self.c2p.append(waiting)
        self.core.receive_from_client(self._take(self.c2p, wire.HEADER_LEN + wire.read_head(waiting, 0)[0]))
        self._pump_out()

    @precondition(lambda self: bool(self.r2p))
    @rule(size=st.integers(1, 40000), answers=st.sampled_from(["now", "after the write", "later"]))
    def runtime_bytes_arrive(self, size: int, answers: str) -> None:
        """The runtime's header blocks are read as they pass, or (`answers_later`, as the adapter
        does) after the bytes went to the client, or left for whatever call into the core comes next."""
        self.core.receive_from_runtime(self._take(self.r2p, size), answers_later=answers != "now")
        self._pump_out()
        if answers == "after the write":
            self.core.read_answers()
            self._pump_out()

    @precondition(lambda self: bool(self.r2p))
    @rule(n=st.integers(1, 4), answers=st.sampled_from(["after the write", "later"]))
    def runtime_frames_arrive(self, n: int, answers: str) -> None:
        """A read of the runtime's that ends where a frame does (as most do): an answer's frames
        alone may go to the client before the core follows them (`_passes_as_is`)."""
        read = b"".join(self.r2p.popleft() for _ in range(min(n, len(self.r2p))))
        self.core.receive_from_runtime(read, answers_later=True)
        self._pump_out()
        if answers == "after the write":
            self.core.read_answers()
            self._pump_out()

    @precondition(lambda self: bool(self.core.answers or self.core.unread))
    @rule()
    def answers_read(self) -> None:
        self.core.read_answers()
        self._pump_out()

    @precondition(lambda self: bool(self.p2r))
    @rule(size=st.integers(1, 40000))
    def runtime_reads(self, size: int) -> None:
        for event in self.server.receive_data(self._take(self.p2r, size)):
            if isinstance(event, h2.events.RequestReceived):
                self.got.setdefault(event.stream_id, bytearray())
            elif isinstance(event, h2.events.DataReceived):
                self.got.setdefault(event.stream_id, bytearray()).extend(event.data)
                if event.flow_controlled_length:
                    self.server.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self.ended.add(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                self.reset_at_runtime.add(event.stream_id)
            elif isinstance(event, h2.events.SettingsAcknowledged):
                self.runtime_settings_pending -= 1
            elif isinstance(event, h2.events.PingAckReceived):
                self.runtime_acked.append(event.ping_data)
            elif isinstance(event, h2.events.ConnectionTerminated):
                raise AssertionError(f"runtime got GOAWAY: {event}")
        self._pump_out()

    @precondition(lambda self: bool(self.p2c))
    @rule(size=st.integers(1, 40000))
    def client_reads(self, size: int) -> None:
        for event in self.client.receive_data(self._take(self.p2c, size)):
            if isinstance(event, h2.events.DataReceived):
                self.answered.setdefault(event.stream_id, bytearray()).extend(event.data)
                if event.flow_controlled_length:
                    self.client.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                for name, value in event.headers:
                    if name == b"grpc-status":
                        self.statuses[event.stream_id] = value
            elif isinstance(event, h2.events.SettingsAcknowledged):
                self.client_settings_pending -= 1
            elif isinstance(event, h2.events.PingReceived):
                self.client_pinged.append(event.ping_data)
                self._ping_follows_what_came_before(event.ping_data)
            elif isinstance(event, h2.events.ConnectionTerminated):
                raise AssertionError(f"client got GOAWAY: {event}")
        self._pump_out()

    def _ping_follows_what_came_before(self, payload: bytes) -> None:
        """A runtime PING (passed at once or held) reaches the client after every frame the runtime
        sent before it: the core's own frames never go ahead of the runtime's."""
        marks = self.ping_marks.get(payload)
        if not marks:
            return
        for sid, (sent, done) in marks.popleft().items():  # the earliest such PING: the least asked
            if sid in self.refused or sid in self.reset_at_runtime:
                continue
            assert len(self.answered.get(sid, b"")) >= sent, f"a PING went ahead of stream {sid}'s DATA"
            assert not done or sid in self.statuses, f"a PING went ahead of stream {sid}'s trailers"

    # -- what the peers do ----------------------------------------------------------------------------
    @precondition(lambda self: len(self.sent) < 12)
    @rule(
        hooked=st.booleans(),
        size=st.integers(0, 3000),
        header=st.sampled_from(["a", "b", "c" * 300, "d" * 2000]),
        trailers=st.booleans(),
    )
    def client_calls(self, hooked: bool, size: int, header: str, trailers: bool) -> None:
        sid = self.client.get_next_available_stream_id()
        body = framed(bytes([sid % 251]) * size)
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", CREATE if hooked else VERSION),
            (":authority", "x"),
            ("content-type", "application/grpc"),
            ("x-h", header),
        ]
        self.client.send_headers(sid, headers)
        self.sent[sid] = body
        self.unsent[sid] = (body, trailers)
        if hooked:
            self.hooked.add(sid)
        else:
            self.expect_body[sid] = body
        self._client_send(sid)
        self._pump_out()

    def _client_send(self, sid: int) -> None:
        body, trailers = self.unsent[sid]
        room = min(self.client.local_flow_control_window(sid), self.client.max_outbound_frame_size)
        while body and room > 0:
            piece, body = body[:room], body[room:]
            self.client.send_data(sid, piece)
            room = min(self.client.local_flow_control_window(sid), self.client.max_outbound_frame_size)
        if body:
            self.unsent[sid] = (body, trailers)
            return
        del self.unsent[sid]
        if trailers:
            self.client.send_headers(sid, [("x-trailer", "t")], end_stream=True)
        else:
            self.client.end_stream(sid)

    @rule()
    def client_continues(self) -> None:
        for sid in list(self.unsent):
            self._client_send(sid)
        self._pump_out()

    @precondition(lambda self: not self.client_settings_pending)
    @rule(size=st.sampled_from([0, 64, 4096]))
    def client_changes_table_size(self, size: int) -> None:
        self.client_settings_pending += 1
        self.client.update_settings({h2.settings.SettingCodes.HEADER_TABLE_SIZE: size})
        self._pump_out()

    @precondition(lambda self: not self.runtime_settings_pending)
    @rule(size=st.sampled_from([0, 100, 4096]), window=st.sampled_from([65535, 200000, 400000]))
    def runtime_changes_settings(self, size: int, window: int) -> None:
        self.runtime_settings_pending += 1
        window = max(window, self.server.local_settings.initial_window_size)  # grows only (as grpc-go's)
        self.server.update_settings(
            {
                h2.settings.SettingCodes.HEADER_TABLE_SIZE: size,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window,
            }
        )
        self._pump_out()

    @rule()
    def client_pings(self) -> None:
        self.client.ping(b"pingpong")
        self._pump_out()

    @rule(n=st.integers(0, 255))
    def runtime_pings(self, n: int) -> None:
        """As grpc-go does on each request it reads: the PING goes to the client at once, whose ACK
        comes back; or, while a slow call is open (or PINGs wait), the core answers it with the next
        write to the runtime, or when it waited long enough (`ping_wait_ends`)."""
        payload = bytes([n]) * 8
        self.server.ping(payload)
        self.runtime_pinged.append(payload)
        sent = {
            sid: (len(body) - len(self.r_unsent.get(sid, b"")), sid in self.r_done)
            for sid, body in self.responses.items()
        }
        self.ping_marks.setdefault(payload, deque()).append(sent)
        self._pump_out()

    @precondition(lambda self: bool(self.core.quiet))
    @rule()
    def quiet_wait_ends(self) -> None:
        """The adapter's timer: the client's quiet reads (its ACKs, credit while no call is open) go."""
        self.core.release_quiet()
        self._pump_out()

    @precondition(lambda self: bool(self.core.held_pings))
    @rule()
    def ping_wait_ends(self) -> None:
        """The adapter's timer: the PINGs held while calls are open are answered by the core."""
        self.core.answer_pings()
        self._pump_out()

    @precondition(lambda self: bool(self.pres))
    @rule(data=st.data(), change=st.booleans(), refuse=st.booleans())
    def hook_ends(self, data: st.DataObject, change: bool, refuse: bool) -> None:
        sid = data.draw(st.sampled_from(self.pres))
        self.pres.remove(sid)
        if refuse:
            self.core.hook_finished(sid, PreDone(None, None, (7, "no")))
            self.refused.add(sid)
        elif change:
            new = b"changed" * (sid % 7)
            self.core.hook_finished(sid, PreDone(new, v1.CreateContainerRequest()))
            self.expect_body[sid] = framed(new)
        else:
            self.core.hook_finished(sid, PreDone(None, v1.CreateContainerRequest()))
            self.expect_body[sid] = self.sent[sid]
        self._pump_out()

    @precondition(lambda self: any(s in self.ended and s not in self.responses for s in self.got))
    @rule(data=st.data(), size=st.integers(0, 3000), header=st.sampled_from(["x", "y" * 500, "z" * 1500]))
    def runtime_answers(self, data: st.DataObject, size: int, header: str) -> None:
        ready = sorted(s for s in self.got if s in self.ended and s not in self.responses)
        sid = data.draw(st.sampled_from(ready))
        body = framed(bytes([sid % 13]) * size)
        self.responses[sid] = body
        self.server.send_headers(
            sid, [(":status", "200"), ("content-type", "application/grpc"), ("x-r", header)]
        )
        self.r_unsent[sid] = body
        self._runtime_send(sid)
        self._pump_out()

    def _runtime_send(self, sid: int) -> None:
        body = self.r_unsent[sid]
        room = min(self.server.local_flow_control_window(sid), self.server.max_outbound_frame_size)
        while body and room > 0:
            piece, body = body[:room], body[room:]
            self.server.send_data(sid, piece)
            room = min(self.server.local_flow_control_window(sid), self.server.max_outbound_frame_size)
        if body:
            self.r_unsent[sid] = body
            return
        del self.r_unsent[sid]
        self.server.send_headers(sid, [("grpc-status", status(sid))], end_stream=True)
        self.r_done.add(sid)

    @rule()
    def runtime_continues(self) -> None:
        for sid in list(self.r_unsent):
            try:
                self._runtime_send(sid)
            except h2.exceptions.StreamClosedError:
                del self.r_unsent[sid]
        self._pump_out()

    # -- invariants -----------------------------------------------------------------------------------
    @invariant()
    def bytes_arrive_in_order(self) -> None:
        for sid, got in self.got.items():
            want = self.expect_body.get(sid)
            if sid in self.refused:
                continue
            if want is not None:
                assert bytes(got) == want[: len(got)], f"stream {sid}: runtime got other bytes"
                if sid in self.ended:
                    assert bytes(got) == want, f"stream {sid}: runtime's request incomplete"
            else:
                assert sid in self.hooked and not got, f"stream {sid}: hooked bytes went before the hook"
        for sid, got in self.answered.items():
            assert bytes(got) == self.responses.get(sid, b"")[: len(got)], (
                f"stream {sid}: client got other bytes"
            )
        for sid in self.refused:
            if sid in self.statuses:
                assert self.statuses[sid] == b"7"
        for sid, got_status in self.statuses.items():
            if sid not in self.refused:
                assert got_status == status(sid).encode()

    def _quiet_acks(self) -> list[bytes]:
        """The payloads of the client's ACKs waiting in the core's quiet reads."""
        acks = []
        for chunk in self.core.quiet:  # whole frames each (`LinkCore._quiet`): the relay's one splitter
            _, _, frames = wire.FrameSplitter(preface=False).feed(chunk)
            for at, end, ftype, flags, _ in frames:
                if ftype == wire.PING and flags & wire.ACK:
                    acks.append(chunk[at + wire.HEADER_LEN : end])
        return acks

    @invariant()
    def every_runtime_ping_is_answered(self) -> None:
        """The runtime's PINGs reach the client in their order (some may be answered by the core
        instead), and every one gets its ACK: the client's, or the core's. The core holds PINGs that
        come while a slow call (CreateContainer here) is open, until the next write to the runtime
        (`_pump_out` checks that none stays behind one) or the timer. An ACK may wait behind a
        hooked request whose pre hook runs (the client's frames keep their order)."""
        pinged = iter(self.runtime_pinged)
        assert all(any(p == q for q in pinged) for p in self.client_pinged), "PINGs out of order"
        assert not Counter(self.runtime_acked) - Counter(self.runtime_pinged), "an ACK for no PING"
        held = self.core.held_pings + self._quiet_acks()
        if not (self.r2p or self.p2r or self.c2p or self.p2c or self.pres):
            assert Counter(self.runtime_acked) + Counter(held) == Counter(self.runtime_pinged)

    @invariant()
    def calls_measured_as_sent(self) -> None:
        """The core reads each request's path and each answer's grpc-status right (a code over 100
        names its stream), however the two HPACK tables have changed."""
        for path, code in self.observed:
            if code >= 100:
                sid = code - 100
                assert path == (CREATE if sid in self.hooked else VERSION), f"stream {sid}: path {path}"
                assert sid in self.responses, f"stream {sid}: measured with a status it was not sent"
            else:  # OK, or a code of the core's own (cancelled, refused, too big, runtime gone)
                assert path in (CREATE, VERSION) and code in (OK, 1, 7, 8, 14), (path, code)
        answered_ok = 0
        unread = {st.id for st, _, _ in self.core.answers if st is not None}  # passed on, not yet read
        if self.core.unread is not None:  # ... or not even followed
            unread |= {sid for _, _, _, _, sid in self.core.unread[1]}
        for sid, got_status in self.statuses.items():
            if sid in unread:
                continue
            if sid not in self.refused and int(got_status) >= 100:
                path = CREATE if sid in self.hooked else VERSION
                assert (path, int(got_status)) in self.observed, f"stream {sid}: not measured"
            answered_ok += sid not in self.refused and got_status == b"0"
        assert sum(code == OK for _, code in self.observed) >= answered_ok

    @invariant()
    def hpack_tables_in_sync(self) -> None:
        quiet = not (self.c2p or self.p2r or self.r2p or self.p2c or self.core.answers or self.core.unread)
        if not quiet:
            return
        for ours, theirs in ((self.core.c_block, self.server), (self.core.r_block, self.client)):
            if ours.open or ours.decoder is None:
                continue
            assert list(ours.decoder.header_table.dynamic_entries) == list(
                theirs.decoder.header_table.dynamic_entries
            )

    @invariant()
    def bounded(self) -> None:
        assert self.core.held + self.core.win.queued <= LIMITS.buffer
        assert self.core.buffered() <= LIMITS.buffer + 2 * (16384 + 9) + 40000 + LIMITS.header_block


Link.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None, suppress_health_check=list(HealthCheck)
)
TestLinkCore = Link.TestCase


def test_a_client_ignoring_flow_control_is_passed_on_not_held() -> None:
    """DATA past the connection window the client was given goes to the runtime, which judges it as it
    would directly; the relay holds none of it."""
    core = LinkCore(lambda path: None, LIMITS)
    core.receive_from_runtime(wire.settings())
    core.receive_from_client(wire.PREFACE + wire.settings())
    block = b"".join(
        wire.literal_new_name(n, v)
        for n, v in (
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", VERSION.encode()),
            (b":authority", b"x"),
        )
    )
    core.receive_from_client(wire.frame(wire.HEADERS, wire.END_HEADERS, 1, block))
    core.take_runtime()
    for _ in range(64):
        core.receive_from_client(wire.frame(wire.DATA, 0, 1, b"\0" * 16384))
    assert len(b"".join(core.take_runtime())) == 64 * (16384 + 9)
    assert core.buffered() == 0 and not core.closing
    assert OK == 0


def test_frames_before_a_dropped_streams_data_still_reach_the_client() -> None:
    """The runtime's DATA for a stream the core ended is dropped (its window given back); the
    frames read before it in the same read still go to the client."""
    core = LinkCore(lambda path: None, Limits(header_list=200))
    core.receive_from_runtime(wire.settings())
    core.receive_from_client(wire.PREFACE + wire.settings())
    block = b"".join(
        wire.literal_new_name(n, v)
        for n, v in ((b":method", b"POST"), (b":path", VERSION.encode()), (b":authority", b"x"))
    )
    core.receive_from_client(wire.frame(wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, 1, block))
    big = block + wire.literal_new_name(b"x-big", b"v" * 300)  # over the header list limit: dropped
    core.receive_from_client(wire.frame(wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, 3, big))
    core.take_client()
    answer = wire.frame(wire.HEADERS, wire.END_HEADERS, 1, wire.literal_new_name(b":status", b"200"))
    core.receive_from_runtime(answer + wire.frame(wire.DATA, 0, 3, b"late"))
    assert b"".join(bytes(c) for c in core.take_client()) == answer
    assert wire.window_update(0, 4) in b"".join(bytes(c) for c in core.take_runtime())


@settings(max_examples=200, deadline=None)
@given(
    frames=st.lists(
        st.tuples(
            st.integers(0, 9), st.integers(0, 255), st.integers(0, (1 << 31) - 1), st.binary(max_size=300)
        ),
        max_size=20,
    ),
    cuts=st.lists(st.integers(1, 200), max_size=30),
)
def test_the_frame_splitter_finds_every_frame_however_the_bytes_are_cut(
    frames: list[tuple[int, int, int, bytes]], cuts: list[int]
) -> None:
    data = wire.PREFACE + b"".join(wire.frame(t, f, s, p) for t, f, s, p in frames)
    splitter = wire.FrameSplitter(preface=True)
    seen: list[tuple[int, int, int, bytes]] = []
    at = 0
    for size in [*cuts, len(data)]:
        chunk, at = data[at : at + size], at + size
        buf, first, found = splitter.feed(chunk)
        for off, end, ftype, flags, sid in found:
            seen.append((ftype, flags, sid, bytes(buf[off + wire.HEADER_LEN : end])))
        splitter.keep(buf, found[-1][1] if found else first)
        assert splitter.pending() < wire.HEADER_LEN + 300
    assert seen == frames
    assert splitter.pending() == 0


@given(junk=st.binary(min_size=1, max_size=24))
def test_the_splitter_refuses_a_wrong_preface(junk: bytes) -> None:
    splitter = wire.FrameSplitter(preface=True)
    if wire.PREFACE.startswith(junk):
        splitter.feed(junk)
        return
    try:
        splitter.feed(junk)
    except wire.PrefaceError:
        return
    raise AssertionError("a wrong preface was taken")


@settings(max_examples=300, deadline=None)
@given(
    frames=st.lists(
        st.tuples(
            st.integers(0, 10),
            st.integers(0, 255),
            st.sampled_from([0, 1, 3, 5, 2]),
            st.one_of(st.binary(max_size=64), st.just(b"\0\0\0\0\x10"), st.just(_GOOD_BLOCK)),
        ),
        max_size=30,
    ),
    runtime_frames=st.lists(
        st.tuples(st.integers(0, 9), st.integers(0, 255), st.sampled_from([0, 1, 3]), st.binary(max_size=40)),
        max_size=10,
    ),
)
def test_hostile_frames_from_either_side_never_escape_and_stay_bounded(
    frames: list[tuple[int, int, int, bytes]], runtime_frames: list[tuple[int, int, int, bytes]]
) -> None:
    """Any frames, well-formed or not, from the client and the runtime: the core raises nothing,
    ends hooks it started (or leaves them to end), and holds no more than its bound."""
    core = LinkCore(lambda path: HOOKS if path == CREATE else None, LIMITS)
    core.receive_from_client(wire.PREFACE + wire.settings())
    core.receive_from_runtime(wire.settings())
    for i, (ftype, flags, sid, payload) in enumerate(frames):
        core.receive_from_client(wire.frame(ftype, flags, sid, payload))
        if i < len(runtime_frames):
            core.receive_from_runtime(wire.frame(*runtime_frames[i]))
        for event in core.take_events():
            if isinstance(event, RunPre):
                core.hook_finished(event.stream, PreDone(b"x", v1.CreateContainerRequest()))
        core.take_client()
        core.take_runtime()
        assert core.held + core.win.queued <= LIMITS.buffer
        assert core.buffered() <= LIMITS.buffer + 2 * (16384 + 9) + LIMITS.header_block
    core.runtime_lost("")
    core.client_lost()
