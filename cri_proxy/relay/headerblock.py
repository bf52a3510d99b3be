"""One direction's header blocks (HEADERS + CONTINUATIONs): gathered, capped, HPACK-decoded.

The relay forwards every header block unchanged, so its decoder must see exactly the bytes the
receiving peer's decoder sees, in the same order, with the same table size limit. A table size the
receiver announces (SETTINGS_HEADER_TABLE_SIZE) binds the sender's encoder once the sender has
acknowledged it, so the decoder takes it when that ACK passes, not when the SETTINGS does.

Bounds: a block's encoded size is capped (`max_block`); the decoded size of its header list is
counted (name + value + 32 per field, as SETTINGS_MAX_HEADER_LIST_SIZE counts it) and a list over
`max_list` is reported, not refused here: the table state stays in sync, the stream alone is ended.
Decoding never copies a field out of the dynamic table, so a small block of many references to a
big entry costs a pointer per field, not the bytes it expands to.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, TypeAlias, cast

import hpack

from cri_proxy.relay import wire
from cri_proxy.relay.wire import Buf

Headers: TypeAlias = list[tuple[bytes, bytes]]


def _silent(*args: Any, **kwargs: Any) -> None:
    """hpack logs every decoded field at DEBUG: ~20 µs a call even when nobody listens."""


logging.getLogger("hpack.hpack").debug = _silent  # type: ignore[method-assign]


class BlockError(ValueError):
    """A header block the receiving peer must reject as a connection error (it will: it decodes too)."""


class HeaderBlocks:
    """One direction's header block in progress, and the decoder that follows that direction's HPACK."""

    __slots__ = ("decoder", "end_stream", "frags", "max_block", "max_list", "open", "pending", "sid", "size")

    def __init__(self, decode: bool, max_block: int, max_list: int) -> None:
        self.decoder: hpack.Decoder | None = None
        if decode:
            self.decoder = hpack.Decoder()
            self.decoder.max_header_list_size = 1 << 62  # counted by us, after decoding (see above)
        self.max_block = max_block
        self.max_list = max_list
        self.open = False
        self.sid = 0
        self.end_stream = False
        self.frags: list[Buf] = []
        self.size = 0
        self.pending: deque[int | None] = deque()  # table sizes announced to this sender, not yet ACKed

    # -- SETTINGS ---------------------------------------------------------------------------------
    def announced(self, payload: Buf) -> None:
        """The receiver sent SETTINGS (to this direction's sender): remember its table size, if any."""
        size: int | None = None
        for ident, value in wire.settings_pairs(bytes(payload)):
            if ident == wire.SETTINGS_HEADER_TABLE_SIZE:
                size = value
        self.pending.append(size)

    def acknowledged(self) -> None:
        """The sender ACKed the oldest SETTINGS it had: its table size now binds the sender."""
        if not self.pending:
            return
        size = self.pending.popleft()
        if size is not None and self.decoder is not None:
            self.decoder.max_allowed_table_size = size  # the sender's next block shrinks the table

    # -- blocks -----------------------------------------------------------------------------------
    def headers(self, flags: int, sid: int, payload: Buf) -> bool:
        """A HEADERS frame's fragment; True when it completes the block. Raises BlockError."""
        if self.open:
            raise BlockError("HEADERS frame inside an open header block")
        self.sid, self.end_stream = sid, bool(flags & wire.END_STREAM)
        try:
            fragment = wire.header_fragment(flags, bytes(payload)) if self.decoder is not None else b""
        except wire.FrameError as exc:
            raise BlockError(str(exc)) from exc
        self.frags = [fragment] if fragment else []
        self.size = len(payload)
        self._check()
        self.open = not flags & wire.END_HEADERS
        return not self.open

    def continuation(self, flags: int, sid: int, payload: Buf) -> bool:
        """A CONTINUATION frame's fragment; True when it completes the block. Raises BlockError."""
        if not self.open or sid != self.sid:
            raise BlockError("CONTINUATION frame outside its header block")
        if self.decoder is not None:
            self.frags.append(payload)
        self.size += len(payload)
        self._check()
        self.open = not flags & wire.END_HEADERS
        return not self.open

    def interrupted(self) -> bool:
        """Whether a frame other than CONTINUATION would now break the open block."""
        return self.open

    def _check(self) -> None:
        if self.size > self.max_block:
            raise BlockError(f"header block over {self.max_block} bytes")

    def decode(self) -> tuple[Headers, int] | None:
        """(headers, decoded list size) of the complete block; None when this direction is not read.
        Raises BlockError when the block does not decode (the receiving peer's decoder fails too)."""
        if self.decoder is None:
            return None
        data = b"".join(self.frags) if len(self.frags) != 1 else bytes(self.frags[0])
        self.frags = []
        try:
            headers = cast(Headers, self.decoder.decode(data, raw=True))
        except (hpack.HPACKError, IndexError, ValueError) as exc:
            raise BlockError(f"header block does not decode: {exc}") from exc
        if self.max_list >= 1 << 60:  # not counted in this direction
            return headers, 0
        size = sum(len(name) + len(value) + 32 for name, value in headers)
        return headers, size

    def pending_bytes(self) -> int:
        return sum(len(f) for f in self.frags)


def header_value(headers: Headers, name: bytes) -> bytes | None:
    """The first value of `name` in a decoded header list."""
    for key, value in headers:
        if key == name:
            return value
    return None
