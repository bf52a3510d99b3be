"""HTTP/2 wire format for the frame relay: the one frame splitter, frame and HPACK encoders. No I/O.

The frame relay forwards the client's frames unchanged and only ever *adds* frames of its own
(a rewritten request's DATA, a refusal's HEADERS, WINDOW_UPDATE, RST_STREAM, GOAWAY). The header
blocks it adds never touch either side's HPACK dynamic table (static index or literal without
indexing), so the two peers' tables stay exactly as their own frames left them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import TypeAlias

Buf: TypeAlias = bytes | bytearray

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER_LEN = 9

# frame types (RFC 9113 section 6)
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# flags
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# settings identifiers
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

# error codes
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
FRAME_SIZE_ERROR = 0x6
CANCEL = 0x8
COMPRESSION_ERROR = 0x9

DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME_SIZE = 16384
MAX_WINDOW = (1 << 31) - 1

_HEAD = struct.Struct(">HBBBI")  # length split as 16 + 8 bits, type, flags, stream id (R bit masked)
_GRPC_PREFIX = struct.Struct(">BI")


class FrameError(ValueError):
    """A frame the relay cannot make sense of (bad padding, short payload)."""


class PrefaceError(ValueError):
    """The client's first bytes are not the HTTP/2 connection preface."""


class FrameTooLarge(ValueError):
    """A frame longer than the receiving peer's SETTINGS_MAX_FRAME_SIZE; `at` is its offset."""

    def __init__(self, at: int, length: int) -> None:
        super().__init__(f"frame of {length} bytes is over the peer's maximum frame size")
        self.at = at


Frame: TypeAlias = tuple[int, int, int, int, int]  # (offset, end, type, flags, stream id)


class FrameSplitter:
    """Splits one direction's byte stream into whole frames: the only frame parser of the relay.

    `feed(data)` gives the buffer and its complete frames, as offsets (a frame's payload is
    buf[offset + 9:end]); bytes of an incomplete frame stay until `keep(buf, at)` is told where
    the consumer stopped. The client's connection preface is checked and skipped first.
    """

    __slots__ = ("buf", "max_frame", "preface_left")

    def __init__(self, preface: bool) -> None:
        self.buf = bytearray()
        self.preface_left = len(PREFACE) if preface else 0
        self.max_frame = DEFAULT_MAX_FRAME_SIZE  # the receiving peer's SETTINGS_MAX_FRAME_SIZE

    def feed(self, data: bytes) -> tuple[Buf, int, list[Frame]]:
        """(buffer, where its frames start, the complete frames); raises PrefaceError, FrameTooLarge."""
        if self.buf:
            self.buf += data
            buf: Buf = self.buf
        else:
            buf = data
        size = len(buf)
        off = 0
        if self.preface_left:
            done = len(PREFACE) - self.preface_left
            take = min(self.preface_left, size)
            if buf[:take] != PREFACE[done : done + take]:
                raise PrefaceError("the client did not open with the HTTP/2 connection preface")
            self.preface_left -= take
            off = take
        first = off
        frames: list[Frame] = []
        head = _HEAD.unpack_from
        limit = self.max_frame
        while size - off >= HEADER_LEN:
            high, low, ftype, flags, stream = head(buf, off)
            length = (high << 8) | low
            if length > limit:
                raise FrameTooLarge(off, length)
            end = off + HEADER_LEN + length
            if end > size:
                break
            frames.append((off, end, ftype, flags, stream & 0x7FFFFFFF))
            off = end
        return buf, first, frames

    def keep(self, buf: Buf, at: int) -> None:
        """The consumer used `buf` up to `at`: keep the rest for the next feed."""
        if buf is self.buf:
            del self.buf[:at]
        elif at < len(buf):
            self.buf = bytearray(buf[at:])

    def pending(self) -> int:
        """Bytes held for an incomplete frame (or not yet consumed)."""
        return len(self.buf)


def read_head(buf: bytes | bytearray, offset: int) -> tuple[int, int, int, int]:
    """(payload length, type, flags, stream id) of the frame header at `offset`."""
    high, low, ftype, flags, stream = _HEAD.unpack_from(buf, offset)
    return (high << 8) | low, ftype, flags, stream & 0x7FFFFFFF


def frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One frame on the wire."""
    size = len(payload)
    return _HEAD.pack(size >> 8, size & 0xFF, ftype, flags, stream) + payload


def unpad(flags: int, payload: bytes) -> bytes:
    """The content of a DATA frame without its padding."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise FrameError("DATA frame padding is longer than the frame")
    return payload[1 : len(payload) - payload[0]]


def header_fragment(flags: int, payload: bytes) -> bytes:
    """The header block fragment of a HEADERS frame: padding and priority fields removed."""
    start, end = 0, len(payload)
    if flags & PADDED:
        if not payload:
            raise FrameError("HEADERS frame too short for its padding length")
        start, end = 1, end - payload[0]
    if flags & PRIORITY_FLAG:
        start += 5
    if start > end:
        raise FrameError("HEADERS frame padding/priority longer than the frame")
    return payload[start:end]


def settings_pairs(payload: bytes) -> Iterator[tuple[int, int]]:
    """(identifier, value) of each setting in a SETTINGS payload."""
    for offset in range(0, len(payload) - len(payload) % 6, 6):
        yield struct.unpack_from(">HI", payload, offset)


def window_increment(payload: Buf) -> int:
    """The increment a WINDOW_UPDATE payload carries (0 when malformed: the peer will complain)."""
    if len(payload) != 4:
        return 0
    return int.from_bytes(payload, "big") & 0x7FFFFFFF


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, (increment & 0x7FFFFFFF).to_bytes(4, "big"))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, code.to_bytes(4, "big"))


def goaway(last_stream: int, code: int, debug: bytes = b"") -> bytes:
    return frame(
        GOAWAY, 0, 0, (last_stream & 0x7FFFFFFF).to_bytes(4, "big") + code.to_bytes(4, "big") + debug
    )


def settings(pairs: tuple[tuple[int, int], ...] = ()) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


SETTINGS_ACK = frame(SETTINGS, ACK, 0)
MAX_SETTING = (1 << 32) - 1


def settings_frame(payload: bytes, more: tuple[tuple[int, int], ...]) -> bytes:
    """A SETTINGS frame with a peer's `payload` and `more` pairs after it."""
    return frame(SETTINGS, 0, 0, payload + b"".join(struct.pack(">HI", k, v) for k, v in more))


# -- gRPC length-prefixed messages --------------------------------------------------------------
def grpc_message(body: bytes) -> bytes:
    """`body` as one uncompressed gRPC message (5-byte prefix)."""
    return _GRPC_PREFIX.pack(0, len(body)) + body


def single_grpc_message(stream_bytes: bytes) -> tuple[bool, bytes] | None:
    """(compressed, body) when the bytes are exactly one gRPC message; None otherwise."""
    if len(stream_bytes) < 5:
        return None
    compressed, size = _GRPC_PREFIX.unpack_from(stream_bytes, 0)
    if size != len(stream_bytes) - 5 or compressed > 1:
        return None
    return bool(compressed), stream_bytes[5:]


# -- HPACK without the dynamic table -------------------------------------------------------------
_STATUS_200 = b"\x88"  # indexed field, static table entry 8 (:status: 200)
_CONTENT_TYPE_INDEX = 31  # static table name `content-type`


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer with an N-bit prefix; `first` holds the pattern bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack_string(text: bytes) -> bytes:
    """A string literal, not Huffman-coded."""
    return hpack_int(len(text), 7) + text


def literal_new_name(name: bytes, value: bytes) -> bytes:
    """Literal header field without indexing, new name: leaves the dynamic table alone."""
    return b"\x00" + hpack_string(name) + hpack_string(value)


def percent_encode(message: str) -> bytes:
    """grpc-message encoding: UTF-8, then %XX for every byte outside printable ASCII and `%`."""
    out = bytearray()
    for byte in message.encode("utf-8"):
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)


def status_block(code: int, message: str, trailers_only: bool) -> bytes:
    """A header block ending a gRPC call with `code`: a full trailers-only response or bare trailers."""
    fields = b""
    if trailers_only:
        fields = _STATUS_200 + hpack_int(_CONTENT_TYPE_INDEX, 4) + hpack_string(b"application/grpc")
    fields += literal_new_name(b"grpc-status", str(code).encode())
    if message:
        fields += literal_new_name(b"grpc-message", percent_encode(message))
    return fields


def status_frames(
    stream: int, code: int, message: str, trailers_only: bool, max_frame: int, table_size: int | None = None
) -> bytes:
    """HEADERS (+CONTINUATION when the message is long) that end `stream` with a gRPC status;
    `table_size`: start with an HPACK dynamic table size update (the receiver shrank its table)."""
    block = status_block(code, message, trailers_only)
    if table_size is not None:
        block = hpack_int(table_size, 5, 0x20) + block
    first, rest = block[:max_frame], block[max_frame:]
    if not rest:
        return frame(HEADERS, END_STREAM | END_HEADERS, stream, first)
    out = [frame(HEADERS, END_STREAM, stream, first)]
    while rest:
        piece, rest = rest[:max_frame], rest[max_frame:]
        out.append(frame(CONTINUATION, 0 if rest else END_HEADERS, stream, piece))
    return b"".join(out)
