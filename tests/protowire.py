"""Protobuf wire bytes written by hand, for tests that send what no message class would make."""

from __future__ import annotations


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def length_field(field: int, payload: bytes) -> bytes:
    """Field `field` as a length-delimited one holding `payload`."""
    return tag(field, 2) + varint(len(payload)) + payload
