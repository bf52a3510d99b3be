"""Unary gRPC calls over one plain HTTP/2 connection, without grpcio.

`ctl` makes a handful of unary calls and exits; importing grpcio alone costs more than crictl's
whole run (docs/performance.md), and the hpack package about as much as the rest (hence
`hpackdecode`). This is the least HTTP/2 a unary gRPC call needs: the preface, one HEADERS and
DATA per request, the answer's HEADERS, DATA and trailers. Our receive windows are opened to the
maximum at once, so no flow control is needed for answers; a request larger than the peer's
initial window goes through grpcio instead (`TooLarge`). Streaming calls (`events`, `call` of a
server stream) keep using grpcio.
"""

from __future__ import annotations

import socket
import struct
import time

from cri_proxy.ctl.hpackdecode import Decoder, HpackError
from cri_proxy.relay.wire import hpack_int

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65535
MAX_FRAME = 16384
INITIAL_WINDOW_SETTING = 0x4


NAMES = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
]


class Status:
    """A gRPC status code, with grpcio's `name` (an Enum costs more to import than it is worth)."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value if 0 <= value < len(NAMES) else 2

    @property
    def name(self) -> str:
        return NAMES[self.value]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Status) and other.value == self.value

    def __hash__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"Status.{self.name}"


OK, UNKNOWN, DEADLINE_EXCEEDED, INTERNAL, UNAVAILABLE = (Status(n) for n in (0, 2, 4, 13, 14))


class RpcFailure(Exception):
    """A call that did not answer OK; `code()` and `details()` as on grpcio's RpcError."""

    def __init__(self, status: Status, details: str) -> None:
        super().__init__(f"{status.name}: {details}")
        self.status = status
        self.message = details

    def code(self) -> Status:
        return self.status

    def details(self) -> str:
        return self.message


class TooLarge(Exception):
    """The request does not fit the peer's initial window: send it another way."""


def encode_headers(headers: list[tuple[str, str]]) -> bytes:
    """Literal fields without indexing, no Huffman: always valid, nothing to keep in step."""
    out = bytearray()
    for name, value in headers:
        raw_name, raw_value = name.encode(), value.encode()
        out += b"\x00" + hpack_int(len(raw_name), 7) + raw_name + hpack_int(len(raw_value), 7) + raw_value
    return bytes(out)


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def grpc_timeout(seconds: float) -> str:
    """The `grpc-timeout` header: at most 8 digits, in the finest unit that fits."""
    for unit, scale in (("m", 1e3), ("S", 1.0), ("M", 1 / 60)):
        value = max(1, int(seconds * scale + 0.999))
        if value < 10**8:
            return f"{value}{unit}"
    return "99999999H"


def _unpad(flags: int, payload: bytes, kind: int) -> bytes:
    if flags & PADDED:
        pad = payload[0]
        payload = payload[1 : len(payload) - pad]
    if kind == HEADERS and flags & PRIORITY:
        payload = payload[5:]
    return payload


class Connection:
    """One HTTP/2 connection to a CRI endpoint; calls run one after another on streams 1, 3, 5..."""

    def __init__(self, address: str | tuple[str, int], where: str) -> None:
        self.address = address
        self.where = where  # for messages: the endpoint as given
        self.sock: socket.socket | None = None
        self.buffer = b""
        self.next_stream = 1
        self.send_window = DEFAULT_WINDOW
        self.decoder = Decoder()

    def _connect(self, deadline: float | None) -> socket.socket:
        family = socket.AF_UNIX if isinstance(self.address, str) else socket.AF_INET
        if not isinstance(self.address, str) and ":" in self.address[0]:
            family = socket.AF_INET6
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(self._left(deadline))
        try:
            sock.connect(self.address)
        except TimeoutError:
            sock.close()
            raise RpcFailure(DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        except OSError as exc:
            sock.close()
            raise RpcFailure(
                UNAVAILABLE, f"failed to connect to {self.where}: {exc.strerror or exc}"
            ) from None
        settings = struct.pack(">HI", INITIAL_WINDOW_SETTING, MAX_WINDOW)
        sock.sendall(
            PREFACE
            + frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW))
        )
        return sock

    @staticmethod
    def _left(deadline: float | None) -> float | None:
        if deadline is None:
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            raise RpcFailure(DEADLINE_EXCEEDED, "Deadline Exceeded")
        return left

    def _read(self, n: int, deadline: float | None) -> bytes:
        assert self.sock is not None
        while len(self.buffer) < n:
            self.sock.settimeout(self._left(deadline))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise RpcFailure(DEADLINE_EXCEEDED, "Deadline Exceeded") from None
            except OSError as exc:
                raise RpcFailure(UNAVAILABLE, f"{self.where}: {exc.strerror or exc}") from None
            if not chunk:
                raise RpcFailure(UNAVAILABLE, f"{self.where} closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def _frame(self, deadline: float | None) -> tuple[int, int, int, bytes]:
        head = self._read(9, deadline)
        length = int.from_bytes(head[:3], "big")
        stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
        return head[3], head[4], stream, self._read(length, deadline) if length else b""

    def _decode(self, block: bytes) -> list[tuple[str, str]]:
        try:
            return self.decoder.decode(block)
        except HpackError as exc:
            raise RpcFailure(INTERNAL, f"{self.where} sent headers that do not decode: {exc}") from None

    def unary(self, path: str, request: bytes, timeout: float | None) -> bytes:
        """Send `request` (a serialised message) to `path`; the answer's serialised message."""
        if len(request) + 5 > self.send_window:
            raise TooLarge(path)
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.sock is None:
            self.sock = self._connect(deadline)
        stream = self.next_stream
        self.next_stream += 2
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("user-agent", "cri-proxy-ctl"),
        ]
        if timeout is not None:
            headers.append(("grpc-timeout", grpc_timeout(timeout)))
        body = b"\x00" + struct.pack(">I", len(request)) + request
        out = frame(HEADERS, END_HEADERS, stream, encode_headers(headers))
        for at in range(0, len(body), MAX_FRAME):
            piece = body[at : at + MAX_FRAME]
            out += frame(DATA, END_STREAM if at + MAX_FRAME >= len(body) else 0, stream, piece)
        self.send_window -= len(body)
        try:
            self.sock.sendall(out)
        except OSError as exc:
            raise RpcFailure(UNAVAILABLE, f"{self.where}: {exc.strerror or exc}") from None
        return self._answer(stream, deadline)

    def _answer(self, stream: int, deadline: float | None) -> bytes:
        sock = self.sock
        assert sock is not None
        fields: list[tuple[str, str]] = []
        block = b""
        data = bytearray()
        while True:
            kind, flags, on, payload = self._frame(deadline)
            if kind == SETTINGS and not flags & ACK:
                for at in range(0, len(payload) - 5, 6):
                    key, value = struct.unpack(">HI", payload[at : at + 6])
                    if key == INITIAL_WINDOW_SETTING:
                        self.send_window += value - DEFAULT_WINDOW
                sock.sendall(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                sock.sendall(frame(PING, ACK, 0, payload))
            elif kind == WINDOW_UPDATE and on == 0:
                self.send_window += int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            elif kind == GOAWAY:
                self.close()
                if int.from_bytes(payload[:4], "big") & 0x7FFFFFFF < stream:
                    raise RpcFailure(UNAVAILABLE, f"{self.where} went away before answering")
            elif on != stream:
                continue
            elif kind == RST_STREAM:
                raise RpcFailure(UNAVAILABLE, f"{self.where} reset the call")
            elif kind in (HEADERS, CONTINUATION):
                block += _unpad(flags, payload, kind)
                if flags & END_HEADERS:
                    fields += self._decode(block)
                    block = b""
                if flags & END_STREAM:
                    return self._result(fields, bytes(data))
            elif kind == DATA:
                data += _unpad(flags, payload, kind)
                if flags & END_STREAM:
                    return self._result(fields, bytes(data))

    def _result(self, fields: list[tuple[str, str]], data: bytes) -> bytes:
        found = dict(fields)
        http = found.get(":status", "200")
        if http != "200":
            raise RpcFailure(UNKNOWN, f"{self.where} answered HTTP status {http}")
        code = found.get("grpc-status")
        if code is None:
            raise RpcFailure(UNKNOWN, f"{self.where} ended the call without a gRPC status")
        status = Status(int(code)) if code.isdigit() else UNKNOWN
        if status != OK:
            message = found.get("grpc-message", "")
            if "%" in message:
                from urllib.parse import unquote

                message = unquote(message)
            raise RpcFailure(status, message)
        if len(data) < 5:
            raise RpcFailure(INTERNAL, f"{self.where} answered OK without a message")
        if data[0]:
            raise RpcFailure(INTERNAL, f"{self.where} answered a compressed message")
        length = int.from_bytes(data[1:5], "big")
        return data[5 : 5 + length]

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def address_of(endpoint: str) -> str | tuple[str, int] | None:
    """A unix socket path or (host, port) for `endpoint`; None when only grpcio can reach it."""
    text = endpoint
    for scheme in ("unix://", "unix:"):
        if text.startswith(scheme):
            path = text[len(scheme) :]
            return path if path.startswith("/") else None
    if text.startswith("/"):
        return text
    text = text.removeprefix("tcp://").removeprefix("dns:///")
    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or "/" in host:
        return None
    return host.strip("[]") or "localhost", int(port)
