"""Just enough of the protobuf wire format for `ctl version` to skip importing the CRI messages
(the largest part of a `ctl` start-up): strings out, fields in."""

from __future__ import annotations


def varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def string_field(number: int, text: str) -> bytes:
    """A length-delimited field (wire type 2); empty for an empty string, as proto3 writes it."""
    raw = text.encode()
    return varint(number << 3 | 2) + varint(len(raw)) + raw if raw else b""


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data):
            raise ValueError("truncated varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def fields(data: bytes) -> dict[int, list[int | bytes]]:
    """Every field of a message by number: varints as ints, the rest as their bytes."""
    found: dict[int, list[int | bytes]] = {}
    at = 0
    while at < len(data):
        key, at = _read_varint(data, at)
        number, kind = key >> 3, key & 7
        value: int | bytes
        if kind == 0:
            value, at = _read_varint(data, at)
        elif kind == 2:
            size, at = _read_varint(data, at)
            value, at = data[at : at + size], at + size
        elif kind in (1, 5):
            width = 8 if kind == 1 else 4
            value, at = data[at : at + width], at + width
        else:
            raise ValueError(f"unsupported wire type {kind}")
        if at > len(data):
            raise ValueError("truncated field")
        found.setdefault(number, []).append(value)
    return found


def text(found: dict[int, list[int | bytes]], number: int) -> str:
    """The last value of string field `number`, or ""."""
    values = found.get(number)
    last = values[-1] if values else b""
    return last.decode(errors="replace") if isinstance(last, bytes) else ""
