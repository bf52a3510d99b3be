"""An HPACK decoder that works in steps of bounded cost, so one big header block never holds the
event loop: the frame relay decodes a block a step per loop turn while that connection waits.

It follows RFC 7541 as the `hpack` library's decoder does (same errors for the same input; the
dynamic table is that library's `HeaderTable`), with three differences that bound it:
- `step(budget)` stops once about `budget` units of work are done (a unit ~ a Huffman-coded byte;
  a field costs a few) and the next call resumes where it stopped, even inside a Huffman string;
- the decoded header list is only counted (name + value + 32 a field); fields are kept while it
  stays under `max_list`, and only the first of each name in `keep` (None: all of them). Past the
  limit nothing more is kept, but the block is still decoded to its end: the dynamic table must
  follow the sender's (runs of one-byte references, which leave it alone, are skipped unread);
- a block's work is linear in its size (the library copies the rest of the block per literal).
A short block of nothing but one-byte references (a client's block from its second call on, a
runtime's answers) is decoded at once by table lookups, and from memory when the same bytes come
again on an unchanged table: what the steps would give, without them. A short block that only
starts with such references (a new grpc-timeout after them) has those decoded so, the rest in steps.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Generator, Iterator

from hpack import HPACKDecodingError, InvalidTableSizeError
from hpack.huffman_table import HUFFMAN_TABLE
from hpack.table import HeaderTable

Field = tuple[bytes, bytes]

FIELD_COST = 16  # work units a field costs besides its strings' bytes
PLAIN_PER_UNIT = 256  # bytes of a plain (not Huffman-coded) string that cost one unit
HUFFMAN_SLICE = 4096  # Huffman-coded bytes decoded between checks of the budget
MAX_INT_BYTES = 4  # continuation octets of an integer with their high bit set (as the library)
SEEN_BLOCKS = 32  # blocks of references remembered per decoder (a client's few kinds of call; ~15 KB at most)

_COMPLETE, _EMIT, _FAIL = 1, 2, 4
_ONE_BYTE_REFERENCES = re.compile(rb"[\x80-\xfe]+")  # indexed fields with an index under 127
_STATIC = HeaderTable.STATIC_TABLE
_STATIC_LENGTH = len(_STATIC)
_FIRST_DYNAMIC = 0x80 + _STATIC_LENGTH + 1  # the one-byte reference to dynamic entry 1
_STATIC_BY_BYTE = {0x81 + i: entry for i, entry in enumerate(_STATIC)}


class DecodeError(ValueError):
    """The block does not decode: the receiving peer answers with COMPRESSION_ERROR."""


def _integer(data: bytes, pos: int, prefix: int) -> tuple[int, int]:
    """(value, position after it) of the integer with an N-bit prefix at `pos`."""
    if pos >= len(data):
        raise DecodeError("header block ends inside an integer")
    limit = (1 << prefix) - 1
    value = data[pos] & limit
    pos += 1
    if value < limit:
        return value, pos
    shift = 0
    for _ in range(MAX_INT_BYTES + 1):
        if pos >= len(data):
            raise DecodeError("header block ends inside an integer")
        byte = data[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise DecodeError("integer representation is too long")


class _Seen:
    """A block of references as it decoded, and the table state it decoded in: the newest dynamic
    entry (each addition puts a new tuple first; held here, no other object can share its id) and
    the number of entries (evictions only lower it). Same state: same entries, same result."""

    __slots__ = ("count", "entries", "fields", "keep", "max_list", "newest", "over", "size")

    def __init__(
        self,
        dynamic: deque[Field],
        keep: frozenset[bytes] | None,
        max_list: int,
        fields: tuple[Field, ...],
        size: int,
        count: int,
        over: bool,
    ) -> None:
        self.newest = dynamic[0] if dynamic else None
        self.entries = len(dynamic)
        self.keep, self.max_list = keep, max_list
        self.fields, self.size, self.count, self.over = fields, size, count, over


class StepDecoder:
    """One direction's HPACK state; `start(block)` then `step(budget)` until it returns True."""

    def __init__(self) -> None:
        self.header_table = HeaderTable()
        self.max_allowed_table_size = self.header_table.maxsize  # the last size the receiver announced, ACKed
        self.fields: list[Field] = []
        self.size = 0  # the decoded list's size so far
        self.count = 0  # fields decoded so far
        self.over = False  # the list went over max_list: fields are no longer kept
        self.max_list = 1 << 62
        self.keep: frozenset[bytes] | None = None
        self._block: bytes | None = None  # started, not stepped yet
        self._seen: dict[bytes, _Seen] = {}  # blocks of references decoded lately, by their bytes
        self._kept: set[bytes] = set()  # kept names of the block
        self._run: Iterator[None] | None = None
        self._work = 0
        self._spent = 0  # work done at once, before the first step (it counts in that step)

    def start(
        self, block: bytes, max_list: int = 1 << 62, keep: frozenset[bytes] | None = None, budget: int = 0
    ) -> bool:
        """Begin decoding a complete header block; True when it is done already: a short block of
        references that a first `step(budget)` would finish is decoded at once (no step needed)."""
        self.max_list, self.keep = max_list, keep
        self._run = None
        self._block = block
        if len(block) * FIELD_COST < budget:
            return self._at_once(block)
        self.fields, self.size, self.count, self.over = [], 0, 0, False
        return False

    def step(self, budget: int) -> bool:
        """Decode about `budget` units more; True when the block is done. Raises DecodeError."""
        if self._run is None:
            block = self._block
            if block is None:
                return True
            if len(block) * FIELD_COST >= budget:
                self._in_steps(block)
            elif self._at_once(block):
                return True
        assert self._run is not None
        self._work = budget - self._spent
        self._spent = 0
        try:
            next(self._run)
        except StopIteration:
            self._run = None
            return True
        except HPACKDecodingError as exc:  # a bad index or table size, from the table
            self._run = None
            raise DecodeError(str(exc) or type(exc).__name__) from exc
        except DecodeError:
            self._run = None
            raise
        return False

    def decode(
        self, block: bytes, max_list: int = 1 << 62, keep: frozenset[bytes] | None = None
    ) -> list[Field]:
        """A whole block at once (for tests and trusted peers)."""
        self.start(block, max_list, keep)
        while not self.step(1 << 62):
            pass
        return self.fields

    def _at_once(self, data: bytes) -> bool:
        """Decode at once what a first step would decode by table lookups: a block of one-byte
        references to entries that exist, with no table size update due (the usual block after a
        connection's first call): True, done. Else the references it starts with (when no size
        update is due), and the generator takes the rest: False. Same fields, count, size, errors
        and work as in steps. Such a block leaves the table as it is, so the same bytes decode the
        same while no entry was added or evicted since (`_Seen`)."""
        self._block = None
        table = self.header_table
        keep, max_list = self.keep, self.max_list
        pos = 0
        if table.maxsize <= self.max_allowed_table_size:  # else the block must start with a size update
            dynamic = table.dynamic_entries
            seen = self._seen.get(data)
            if (
                seen is not None
                and len(dynamic) == seen.entries
                and (not seen.entries or dynamic[0] is seen.newest)
                and keep is seen.keep
                and max_list == seen.max_list
            ):  # the block decodes as it did: same table entries, same filter and limit
                self.fields, self.size = list(seen.fields), seen.size
                self.count, self.over = seen.count, seen.over
                return True
            pos = self._references(data, dynamic)
            if pos == len(data):
                if len(self._seen) >= SEEN_BLOCKS:
                    self._seen.clear()
                self._seen[data] = _Seen(
                    dynamic, keep, max_list, tuple(self.fields), self.size, self.count, self.over
                )
                return True
            self._run = self._decode(data, pos)
        else:
            self._in_steps(data)
        return False

    def _in_steps(self, data: bytes) -> None:
        """Decode the whole block in steps, from its first byte."""
        self._block = None
        self.fields, self.size, self.count, self.over = [], 0, 0, False
        self._kept = set()
        self._spent = 0
        self._run = self._decode(data)

    def _references(self, data: bytes, dynamic: deque[Field]) -> int:
        """Decode the one-byte references to existing entries that `data` starts with (as `_decode`
        would, in one step); returns where they end."""
        run = _ONE_BYTE_REFERENCES.match(data)
        stop = 0 if run is None else run.end()
        keep, max_list = self.keep, self.max_list
        fields: list[Field] = []
        kept: set[bytes] = set()
        size = 0
        over = False
        first_beyond = _FIRST_DYNAMIC + len(dynamic)
        pos = 0
        while pos < stop:
            byte = data[pos]
            if byte == 0x80 or byte >= first_beyond:
                break  # not an entry: `_decode` refuses it
            name, value = _STATIC_BY_BYTE[byte] if byte < _FIRST_DYNAMIC else dynamic[byte - _FIRST_DYNAMIC]
            pos += 1
            size += len(name) + len(value) + 32
            if size > max_list:
                over = True
                fields = []
                break
            if keep is None:
                fields.append((name, value))
            elif name in keep and name not in kept:
                kept.add(name)
                fields.append((name, value))
        spent = pos * FIELD_COST
        if over and pos < stop:  # refused: the rest of the run is counted, not read (as `_decode` skips it)
            spent += (stop - pos) // PLAIN_PER_UNIT + 1
            pos = stop
        self.fields, self.size, self.count, self.over = fields, size, pos, over
        self._kept = kept
        self._spent = spent
        return pos

    # -- the decoder, as a generator that yields when the budget is spent ---------------------------
    def _decode(self, data: bytes, pos: int = 0) -> Iterator[None]:
        """The block from `pos` on (what `_at_once` left), its fields after those decoded so far."""
        kept = self._kept
        keep, max_list = self.keep, self.max_list
        end = len(data)
        table = self.header_table
        dynamic = table.dynamic_entries
        while pos < end:
            if self._work <= 0:
                yield
            first = data[pos]
            if first & 0x80 and self.over:
                # refused already: a run of one-byte references changes no table, so it is skipped at
                # C speed (the size stops being exact; it is over the limit whatever they add)
                run = _ONE_BYTE_REFERENCES.match(data, pos)
                if run is not None:
                    self.count += run.end() - pos
                    self._work -= (run.end() - pos) // PLAIN_PER_UNIT + 1
                    pos = run.end()
                    continue
            if first & 0x80:  # indexed field
                if first != 0xFF:  # the index fits the first byte (the usual case): no integer to read
                    index, pos = first & 0x7F, pos + 1
                else:
                    index, pos = _integer(data, pos, 7)
                if 0 < index <= _STATIC_LENGTH:
                    name, value = _STATIC[index - 1]
                elif 0 <= index - _STATIC_LENGTH - 1 < len(dynamic):
                    name, value = dynamic[index - _STATIC_LENGTH - 1]
                else:
                    name, value = table.get_by_index(index)  # raises the library's error
                self._work -= FIELD_COST
            else:
                if first & 0x40:
                    prefix, indexing = 0x3F, True
                elif first & 0x20:  # dynamic table size update
                    if self.count:
                        raise DecodeError("table size update after a header field")
                    size, pos = _integer(data, pos, 5)
                    if size > self.max_allowed_table_size:
                        raise InvalidTableSizeError("encoder exceeded the allowed table size")
                    table.maxsize = size
                    self._work -= FIELD_COST
                    continue
                else:
                    prefix, indexing = 0x0F, False
                if first & prefix != prefix:  # the name's index fits the first byte
                    index, pos = first & prefix, pos + 1
                else:
                    index, pos = _integer(data, pos, 4 if prefix == 0x0F else 6)
                if index:
                    name = table.get_by_index(index)[0]
                else:
                    short = self._short_string(data, pos)
                    if short is not None:
                        name, pos = short
                    else:
                        name_out: list[bytes] = []
                        pos = yield from self._string(data, pos, name_out)
                        name = name_out[0]
                short = self._short_string(data, pos)
                if short is not None:
                    value, pos = short
                else:
                    value_out: list[bytes] = []
                    pos = yield from self._string(data, pos, value_out)
                    value = value_out[0]
                self._work -= FIELD_COST
                if indexing:
                    table.add(name, value)
            # the field: counted; kept while the list is under the limit (the first of each kept name)
            self.count += 1
            self.size += len(name) + len(value) + 32
            if self.over:
                continue
            if self.size > max_list:
                self.over = True
                self.fields = []
            elif keep is None:
                self.fields.append((name, value))
            elif name in keep and name not in kept:
                kept.add(name)
                self.fields.append((name, value))
        if table.maxsize > self.max_allowed_table_size:
            raise InvalidTableSizeError("encoder did not shrink the table to the allowed size")

    def _short_string(self, data: bytes, pos: int) -> tuple[bytes, int] | None:
        """(string, position after it) when it decodes without yielding: plain, or Huffman-coded
        within one slice while budget is left (what `_string` would do in one go, without the cost
        of a generator); None otherwise (then `_string` takes it). Same errors as `_string`."""
        coded, start, stop = _string_span(data, pos)
        length = stop - start
        if not coded:
            self._work -= length // PLAIN_PER_UNIT
            return data[start:stop], stop
        if length > HUFFMAN_SLICE or (length and self._work <= 0):
            return None
        decoded = bytearray()
        _, flags = _huffman(data, start, stop, 0, _COMPLETE, decoded)  # an empty string is complete
        self._work -= length
        if not flags & _COMPLETE:
            raise DecodeError("incomplete Huffman string")
        return bytes(decoded), stop

    def _string(self, data: bytes, pos: int, out: list[bytes]) -> Generator[None, None, int]:
        """A string literal at `pos` into `out`; returns the position after it."""
        coded, pos, stop = _string_span(data, pos)
        length = stop - pos
        if not coded:
            self._work -= length // PLAIN_PER_UNIT
            out.append(data[pos:stop])
            return stop
        decoded = bytearray()
        state, flags = 0, _COMPLETE  # an empty string is complete
        while pos < stop:
            if self._work <= 0:
                yield
            upto = min(stop, pos + HUFFMAN_SLICE)
            state, flags = _huffman(data, pos, upto, state, flags, decoded)
            self._work -= upto - pos
            pos = upto
        if not flags & _COMPLETE:
            raise DecodeError("incomplete Huffman string")
        out.append(bytes(decoded))
        return stop


def _string_span(data: bytes, pos: int) -> tuple[bool, int, int]:
    """The string literal at `pos`: (Huffman-coded, where its bytes start, where they stop)."""
    if pos >= len(data):
        raise DecodeError("header block ends before a string")
    first = data[pos]
    if first & 0x7F != 0x7F:  # the length fits the first byte (the usual case): no integer to read
        length, start = first & 0x7F, pos + 1
    else:
        length, start = _integer(data, pos, 7)
    coded = bool(first & 0x80)
    stop = start + length
    if stop > len(data):
        raise DecodeError("header block ends inside a string")
    return coded, start, stop


def _huffman(data: bytes, start: int, stop: int, state: int, flags: int, out: bytearray) -> tuple[int, int]:
    """Huffman-decode `data[start:stop]` onto `out`, from the decoder state (`state`, `flags`) a
    previous slice ended in; returns the state this slice ends in (a string may span slices)."""
    table = HUFFMAN_TABLE
    for byte in data[start:stop]:
        state, flags, sym = table[(state << 4) | (byte >> 4)]
        if flags & _FAIL:
            raise DecodeError("invalid Huffman string")
        if flags & _EMIT:
            out.append(sym)
        state, flags, sym = table[(state << 4) | (byte & 0x0F)]
        if flags & _FAIL:
            raise DecodeError("invalid Huffman string")
        if flags & _EMIT:
            out.append(sym)
    return state, flags
