"""An HPACK decoder (RFC 7541) for the few response headers a unary gRPC call gets.

ctl's own, because importing the hpack package costs about as much as the rest of a `ctl version`
(it sets up logging and typing): docs/performance.md. Decoding only; ctl's requests are written
as literals without indexing (`h2unary.encode_headers`), which needs no table at all.
"""

from __future__ import annotations

# RFC 7541 Appendix A
STATIC = (
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
)

# RFC 7541 Appendix B: the code length of each symbol 0-256 (base 36). The code is canonical:
# codes follow from the lengths, in order of (length, symbol).
_LENGTHS = (
    "dnsssssssoussussssssssusssssssss6aacd68baa8b8666555666666678f6cad67777777777777777777777878djde6f5656566"
    "6577666567655677777fbedskmkkmmmnmnnnnnonoomnonnnnlmnmnnomlkmmnnlnmmolmnnllmlnmnnkmmmnmmnqqkjmnmpqqqrrqop"
    "jlqrrqrollqqsrrrkoklmllnmmppooqnqrqqrrrrrsrrrrrqu"
)
EOS = 256
_codes: dict[tuple[int, int], int] = {}


class HpackError(ValueError):
    """A header block that does not decode."""


def code_lengths() -> list[int]:
    return [int(c, 36) for c in _LENGTHS]


def _huffman_codes() -> dict[tuple[int, int], int]:
    """(length, code) -> symbol, built on first use."""
    if not _codes:
        lengths = code_lengths()
        code, previous = -1, 0
        for symbol in sorted(range(len(lengths)), key=lambda s: (lengths[s], s)):
            code = (code + 1) << (lengths[symbol] - previous)
            previous = lengths[symbol]
            _codes[(previous, code)] = symbol
    return _codes


def huffman_decode(data: bytes) -> bytes:
    codes = _huffman_codes()
    out = bytearray()
    code = length = 0
    for byte in data:
        for shift in range(7, -1, -1):
            code = (code << 1) | ((byte >> shift) & 1)
            length += 1
            symbol = codes.get((length, code))
            if symbol is not None:
                if symbol == EOS:
                    raise HpackError("EOS in a Huffman string")
                out.append(symbol)
                code = length = 0
            elif length > 30:
                raise HpackError("bad Huffman code")
    if length > 7 or code != (1 << length) - 1:  # padding: fewer than 8 bits, all ones
        raise HpackError("bad Huffman padding")
    return bytes(out)


class Decoder:
    """One connection's decoding state: the dynamic table (newest first) and its size limit."""

    def __init__(self, max_size: int = 4096) -> None:
        self.table: list[tuple[str, str]] = []
        self.size = 0
        self.max_size = max_size

    def _integer(self, data: bytes, at: int, bits: int) -> tuple[int, int]:
        if at >= len(data):
            raise HpackError("truncated integer")
        limit = (1 << bits) - 1
        value = data[at] & limit
        at += 1
        if value < limit:
            return value, at
        shift = 0
        while True:
            if at >= len(data):
                raise HpackError("truncated integer")
            byte = data[at]
            at += 1
            value += (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value, at

    def _string(self, data: bytes, at: int) -> tuple[str, int]:
        if at >= len(data):
            raise HpackError("truncated string")
        huffman = data[at] & 0x80
        length, at = self._integer(data, at, 7)
        raw = data[at : at + length]
        if len(raw) != length:
            raise HpackError("truncated string")
        return (huffman_decode(raw) if huffman else raw).decode("utf-8", "replace"), at + length

    def _entry(self, index: int) -> tuple[str, str]:
        if 1 <= index <= len(STATIC):
            return STATIC[index - 1]
        if 0 < index - len(STATIC) <= len(self.table):
            return self.table[index - len(STATIC) - 1]
        raise HpackError(f"header index {index} out of range")

    def _add(self, name: str, value: str) -> None:
        self.table.insert(0, (name, value))
        self.size += 32 + len(name.encode()) + len(value.encode())
        self._evict()

    def _evict(self) -> None:
        while self.size > self.max_size and self.table:
            name, value = self.table.pop()
            self.size -= 32 + len(name.encode()) + len(value.encode())

    def decode(self, data: bytes) -> list[tuple[str, str]]:
        fields: list[tuple[str, str]] = []
        at = 0
        while at < len(data):
            byte = data[at]
            if byte & 0x80:  # indexed
                index, at = self._integer(data, at, 7)
                fields.append(self._entry(index))
                continue
            if byte & 0xE0 == 0x20:  # dynamic table size update
                self.max_size, at = self._integer(data, at, 5)
                self._evict()
                continue
            bits = 6 if byte & 0x40 else 4  # with incremental indexing, or without / never
            index, at = self._integer(data, at, bits)
            if index:
                name = self._entry(index)[0]
            else:
                name, at = self._string(data, at)
            value, at = self._string(data, at)
            if bits == 6:
                self._add(name, value)
            fields.append((name, value))
        return fields
