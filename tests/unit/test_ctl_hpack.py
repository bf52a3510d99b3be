"""ctl's HPACK decoder against the hpack package's encoder (the one the proxy's tests trust):
the RFC 7541 tables, Huffman strings, the dynamic table across blocks, and bad input."""

from __future__ import annotations

import hpack
import pytest
from hpack.huffman_constants import REQUEST_CODES_LENGTH
from hpack.table import HeaderTable
from hypothesis import given
from hypothesis import strategies as st

from cri_proxy.ctl.hpackdecode import STATIC, Decoder, HpackError, code_lengths, huffman_decode


def test_tables_are_rfc_7541s() -> None:
    assert [(n.decode(), v.decode()) for n, v in HeaderTable.STATIC_TABLE] == list(STATIC)
    assert code_lengths() == list(REQUEST_CODES_LENGTH)


_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
_headers = st.lists(st.tuples(_text.map(str.lower).filter(bool), _text), min_size=1, max_size=8)


@given(st.lists(_headers, min_size=1, max_size=4), st.booleans())
def test_decodes_what_hpack_encodes(blocks: list[list[tuple[str, str]]], huffman: bool) -> None:
    encoder, decoder = hpack.Encoder(), Decoder()
    for block in blocks:  # several blocks on one connection: the dynamic table carries over
        assert decoder.decode(encoder.encode(block, huffman=huffman)) == block


def test_grpc_response_headers_and_trailers() -> None:
    encoder, decoder = hpack.Encoder(), Decoder()
    head = [(":status", "200"), ("content-type", "application/grpc")]
    trailers = [("grpc-status", "5"), ("grpc-message", "container %22x%22 not found")]
    assert decoder.decode(encoder.encode(head)) == head
    assert decoder.decode(encoder.encode(trailers)) == trailers
    assert decoder.decode(encoder.encode(head)) == head  # now from the dynamic table


@pytest.mark.parametrize(
    "block",
    [b"\xff", b"\xbf\x01", b"\x00\x85ab", b"\x00\x81\xff\x00", b"\x40\x01a\x81\x00"],
    ids=["truncated-int", "index-out-of-range", "truncated-string", "huffman-eos", "bad-padding"],
)
def test_bad_blocks_are_errors(block: bytes) -> None:
    with pytest.raises(HpackError):
        Decoder().decode(block)


def test_huffman_strings() -> None:
    from hpack.huffman import HuffmanEncoder
    from hpack.huffman_constants import REQUEST_CODES

    encode = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH).encode
    for text in (b"", b"application/grpc", b"www.example.com", bytes(range(256))):
        assert huffman_decode(encode(text)) == text
