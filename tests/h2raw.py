"""A raw HTTP/2 client over a Unix socket (the `h2` library), for looking at a server's frames.

Every read has a deadline: a test waits for an event or fails naming what it waited for; it never
sleeps and hopes. `raw()` writes bytes past the h2 state machine, for input h2 itself never sends.
"""

from __future__ import annotations

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
        left = deadline - time.monotonic()
        if left <= 0 or self.closed:
            return False
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            return False
        except OSError:
            data = b""
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
