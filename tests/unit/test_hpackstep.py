"""The stepped HPACK decoder against the `hpack` library: the library's encoder makes the blocks
(random fields, Huffman or not, never-indexed, table size changes) and its decoder is the oracle
for arbitrary bytes; every block is decoded in steps of random budgets, from random fragments."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from cri_proxy.relay import wire
from cri_proxy.relay.core import Limits, LinkCore
from cri_proxy.relay.headerblock import BlockError, HeaderBlocks
from cri_proxy.relay.hpackstep import DecodeError, StepDecoder

names = st.one_of(
    st.sampled_from([b":path", b":method", b"content-type", b"grpc-encoding", b"x-a", b"te", b"accept"]),
    st.binary(min_size=1, max_size=20),
)
values = st.one_of(
    st.sampled_from([b"", b"GET", b"/a/b", b"gzip", b"trailers", b"application/grpc"]),
    st.binary(max_size=40),
    st.builds(lambda n, c: bytes([c]) * n, st.integers(0, 5000), st.integers(0, 255)),
)
fields = st.lists(st.tuples(names, values), max_size=12)
budgets = st.lists(st.integers(1, 3000), min_size=1, max_size=8)


def oracle() -> hpack.Decoder:
    dec = hpack.Decoder()
    dec.max_header_list_size = 1 << 62
    return dec


def stepped(dec: StepDecoder, block: bytes, budgets: list[int], **kw: object) -> list[tuple[bytes, bytes]]:
    """Decode with the budgets in turn (the last one repeated) until done."""
    dec.start(block, **kw)  # type: ignore[arg-type]
    at = 0
    while not dec.step(budgets[min(at, len(budgets) - 1)]):
        at += 1
    return dec.fields


def entries(dec: StepDecoder | hpack.Decoder) -> list[tuple[bytes, bytes]]:
    return list(dec.header_table.dynamic_entries)


class RoundTrip(RuleBasedStateMachine):
    """A connection's blocks: the library encodes, both decoders follow; tables stay equal."""

    @initialize()
    def setup(self) -> None:
        self.enc = hpack.Encoder()
        self.ours = StepDecoder()
        self.theirs = oracle()
        self.allowed = 4096

    @rule(
        headers=fields,
        huffman=st.booleans(),
        sensitive=st.lists(st.booleans(), max_size=12),
        budgets=budgets,
    )
    def block(
        self, headers: list[tuple[bytes, bytes]], huffman: bool, sensitive: list[bool], budgets: list[int]
    ) -> None:
        tuples = [
            hpack.NeverIndexedHeaderTuple(n, v) if i < len(sensitive) and sensitive[i] else (n, v)
            for i, (n, v) in enumerate(headers)
        ]
        block = bytes(self.enc.encode(tuples, huffman=huffman))
        try:
            want = [(bytes(n), bytes(v)) for n, v in self.theirs.decode(block, raw=True)]
        except hpack.HPACKDecodingError:  # the encoder left out a table size update the size needs
            with pytest.raises(DecodeError):
                stepped(self.ours, block, budgets)
            return
        # the library's encoder is the sender: when it gets its own table wrong (it can, after some
        # size changes), the receiver sees what its decoder sees; ours must see the same
        assert stepped(self.ours, block, budgets) == want
        assert self.ours.count == len(want)
        assert self.ours.size == sum(len(n) + len(v) + 32 for n, v in want)

    @rule(size=st.integers(0, 8192))
    def table_size(self, size: int) -> None:
        """The receiver announces a table size (ACKed): the encoder's next block starts with updates."""
        self.allowed = size
        self.ours.max_allowed_table_size = size
        self.theirs.max_allowed_table_size = size
        self.enc.header_table_size = size

    @invariant()
    def tables_equal(self) -> None:
        if hasattr(self, "ours"):
            assert entries(self.ours) == entries(self.theirs)
            assert self.ours.header_table.maxsize == self.theirs.header_table.maxsize


TestRoundTrip = RoundTrip.TestCase
TestRoundTrip.settings = settings(max_examples=120, stateful_step_count=15, deadline=None)


def outcome(dec: StepDecoder, block: bytes, budgets: list[int], **kw: object) -> object:
    """What decoding `block` gives: (fields, size, count, over), or the error's text."""
    try:
        stepped(dec, block, budgets, **kw)
    except DecodeError as exc:
        return str(exc)
    return dec.fields, dec.size, dec.count, dec.over


class AtOnceAndStepped(RuleBasedStateMachine):
    """A block of one-byte references decodes at once (or as remembered, when the same bytes come
    again on an unchanged table) exactly as in small steps: same fields (kept names, limit), size,
    count, errors and table, whatever the table holds and the receiver last allowed."""

    @initialize(
        keep=st.sampled_from(
            [
                None,
                frozenset((b":path", b"grpc-encoding")),
                frozenset((b"te",)),
                frozenset((b":method", b"te")),  # a static entry: blocks start with references to it
            ]
        ),
        max_list=st.sampled_from([1 << 62, 1 << 62, 100, 300, 2000]),
    )
    def setup(self, keep: frozenset[bytes] | None, max_list: int) -> None:
        self.enc = hpack.Encoder()
        self.at_once = StepDecoder()
        self.in_steps = StepDecoder()
        self.kw: dict[str, object] = {"keep": keep, "max_list": max_list}
        self.sent: list[bytes] = []

    def both(self, block: bytes, budgets: list[int]) -> None:
        self.sent.append(block)
        want = outcome(self.in_steps, block, budgets, **self.kw)
        assert outcome(self.at_once, block, [1 << 62], **self.kw) == want

    @rule(headers=fields, huffman=st.booleans(), budgets=st.lists(st.integers(1, 16), min_size=1))
    def encoded(self, headers: list[tuple[bytes, bytes]], huffman: bool, budgets: list[int]) -> None:
        """The library's encoder: new fields are literals that fill the table, known ones references."""
        self.both(bytes(self.enc.encode(headers, huffman=huffman)), budgets)

    @rule(
        refs=st.lists(st.one_of(st.integers(0x80, 0xFF), st.integers(0xBE, 0xC8)), min_size=1, max_size=30),
        budgets=st.lists(st.integers(1, 16), min_size=1),
    )
    def references(self, refs: list[int], budgets: list[int]) -> None:
        """References of any one-byte index, some past the table or 0 (refused)."""
        self.both(bytes(refs), budgets)

    @rule(data=st.data(), budgets=st.lists(st.integers(1, 16), min_size=1))
    def again(self, data: st.DataObject, budgets: list[int]) -> None:
        """A block sent before, again (the table may have changed since)."""
        if self.sent:
            self.both(data.draw(st.sampled_from(self.sent)), budgets)

    @rule(size=st.sampled_from([0, 60, 200, 4096, 8192]), encoder_follows=st.booleans())
    def table_size(self, size: int, encoder_follows: bool) -> None:
        """The receiver allows another table size; the encoder's next block may or may not shrink."""
        self.at_once.max_allowed_table_size = self.in_steps.max_allowed_table_size = size
        if encoder_follows:
            self.enc.header_table_size = size

    @invariant()
    def tables_equal(self) -> None:
        if hasattr(self, "at_once"):
            assert entries(self.at_once) == entries(self.in_steps)
            assert self.at_once.header_table.maxsize == self.in_steps.header_table.maxsize


TestAtOnceAndStepped = AtOnceAndStepped.TestCase
TestAtOnceAndStepped.settings = settings(max_examples=300, stateful_step_count=25, deadline=None)


@pytest.mark.parametrize("keep", [None, frozenset((b"x-a",))])
def test_a_block_seen_before_decodes_anew_once_its_entry_was_replaced(keep: frozenset[bytes] | None) -> None:
    """A table with room for one entry: each new literal evicts the last, the table keeps its
    length, and the same reference means another field."""
    enc = hpack.Encoder()
    enc.header_table_size = 60
    dec = StepDecoder()
    dec.max_allowed_table_size = 60
    for value in (b"1", b"2", b"2", b"3"):
        dec.decode(bytes(enc.encode([(b"x-a", value)])), keep=keep)
        assert dec.decode(b"\xbe", keep=keep) == [(b"x-a", value)]
        assert dec.decode(b"\xbe\xbe", keep=keep) == [(b"x-a", value)] * (1 if keep else 2)
        assert dec.size == 2 * (3 + len(value) + 32)


def test_a_block_that_starts_with_references_keeps_the_first_of_each_name_across_the_rest() -> None:
    """The references a block starts with are decoded at once, the rest in steps: a name kept
    from the first part is not kept again from the second."""
    block = bytes(hpack.Encoder().encode([(b":method", b"GET"), (b":method", b"PATCH"), (b"te", b"x")]))
    assert block[0] == 0x82  # a reference to the static `:method: GET`, then literals
    dec = StepDecoder()
    assert not dec.start(block, keep=frozenset((b":method", b"te")), budget=4096)
    assert dec.step(4096)
    assert dec.fields == [(b":method", b"GET"), (b"te", b"x")]
    assert dec.count == 3


def mutate(block: bytes, cuts: list[tuple[int, int]]) -> bytes:
    out = bytearray(block)
    for at, byte in cuts:
        if out:
            out[at % len(out)] = byte
    return bytes(out)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    warmup=fields,
    headers=fields,
    huffman=st.booleans(),
    cuts=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=4),
    chop=st.integers(0, 1 << 16),
    junk=st.binary(max_size=30),
    allowed=st.sampled_from([4096, 4096, 0, 100, 8192]),
    budgets=budgets,
)
def test_any_bytes_decode_as_the_library_decodes_them(
    warmup: list[tuple[bytes, bytes]],
    headers: list[tuple[bytes, bytes]],
    huffman: bool,
    cuts: list[tuple[int, int]],
    chop: int,
    junk: bytes,
    allowed: int,
    budgets: list[int],
) -> None:
    """Mutated, truncated or extended blocks after a warm-up block: same fields, same error, same table."""
    enc = hpack.Encoder()
    ours, theirs = StepDecoder(), oracle()
    first = bytes(enc.encode(warmup, huffman=huffman))
    ours.decode(first)
    theirs.decode(first, raw=True)
    ours.max_allowed_table_size = theirs.max_allowed_table_size = allowed
    block = mutate(bytes(enc.encode(headers, huffman=huffman)), cuts)
    block = block[: chop % (len(block) + 1)] + junk if chop & 1 else block + junk
    try:
        want: list[tuple[bytes, bytes]] | None = [
            (bytes(n), bytes(v)) for n, v in theirs.decode(block, raw=True)
        ]
    except hpack.HPACKDecodingError:
        want = None
    try:
        got: list[tuple[bytes, bytes]] | None = stepped(ours, block, budgets)
    except DecodeError:
        got = None
    assert got == want
    if want is not None:
        assert entries(ours) == entries(theirs)


@settings(max_examples=300, deadline=None)
@given(headers=fields, limit=st.integers(0, 3000), budgets=budgets)
def test_a_list_over_the_limit_is_counted_whole_and_kept_not_at_all(
    headers: list[tuple[bytes, bytes]], limit: int, budgets: list[int]
) -> None:
    enc = hpack.Encoder()
    block = bytes(enc.encode(headers))
    ours, theirs = StepDecoder(), oracle()
    theirs.decode(block, raw=True)
    got = stepped(ours, block, budgets, max_list=limit)
    size = sum(len(n) + len(v) + 32 for n, v in headers)
    assert ours.size == size if size <= limit else ours.size > limit
    assert ours.over == (size > limit)
    assert ours.count == len(headers)
    assert got == ([] if size > limit else headers)
    assert entries(ours) == entries(theirs)  # the table follows the sender all the same


@settings(max_examples=300, deadline=None)
@given(headers=fields, keep=st.frozensets(names, max_size=3), budgets=budgets)
def test_only_the_first_field_of_each_kept_name_is_kept(
    headers: list[tuple[bytes, bytes]], keep: frozenset[bytes], budgets: list[int]
) -> None:
    block = bytes(hpack.Encoder().encode(headers, huffman=True))
    got = stepped(StepDecoder(), block, budgets, keep=keep)
    want, seen = [], set()
    for name, value in headers:
        if name in keep and name not in seen:
            seen.add(name)
            want.append((name, value))
    assert got == want


def test_a_big_huffman_string_takes_many_bounded_steps() -> None:
    enc = hpack.Encoder()
    value = b"a" * 40_000
    block = bytes(enc.encode([(b"x-big", value)], huffman=True))
    dec = StepDecoder()
    dec.start(block)
    steps = 1
    while not dec.step(1000):
        steps += 1
    assert steps >= len(block) // 4096  # it stopped inside the string, more than once
    assert dec.fields == [(b"x-big", value)]


def test_many_references_cost_no_memory_past_the_limit() -> None:
    """A 4000-byte entry referenced 100 000 times: counted (~400 MB), nothing kept."""
    insert = bytes(hpack.Encoder().encode([(b"x-bomb", b"b" * 4000)], huffman=False))
    block = insert + b"\xbe" * 100_000
    dec = StepDecoder()
    assert dec.decode(block, max_list=16 << 20) == []
    assert dec.over and dec.count == 100_001


@pytest.mark.parametrize(
    ("block", "why"),
    [
        (b"\x80", "index 0"),
        (b"\xbe", "index past the table"),
        (b"\x82\x3f\xe1\x1f", "size update after a field"),
        (b"\x3f\xe2\x1f", "size update over the allowed size"),
        (b"\x00\x85ab", "string ends early"),
        (b"\x00\x81\x00\x00", "Huffman string with EOS padding of zeros"),
        (b"\xff\xff\xff\xff\xff\xff\x01", "integer too long"),
        (b"\x0f", "integer ends early"),
    ],
)
def test_bad_blocks_are_refused_as_the_library_refuses_them(block: bytes, why: str) -> None:
    with pytest.raises(hpack.HPACKDecodingError):
        oracle().decode(block, raw=True)
    with pytest.raises(DecodeError):
        StepDecoder().decode(block)


@settings(max_examples=300, deadline=None)
@given(
    blocks=st.lists(fields, min_size=1, max_size=4),
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=6),
    budgets=budgets,
    padded=st.booleans(),
)
def test_header_blocks_from_random_fragments(
    blocks: list[list[tuple[bytes, bytes]]], sizes: list[int], budgets: list[int], padded: bool
) -> None:
    """HEADERS + CONTINUATIONs cut at random places, decoded a budget at a time: the sender's fields."""
    enc = hpack.Encoder()
    hb = HeaderBlocks(True, 1 << 20, 1 << 30)
    for sid, headers in enumerate(blocks, start=1):
        block = bytes(enc.encode(headers))
        pieces, at, turn = [], 0, 0
        while True:
            size = sizes[turn % len(sizes)]
            pieces.append(block[at : at + size])
            at += size
            turn += 1
            if at >= len(block):
                break
        first = bytes([2]) + pieces[0] + b"\0\0" if padded else pieces[0]
        flags = (wire.PADDED if padded else 0) | (wire.END_HEADERS if len(pieces) == 1 else 0)
        done = hb.headers(flags, sid, first)
        for i, piece in enumerate(pieces[1:], start=2):
            done = hb.continuation(wire.END_HEADERS if i == len(pieces) else 0, sid, piece)
        assert done
        turn, decoded = 0, hb.decode(budgets[0])
        while decoded is None:
            turn += 1
            decoded = hb.decode(budgets[turn % len(budgets)])
        assert decoded == (headers, sum(len(n) + len(v) + 32 for n, v in headers))


def test_a_block_that_does_not_decode_is_a_block_error() -> None:
    hb = HeaderBlocks(True, 1 << 20, 1 << 30)
    assert hb.headers(wire.END_HEADERS, 1, b"\xbe")
    with pytest.raises(BlockError):
        hb.decode()
    assert not hb.decoding


# -- the link core: a big block is decoded over several turns; the client's next frames wait ------


def _request(enc: hpack.Encoder, extra: list[tuple[bytes, bytes]]) -> bytes:
    return bytes(
        enc.encode(
            [
                (b":method", b"POST"),
                (b":scheme", b"http"),
                (b":path", b"/runtime.v1.RuntimeService/Version"),
                (b":authority", b"x"),
                (b"content-type", b"application/grpc"),
                *extra,
            ],
            huffman=False,
        )
    )


def _frames(sid: int, block: bytes) -> bytes:
    pieces = [block[i : i + 16384] for i in range(0, len(block), 16384)]
    out = [wire.frame(wire.HEADERS, wire.END_HEADERS if len(pieces) == 1 else 0, sid, pieces[0])]
    for i, piece in enumerate(pieces[1:], start=2):
        out.append(wire.frame(wire.CONTINUATION, wire.END_HEADERS if i == len(pieces) else 0, sid, piece))
    return b"".join(out)


@pytest.mark.parametrize("over", [False, True])
def test_core_decodes_a_big_block_over_turns_while_the_client_waits(over: bool) -> None:
    core = LinkCore(lambda path: None, Limits(header_list=(1 << 20) if over else 16 << 20))
    enc = hpack.Encoder()
    opening = wire.PREFACE + wire.settings()
    big = _frames(1, _request(enc, [(b"x-f%d" % i, b"v" * 8) for i in range(40_000)]))
    after = wire.frame(wire.DATA, wire.END_STREAM, 1, wire.grpc_message(b"")) + _frames(3, _request(enc, []))
    core.receive_from_client(opening + big + after)
    sent = b"".join(core.take_runtime())
    assert sent == opening + big  # the block went on whole; what follows waits for its decoding
    assert core.decoding() and not core.wants_client()
    core.receive_from_client(wire.frame(wire.PING, 0, 0, b"12345678"))  # arrives meanwhile: waits too
    assert not core.take_runtime()
    turns = 0
    while core.decoding():
        core.decode_more()
        turns += 1
    assert turns > 3
    rest = b"".join(core.take_runtime())
    client = b"".join(core.take_client())
    assert core.wants_client() and not core.client_dead
    if over:  # refused by the proxy alone: RST_STREAM FRAME_SIZE_ERROR to the client, CANCEL upstream
        assert client == wire.rst_stream(1, wire.FRAME_SIZE_ERROR)
        assert rest.startswith(wire.rst_stream(1, wire.CANCEL))
        assert 1 not in core.streams and 3 in core.streams
    else:
        assert not client and 1 in core.streams and 3 in core.streams
    assert rest.endswith(after + wire.frame(wire.PING, 0, 0, b"12345678"))


def test_the_runtimes_first_settings_reach_the_client_with_the_header_list_limit() -> None:
    core = LinkCore(lambda path: None, Limits())
    core.receive_from_client(wire.PREFACE + wire.settings())
    first = wire.settings(((wire.SETTINGS_MAX_FRAME_SIZE, 16384),))
    later = wire.settings(((wire.SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20),))
    core.receive_from_runtime(first + wire.SETTINGS_ACK + later)
    assert b"".join(core.take_client()) == (
        wire.settings(((wire.SETTINGS_MAX_FRAME_SIZE, 16384), (wire.SETTINGS_MAX_HEADER_LIST_SIZE, 16 << 20)))
        + wire.SETTINGS_ACK
        + later
    )


def test_a_runtime_that_announces_its_own_header_list_limit_is_heard_as_it_is() -> None:
    core = LinkCore(lambda path: None, Limits())
    own = wire.settings(((wire.SETTINGS_MAX_HEADER_LIST_SIZE, 8192),))
    core.receive_from_runtime(own)
    assert not core.take_client()  # the client has not sent its preface yet: the SETTINGS waits
    core.receive_from_client(wire.PREFACE)
    assert b"".join(core.take_client()) == own


def test_a_client_that_does_not_speak_http2_gets_the_runtimes_settings_as_they_are() -> None:
    core = LinkCore(lambda path: None, Limits())
    first = wire.settings(((wire.SETTINGS_MAX_FRAME_SIZE, 16384),))
    core.receive_from_runtime(first)
    core.receive_from_client(b"GET / HTTP/1.1\r\n\r\n")
    assert b"".join(core.take_client()) == first and core.client_dead


def test_a_big_block_that_turns_out_broken_goes_to_the_runtime_with_what_waited() -> None:
    """The bad field is at the end: found turns later; the runtime (which judges it) has it all."""
    core = LinkCore(lambda path: None, Limits())
    enc = hpack.Encoder()
    opening = wire.PREFACE + wire.settings()
    big = _frames(1, _request(enc, [(b"x-f%d" % i, b"v" * 8) for i in range(40_000)]) + b"\xff\xff\x7f")
    after = wire.frame(wire.PING, 0, 0, b"12345678")
    core.receive_from_client(opening + big + after)
    while core.decoding():
        core.decode_more()
    assert b"".join(core.take_runtime()) == opening + big + after
    assert core.client_dead and not core.take_client()
    core.receive_from_client(after)
    assert not core.take_runtime()  # the client's later bytes are dropped


@pytest.mark.parametrize("ending", ["trailers-only", "reset"])
def test_a_stream_the_runtime_ends_while_its_block_is_decoded_is_not_followed(ending: str) -> None:
    """containerd decodes faster: it may answer (an unknown method: at once) before the proxy is done."""
    core = LinkCore(lambda path: None, Limits())
    enc = hpack.Encoder()
    core.receive_from_client(wire.PREFACE + wire.settings())
    core.receive_from_client(_frames(1, _request(enc, [(b"x-f%d" % i, b"v" * 8) for i in range(40_000)])))
    assert core.decoding()
    core.receive_from_runtime(wire.settings())
    if ending == "reset":
        answer = wire.rst_stream(1, wire.PROTOCOL_ERROR)
    else:
        flags = wire.END_STREAM | wire.END_HEADERS
        answer = wire.frame(wire.HEADERS, flags, 1, wire.status_block(12, "", True))
    core.receive_from_runtime(answer)
    assert b"".join(core.take_client()).endswith(answer)
    while core.decoding():
        core.decode_more()
    assert not core.streams and not core.busy() and core.last_stream == 1
