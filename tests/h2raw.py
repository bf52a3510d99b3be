"""A raw HTTP/2 client over a Unix socket (the `h2` library), for looking at a server's frames.

Every read has a deadline: a test waits for an event or fails naming what it waited for; it never
sleeps and hopes. `raw()` writes bytes past the h2 state machine, for input h2 itself never sends.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
from hpack import Encoder


def recv_before(sock: socket.socket, deadline: float, size: int) -> bytes | None:
    """What the peer sent before `deadline` (b"": it closed or reset the connection; None: nothing
    came in time)."""
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    sock.settimeout(left)
    try:
        return sock.recv(size)
    except TimeoutError:
        return None
    except OSError:
        return b""


@dataclass
class Call:
    """What came back on one stream."""

    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    data: bytes = b""
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)
    reset: int | None = None  # RST_STREAM error code, when the server reset the stream
    ended: bool = False

    def header(self, name: bytes) -> bytes | None:
        for key, value in [*self.headers, *self.trailers]:
            if key == name:
                return value
        return None

    @property
    def grpc_status(self) -> int | None:
        raw = self.header(b"grpc-status")
        return int(raw) if raw is not None else None


class H2Client:
    """One HTTP/2 connection to a Unix socket; `events`, `closed`, `goaway` record what came."""

    def __init__(
        self, path: Path | str, settings: dict[int, int] | None = None, preface: bool = True
    ) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(path))
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.conn = h2.connection.H2Connection(config=config)
        self.events: list[h2.events.Event] = []
        self.calls: dict[int, Call] = {}
        self.closed = False  # the server closed the connection
        self.goaway: h2.events.ConnectionTerminated | None = None
        if preface:
            self.conn.initiate_connection()
            if settings:
                self.conn.update_settings(settings)
            self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> H2Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------------------
    def _read_once(self, deadline: float) -> bool:
        """Read what arrives before `deadline`; False when nothing came in time."""
        if self.closed:
            return False
        data = recv_before(self.sock, deadline, 1 << 16)
        if data is None:
            return False
        if not data:
            self.closed = True
            return True
        for event in self.conn.receive_data(data):
            self._record(event)
        self.flush()  # h2 ACKs the server's SETTINGS and PINGs, and gives back window
        return True

    def _record(self, event: h2.events.Event) -> None:
        self.events.append(event)
        sid = getattr(event, "stream_id", None)
        call = self.calls.setdefault(sid, Call()) if sid else None
        if isinstance(event, h2.events.ResponseReceived) and call is not None:
            call.headers = list(event.headers)
        elif isinstance(event, h2.events.DataReceived) and call is not None:
            call.data += event.data
            if event.flow_controlled_length:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.TrailersReceived) and call is not None:
            call.trailers = list(event.headers)
        elif isinstance(event, h2.events.StreamEnded) and call is not None:
            call.ended = True
        elif isinstance(event, h2.events.StreamReset) and call is not None:
            call.reset = event.error_code
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = event

    def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Read until `predicate()` holds; fail naming `what` at the deadline or when the server closes."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.closed:
                raise AssertionError(f"the server closed the connection while waiting for {what}")
            if not self._read_once(deadline) and time.monotonic() >= deadline:
                raise AssertionError(f"timed out ({timeout:g}s) waiting for {what}")

    def wait_for_event(self, kind: type[h2.events.Event], timeout: float = 5.0) -> h2.events.Event:
        self.wait_for(lambda: any(isinstance(e, kind) for e in self.events), timeout, kind.__name__)
        return next(e for e in self.events if isinstance(e, kind))

    def listen(self, seconds: float) -> None:
        """Take whatever the server sends for `seconds` (or until it closes)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.closed:
            self._read_once(deadline)

    def wait_closed(self, timeout: float) -> bool:
        """Until the server ends the connection (GOAWAY or close); False when it did not in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.closed and self.goaway is None:
            self._read_once(deadline)
        return self.closed or self.goaway is not None

    # -- calls -----------------------------------------------------------------------------------
    def start_call(
        self,
        path: str,
        body: bytes = b"",
        headers: Iterable[tuple[str, str]] = (),
        end: bool = True,
        trailers: Iterable[tuple[str, str]] | None = None,
    ) -> int:
        """A gRPC request on a new stream: `body` as one message (uncompressed) unless it is empty."""
        sid: int = self.conn.get_next_available_stream_id()
        self.calls[sid] = Call()
        self.conn.send_headers(
            sid,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *headers,
            ],
        )
        message = grpc_message(body)
        if trailers is not None:
            self.conn.send_data(sid, message)
            self.conn.send_headers(sid, list(trailers), end_stream=True)
        else:
            self.conn.send_data(sid, message, end_stream=end)
        self.flush()
        return sid

    def finish(self, sid: int, timeout: float = 10.0) -> Call:
        call = self.calls[sid]
        self.wait_for(lambda: call.ended or call.reset is not None, timeout, f"the end of stream {sid}")
        return call

    def call(self, path: str, body: bytes = b"", timeout: float = 10.0, **kw: Any) -> Call:
        return self.finish(self.start_call(path, body, **kw), timeout)


def grpc_message(body: bytes, compressed: bool = False) -> bytes:
    return bytes([1 if compressed else 0]) + len(body).to_bytes(4, "big") + body


VERSION = "/runtime.v1.RuntimeService/Version"


# -- a client below h2's state machine: frames as bytes, for input no conforming client sends --------

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED = 0x1, 0x1, 0x4, 0x8
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER_TABLE_SIZE, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 0x1, 0x4, 0x5


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([ftype, flags]) + sid.to_bytes(4, "big") + payload


def settings_frame(values: dict[int, int] | None = None, ack: bool = False) -> bytes:
    body = b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in (values or {}).items())
    return frame(SETTINGS, ACK if ack else 0, 0, body)


def request_headers(path: str, extra: Iterable[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra,
    ]


@dataclass
class Outcome:
    """How a stream ended, as a peer sees it: grpc-status, RST_STREAM code, or the connection's end."""

    kind: str  # "status", "reset", "goaway", "closed" or "pending"
    code: int | None = None

    def __str__(self) -> str:
        return self.kind if self.code is None else f"{self.kind} {self.code}"


class RawH2:
    """One connection, frames written as given; the reader ACKs SETTINGS and PINGs, decodes headers,
    and (with `auto_window`) gives back window for what it received."""

    def __init__(self, path: Path | str, settings: dict[int, int] | None = None) -> None:
        import hpack

        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(path))
        self.enc = hpack.Encoder()
        self.dec = hpack.Decoder()
        self.dec.max_header_list_size = 1 << 31
        self.buf = bytearray()
        self.closed = False
        self.goaway: int | None = None  # its error code
        self.ping_acks: list[bytes] = []
        self.streams: dict[int, Call] = {}
        self.block: tuple[int, bytearray, bool] | None = None  # (stream, fragments, end stream)
        self.auto_window = True
        self.settings_acked = 0
        self.server_settings: dict[int, int] = {}
        # the server's receive windows, for send_data
        self.conn_window = 65535
        self.initial_window = 65535
        self.windows: dict[int, int] = {}
        self.next_sid = 1
        self.send(PREFACE + settings_frame(settings))

    def send(self, data: bytes) -> None:
        self.sock.settimeout(10)
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawH2:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def new_stream(self) -> int:
        sid = self.next_sid
        self.next_sid += 2
        self.streams[sid] = Call()
        self.windows[sid] = self.initial_window
        return sid

    def header_block(self, headers: Iterable[tuple[str, str]]) -> bytes:
        return bytes(self.enc.encode(list(headers)))

    def headers(self, sid: int, headers: Iterable[tuple[str, str]], end_stream: bool = False) -> None:
        block = self.header_block(headers)
        first, rest = block[:16384], block[16384:]
        flags = (END_STREAM if end_stream else 0) | (0 if rest else END_HEADERS)
        out = [frame(HEADERS, flags, sid, first)]
        while rest:
            chunk, rest = rest[:16384], rest[16384:]
            out.append(frame(CONTINUATION, 0 if rest else END_HEADERS, sid, chunk))
        self.send(b"".join(out))

    def send_data(
        self, sid: int, data: bytes, end_stream: bool = True, pad: int = 0, timeout: float = 30
    ) -> None:
        """DATA within the server's windows (reading while they are shut); `pad` bytes of padding a frame."""
        deadline = time.monotonic() + timeout
        room = 16384 - (pad + 1 if pad else 0)
        while True:
            need = min(len(data), room)
            flow = need + (pad + 1 if pad else 0)
            while min(self.conn_window, self.windows.get(sid, 0)) < flow:
                call = self.streams[sid]
                if self.closed or self.goaway is not None or call.reset is not None or call.ended:
                    return  # the server answered (or gave up): the rest would go nowhere
                if not self.read(deadline) and time.monotonic() >= deadline:
                    raise AssertionError(f"timed out ({timeout:g}s) waiting for window to send on {sid}")
            chunk, data = data[:need], data[need:]
            last = end_stream and not data
            flags = (END_STREAM if last else 0) | (PADDED if pad else 0)
            payload = bytes([pad]) + chunk + bytes(pad) if pad else chunk
            self.send(frame(DATA, flags, sid, payload))
            self.conn_window -= flow
            self.windows[sid] -= flow
            if not data:
                return

    def call(self, path: str, body: bytes, extra: Iterable[tuple[str, str]] = (), pad: int = 0) -> int:
        sid = self.new_stream()
        self.headers(sid, request_headers(path, extra))
        self.send_data(sid, grpc_message(body), pad=pad)
        return sid

    # -- reading ---------------------------------------------------------------------------------
    def read(self, deadline: float) -> bool:
        """Take what arrives before `deadline`; False when nothing did."""
        if self.closed:
            return False
        data = recv_before(self.sock, deadline, 1 << 18)
        if data is None:
            return False
        if not data:
            self.closed = True
            return True
        self.buf += data
        out: list[bytes] = []
        while len(self.buf) >= 9:
            length = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + length:
                break
            ftype, flags = self.buf[3], self.buf[4]
            sid = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
            payload = bytes(self.buf[9 : 9 + length])
            del self.buf[: 9 + length]
            self._frame(ftype, flags, sid, payload, out)
        if out:
            with contextlib.suppress(OSError):
                self.send(b"".join(out))
        return True

    def _frame(self, ftype: int, flags: int, sid: int, payload: bytes, out: list[bytes]) -> None:
        call = self.streams.get(sid)
        if ftype == SETTINGS and flags & ACK:
            self.settings_acked += 1
        elif ftype == SETTINGS:
            for at in range(0, len(payload) - 5, 6):
                key, value = (
                    int.from_bytes(payload[at : at + 2], "big"),
                    int.from_bytes(payload[at + 2 : at + 6], "big"),
                )
                self.server_settings[key] = value
                if key == INITIAL_WINDOW_SIZE:
                    for other in self.windows:
                        self.windows[other] += value - self.initial_window
                    self.initial_window = value
                elif key == HEADER_TABLE_SIZE:
                    self.enc.header_table_size = value
            out.append(settings_frame(ack=True))
        elif ftype == PING and flags & ACK:
            self.ping_acks.append(payload)
        elif ftype == PING:
            out.append(frame(PING, ACK, 0, payload))
        elif ftype == GOAWAY:
            self.goaway = int.from_bytes(payload[4:8], "big")
        elif ftype == WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            if sid == 0:
                self.conn_window += increment
            else:
                self.windows[sid] = self.windows.get(sid, 0) + increment
        elif ftype == RST_STREAM and call is not None:
            call.reset = int.from_bytes(payload[:4], "big")
        elif ftype in (HEADERS, CONTINUATION):
            if ftype == HEADERS:
                body = payload
                if flags & PADDED:
                    body = body[1 : len(body) - body[0]]
                if flags & 0x20:  # PRIORITY
                    body = body[5:]
                self.block = (sid, bytearray(body), bool(flags & END_STREAM))
            elif self.block is not None:
                self.block[1].extend(payload)
            if flags & END_HEADERS and self.block is not None:
                bsid, fragments, ended = self.block
                self.block = None
                headers = [(bytes(k), bytes(v)) for k, v in self.dec.decode(bytes(fragments), raw=True)]
                target = self.streams.setdefault(bsid, Call())
                if not target.headers:
                    target.headers = headers
                else:
                    target.trailers = headers
                target.ended = target.ended or ended
        elif ftype == DATA:
            if call is not None:
                body = payload[1 : len(payload) - payload[0]] if flags & PADDED else payload
                call.data += body
                call.ended = call.ended or bool(flags & END_STREAM)
            if self.auto_window and payload:
                out.append(frame(WINDOW_UPDATE, 0, 0, len(payload).to_bytes(4, "big")))
                if call is not None and not flags & END_STREAM:
                    out.append(frame(WINDOW_UPDATE, 0, sid, len(payload).to_bytes(4, "big")))

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Read until `predicate()` holds (True), or the deadline, or the server closes (False)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.closed or (not self.read(deadline) and time.monotonic() >= deadline):
                return predicate()
        return True

    def outcome(self, sid: int, timeout: float = 10) -> Outcome:
        """How stream `sid` ended, waiting up to `timeout`."""
        call = self.streams[sid]
        self.wait(lambda: call.ended or call.reset is not None or self.goaway is not None, timeout)
        if call.ended:
            return Outcome("status", call.grpc_status)
        if call.reset is not None:
            return Outcome("reset", call.reset)
        if self.goaway is not None:
            return Outcome("goaway", self.goaway)
        return Outcome("closed" if self.closed else "pending")

    def alive(self, timeout: float = 5) -> bool:
        """Whether the connection still answers a PING (the connection, not a stream, survived)."""
        if self.closed:
            return False
        data = os.urandom(8)
        try:
            self.send(frame(PING, 0, 0, data))
        except OSError:
            return False
        return self.wait(lambda: data in self.ping_acks, timeout)


def never_reading_client(path: Path, seconds: float, most: int | None = None) -> int:
    """Tiny Version calls as fast as they are taken for `seconds` (and `most` of them), no answer ever
    read: calls sent."""
    encoder, sid = Encoder(), 1
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(path))
        s.sendall(PREFACE + settings_frame())
        s.settimeout(0.5)
        end = time.monotonic() + seconds
        while time.monotonic() < end and (most is None or sid // 2 < most):
            block = bytes(
                encoder.encode(request_headers("/runtime.v1.RuntimeService/Version"), huffman=False)
            )
            request = frame(HEADERS, END_HEADERS, sid, block)
            request += frame(DATA, END_STREAM, sid, grpc_message(b""))
            try:
                s.sendall(request)
            except (TimeoutError, OSError):
                break
            sid += 2
    return (sid - 1) // 2
