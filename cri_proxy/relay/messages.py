"""gRPC length-prefixed messages on a stream's DATA: boundaries, size limits, compression. No I/O.

A hooked request is one message, possibly `grpc-encoding: gzip`; it is unpacked for the hooks
and packed again the same way, so the header block the runtime already has stays true.
"""

from __future__ import annotations

import gzip
import struct
import zlib

from cri_proxy.relay.wire import Buf

_PREFIX = struct.Struct(">BI")
PREFIX_LEN = 5


class MessageError(ValueError):
    """A request the relay cannot unpack for its hooks (it is then forwarded or refused as policy says)."""


class Boundaries:
    """Follows message boundaries in one direction of a stream, a DATA payload at a time."""

    __slots__ = ("head", "need")

    def __init__(self) -> None:
        self.need = 0  # body bytes still due of the current message
        self.head = b""  # a partial 5-byte prefix

    def feed(self, buf: Buf, start: int, end: int, limit: int) -> int:
        """The declared size of a message over `limit` (as soon as its prefix is seen), else 0."""
        at = start
        while at < end:
            if self.need:
                take = min(self.need, end - at)
                self.need -= take
                at += take
                continue
            if not self.head and end - at >= PREFIX_LEN:  # a whole prefix here (the usual case)
                size: int = _PREFIX.unpack_from(buf, at)[1]
                at += PREFIX_LEN
                if size > limit:
                    return size
                self.need = size
                continue
            take = min(PREFIX_LEN - len(self.head), end - at)
            self.head += bytes(buf[at : at + take])
            at += take
            if len(self.head) == PREFIX_LEN:
                size = int.from_bytes(self.head[1:5], "big")
                self.head = b""
                if size > limit:
                    return size
                self.need = size
        return 0

    def fits(self, buf: Buf, start: int, end: int, limit: int) -> bool:
        """Whether `feed` of these bytes surely finds no message over `limit`: they are the rest of
        the current message, or begin with a prefix declaring at most `limit` and hold no other."""
        size = end - start
        if self.need >= size:
            return True
        if self.need or self.head or size < PREFIX_LEN:
            return False
        declared: int = _PREFIX.unpack_from(buf, start)[1]
        return declared <= limit and PREFIX_LEN + declared >= size


def unpack(body: bytes, encoding: bytes | None, limit: int) -> tuple[bytes, bool]:
    """(message, was compressed) of a stream body that is exactly one message. Raises MessageError."""
    if len(body) < PREFIX_LEN:
        raise MessageError("request is not one gRPC message (short)")
    compressed, size = _PREFIX.unpack_from(body, 0)
    if size != len(body) - PREFIX_LEN or compressed > 1:
        raise MessageError("request is not exactly one gRPC message")
    payload = body[PREFIX_LEN:]
    if not compressed:
        return payload, False
    if encoding != b"gzip":
        raise MessageError(f"request compressed with grpc-encoding {encoding!r}: the relay decodes gzip only")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        message = inflater.decompress(payload, limit + 1)
    except zlib.error as exc:
        raise MessageError(f"gzip request does not decompress: {exc}") from exc
    if len(message) > limit:
        raise MessageError(f"request larger than max when decompressed (> {limit})")
    return message, True


def pack(message: bytes, compress: bool) -> bytes:
    """`message` as one gRPC message, gzip-compressed when the request came so."""
    if compress:
        data = gzip.compress(message, compresslevel=1, mtime=0)
        return _PREFIX.pack(1, len(data)) + data
    return _PREFIX.pack(0, len(message)) + message


def single(body: bytes) -> bytes | None:
    """The message of a response body that is one uncompressed message; None otherwise."""
    try:
        message, compressed = unpack(body, None, 1 << 62)
    except MessageError:
        return None
    return None if compressed else message
