"""CPU lists: parsing, canonical formatting, set algebra, and refusal of bad or huge input."""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cri_proxy.cpu import EMPTY, MAX_CPU, CPUSet
from cri_proxy.errors import CpuError, CriProxyError

PARSE = [
    ("", ""),
    ("   ", ""),
    ("0", "0"),
    ("0-3", "0-3"),
    ("0-3,8,10-11", "0-3,8,10-11"),
    ("10-11,8,0-3", "0-3,8,10-11"),
    (" 0 - 3 , 8 ,10-11 ", "0-3,8,10-11"),
    ("1,1,1", "1"),
    ("0-5,2-8", "0-8"),
    ("0,1,2,3", "0-3"),
    ("3-3", "3"),
    ("1,2", "1-2"),
    ("0,2,4", "0,2,4"),
    ("0-3\n", "0-3"),
    (f"{MAX_CPU}", f"{MAX_CPU}"),
    (f"0-{MAX_CPU}", f"0-{MAX_CPU}"),
]


@pytest.mark.parametrize(("text", "canonical"), PARSE, ids=[repr(t) for t, _ in PARSE])
def test_parse_and_format(text: str, canonical: str) -> None:
    assert str(CPUSet.parse(text)) == canonical


BAD = {
    "letters": "a",
    "empty item": "1,,2",
    "trailing comma": "1,",
    "leading comma": ",1",
    "reversed range": "5-3",
    "open range": "3-",
    "negative": "-1",
    "double dash": "1--3",
    "stride syntax": "0-7:2",
    "plus sign": "+3",
    "non-ascii digit": "\u0663",
    "above maximum": f"{MAX_CPU + 1}",
    "huge range": "0-99999999",
    "huge number": "9" * 40,
    "float": "1.5",
    "semicolons": "1;2",
}


@pytest.mark.parametrize("text", BAD.values(), ids=BAD.keys())
def test_bad_syntax_raises_cpu_error_naming_the_text(text: str) -> None:
    with pytest.raises(CpuError) as info:
        CPUSet.parse(text)
    assert repr(text)[1:-1] in str(info.value) or len(text) > 30
    assert isinstance(info.value, CriProxyError)
    assert isinstance(info.value, ValueError)


def test_non_string_is_refused() -> None:
    with pytest.raises(CpuError):
        CPUSet.parse(3)  # type: ignore[arg-type]


def test_huge_range_is_refused_fast_without_memory() -> None:
    start = time.perf_counter()
    with pytest.raises(CpuError, match="maximum"):
        CPUSet.parse("0-99999999")
    with pytest.raises(CpuError):
        CPUSet.parse("0-1," * 100_000)  # too long a text
    assert time.perf_counter() - start < 0.5


def test_value_semantics() -> None:
    a = CPUSet.parse("0-3")
    assert a == CPUSet.parse("3,2,1,0")
    assert hash(a) == hash(CPUSet.of([0, 1, 2, 3]))
    assert {a, CPUSet.range(0, 3)} == {a}
    with pytest.raises(AttributeError):
        a.mask = 0  # type: ignore[misc]
    assert repr(a) == "CPUSet('0-3')"


def test_set_operations() -> None:
    a, b = CPUSet.parse("0-7"), CPUSet.parse("4-11")
    assert str(a | b) == "0-11"
    assert str(a & b) == "4-7"
    assert str(a - b) == "0-3"
    assert str(a ^ b) == "0-3,8-11"
    assert a.union(b, CPUSet.parse("20")) == CPUSet.parse("0-11,20")
    assert CPUSet.parse("1-2") <= a and CPUSet.parse("1-2") < a and not a < a
    assert a >= CPUSet.parse("1") and a > CPUSet.parse("1")
    assert a.issubset(CPUSet.parse("0-9")) and not a.isdisjoint(b)
    assert CPUSet.parse("0").isdisjoint(CPUSet.parse("1"))
    assert len(a) == 8 and list(CPUSet.parse("1,3-4")) == [1, 3, 4]
    assert 3 in a and 9 not in a and -1 not in a and "3" not in a
    assert not EMPTY and bool(a)
    assert list(CPUSet.parse("0-1,5").ranges()) == [(0, 1), (5, 5)]


def test_constructors_check_bounds() -> None:
    with pytest.raises(CpuError):
        CPUSet.of([MAX_CPU + 1])
    with pytest.raises(CpuError):
        CPUSet.range(-1, 3)
    with pytest.raises(CpuError):
        CPUSet(-1)
    with pytest.raises(CpuError):
        CPUSet(1 << (MAX_CPU + 1))
    assert CPUSet.range(5, 4) == EMPTY


cpu_ids = st.frozensets(st.integers(0, 300), max_size=60)


@settings(max_examples=200, deadline=None)
@given(cpu_ids)
def test_format_is_canonical_and_round_trips(ids: frozenset[int]) -> None:
    s = CPUSet.of(ids)
    text = str(s)
    assert set(s) == ids
    assert CPUSet.parse(text) == s
    assert " " not in text
    # canonical: items ascending, runs maximal (no two items touch)
    bounds = [
        tuple(map(int, item.split("-"))) if "-" in item else (int(item),) * 2
        for item in text.split(",")
        if item
    ]
    for (_, hi), (lo, _) in itertools.pairwise(bounds):
        assert lo > hi + 1


@settings(max_examples=200, deadline=None)
@given(cpu_ids, cpu_ids)
def test_algebra_matches_frozenset(x: frozenset[int], y: frozenset[int]) -> None:
    a, b = CPUSet.of(x), CPUSet.of(y)
    assert set(a | b) == x | y
    assert set(a & b) == x & y
    assert set(a - b) == x - y
    assert set(a ^ b) == x ^ y
    assert (a <= b) == (x <= y)
    assert a.isdisjoint(b) == x.isdisjoint(y)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 20)), max_size=12), st.randoms())
def test_parse_accepts_any_order_and_duplicates(items: list[tuple[int, int]], rnd: object) -> None:
    parts = [f"{lo}-{lo + n}" if n else str(lo) for lo, n in items]
    expect = {c for lo, n in items for c in range(lo, lo + n + 1)}
    shuffled = parts * 2
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert set(CPUSet.parse(" , ".join(shuffled))) == expect


def test_leading_zeros_are_ids_not_overflow() -> None:
    assert str(CPUSet.parse("0003-00005")) == "3-5"


def test_error_message_stays_short_for_long_input() -> None:
    with pytest.raises(CpuError) as info:
        CPUSet.parse("1," * 1000 + "x")
    assert len(str(info.value)) < 200
