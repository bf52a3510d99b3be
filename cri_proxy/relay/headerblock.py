"""One direction's header blocks (HEADERS + CONTINUATIONs): gathered, capped, HPACK-decoded in steps.

The relay forwards every header block unchanged, so its decoder must see exactly the bytes the
receiving peer's decoder sees, in the same order, with the same table size limit. A table size the
receiver announces (SETTINGS_HEADER_TABLE_SIZE) binds the sender's encoder once the sender has
acknowledged it, so the decoder takes it when that ACK passes, not when the SETTINGS does.

Bounds: a block's encoded size is capped (`max_block`); the decoded size of its header list is
counted as it is decoded (name + value + 32 per field, as SETTINGS_MAX_HEADER_LIST_SIZE counts it)
and a list over `max_list` is reported, not refused here: the table state stays in sync, the stream
alone is ended. Only the fields named in `keep` are kept, and none once the list is over the limit.
A block is decoded in steps of bounded work (`decode(budget)`): a big one takes several loop turns.
"""

from __future__ import annotations

from collections import deque
from typing import TypeAlias

from cri_proxy.relay import wire
from cri_proxy.relay.hpackstep import DecodeError, StepDecoder
from cri_proxy.relay.wire import Buf

Headers: TypeAlias = list[tuple[bytes, bytes]]
_PADDED_OR_PRIORITY = wire.PADDED | wire.PRIORITY_FLAG  # a HEADERS payload that is more than its fragment


class BlockError(ValueError):
    """A header block the receiving peer must reject as a connection error (it will: it decodes too)."""


class HeaderBlocks:
    """One direction's header block in progress, and the decoder that follows that direction's HPACK."""

    __slots__ = (
        "decoder",
        "decoding",
        "end_stream",
        "frags",
        "keep",
        "max_block",
        "max_list",
        "open",
        "pending",
        "sid",
        "size",
    )

    def __init__(
        self, decode: bool, max_block: int, max_list: int, keep: frozenset[bytes] | None = None
    ) -> None:
        self.decoder: StepDecoder | None = StepDecoder() if decode else None
        self.max_block = max_block
        self.max_list = max_list
        self.keep = keep
        self.decoding = False  # a complete block is being decoded (the sender's next frames wait)
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
        if self.decoder is None:
            self.frags = []
        elif flags & _PADDED_OR_PRIORITY:
            try:
                fragment = wire.header_fragment(flags, bytes(payload))
            except wire.FrameError as exc:
                raise BlockError(str(exc)) from exc
            self.frags = [fragment] if fragment else []
        else:
            self.frags = [payload] if payload else []
        size = self.size = len(payload)
        if size > self.max_block:
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

    def decode(self, budget: int = 1 << 62) -> tuple[Headers, int] | None:
        """(kept headers, decoded list size) of the complete block, once about `budget` units of work
        finish it; None while it is not done (call again), and when this direction is not read.
        Raises BlockError when the block does not decode (the receiving peer's decoder fails too)."""
        decoder = self.decoder
        if decoder is None:
            return None
        if not self.decoding:
            if decoder.start(self.take(), self.max_list, self.keep, budget):
                return decoder.fields, decoder.size  # a short block of references: at once
            self.decoding = True
        return self._step(decoder, budget)

    def _step(self, decoder: StepDecoder, budget: int) -> tuple[Headers, int] | None:
        try:
            done = decoder.step(budget)
        except DecodeError as exc:
            self.decoding = False
            raise BlockError(f"header block does not decode: {exc}") from exc
        if not done:
            return None
        self.decoding = False
        return decoder.fields, decoder.size

    def take(self) -> bytes:
        """The complete block's bytes, taken out of the block (to `decode_taken` later)."""
        frags, self.frags = self.frags, []
        return bytes(frags[0]) if len(frags) == 1 else b"".join(frags)

    def decode_taken(self, data: bytes) -> tuple[Headers, int]:
        """Decode, whole, a block `take`n earlier: this direction's blocks must be decoded in the
        order they came. Raises BlockError."""
        decoder = self.decoder
        if decoder is None or self.decoding:
            raise BlockError("no block can be decoded now")
        if decoder.start(data, self.max_list, self.keep, 1 << 62):
            return decoder.fields, decoder.size
        self.decoding = True
        decoded = self._step(decoder, 1 << 62)
        assert decoded is not None  # no budget: done at once
        return decoded

    def pending_bytes(self) -> int:
        return sum(len(f) for f in self.frags)


def header_value(headers: Headers, name: bytes) -> bytes | None:
    """The first value of `name` in a decoded header list."""
    for key, value in headers:
        if key == name:
            return value
    return None
