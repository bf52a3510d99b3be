"""CPU lists ("Keys" and "Decision per container" in cpuset-rules.md): parse, format, combine.

A `CPUSet` is an int bitmask (bit n = CPU n): set operations are single big-int operations, which
keeps the decision engine linear and fast, and the value is immutable and hashable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache

from cri_proxy.errors import CpuError

MAX_CPU = 8191
"""Highest CPU id accepted (Linux's largest NR_CPUS is 8192); caps memory for hostile input."""

_ALL_MASK = (1 << (MAX_CPU + 1)) - 1
_MAX_TEXT = 65536  # a cpulist longer than this is not a cpulist; refuse before scanning it
_TOKEN = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", re.ASCII)
_MAX_DIGITS = len(str(MAX_CPU))


def _quote(text: str) -> str:
    """repr() of the text, cut short: error messages name the input but stay one readable line."""
    return repr(text) if len(text) <= 60 else repr(text[:60]) + "..."


def _cpu_id(digits: str, text: str) -> int:
    """One CPU id; the digit count is checked before int() so a hostile number costs nothing."""
    significant = digits.lstrip("0") or "0"
    if len(significant) > _MAX_DIGITS or int(significant) > MAX_CPU:
        raise CpuError(f"bad CPU list {_quote(text)}: CPU {_quote(digits)} is above the maximum {MAX_CPU}")
    return int(significant)


def _range_mask(lo: int, hi: int) -> int:
    return ((1 << (hi - lo + 1)) - 1) << lo


@lru_cache(maxsize=256)
def _text(mask: int) -> str:
    """The cpulist of a mask; cached: a node's few distinct cpusets are formatted for every
    container on every pass, and a big mask takes a walk over its runs."""
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in CPUSet(mask).ranges())


@dataclass(frozen=True, slots=True)
class CPUSet:
    """An immutable set of CPU ids; `str()` gives the canonical Linux list (`0-3,8,10-11`)."""

    mask: int = 0

    def __post_init__(self) -> None:
        if self.mask < 0 or self.mask > _ALL_MASK:
            raise CpuError(f"CPU mask out of range 0..{MAX_CPU}")

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str) -> CPUSet:
        """Parse a Linux cpulist: ranges and ids, any order, duplicates and spaces allowed.

        Raises `CpuError` naming the text for anything else (empty items, reversed ranges,
        ids above `MAX_CPU`, stride syntax such as `0-7:2`).
        """
        if not isinstance(text, str):
            raise CpuError(f"CPU list must be a string, not {type(text).__name__}")
        if len(text) > _MAX_TEXT:
            raise CpuError(f"CPU list too long ({len(text)} characters)")
        if not text.strip():
            return EMPTY
        mask = 0
        for item in text.split(","):
            m = _TOKEN.fullmatch(item)
            if m is None:
                raise CpuError(f"bad CPU list {_quote(text)}: item {_quote(item.strip())} is not N or N-M")
            lo = _cpu_id(m.group(1), text)
            hi = lo if m.group(2) is None else _cpu_id(m.group(2), text)
            if lo > hi:
                raise CpuError(f"bad CPU list {_quote(text)}: range {lo}-{hi} is reversed")
            mask |= _range_mask(lo, hi)
        return cls(mask)

    @classmethod
    def of(cls, cpus: Iterable[int]) -> CPUSet:
        """Build from CPU ids (each within 0..MAX_CPU)."""
        mask = 0
        for cpu in cpus:
            if not 0 <= cpu <= MAX_CPU:
                raise CpuError(f"CPU {cpu} outside 0..{MAX_CPU}")
            mask |= 1 << cpu
        return cls(mask)

    @classmethod
    def range(cls, lo: int, hi: int) -> CPUSet:
        """CPUs lo..hi inclusive (empty when hi < lo)."""
        if hi < lo:
            return EMPTY
        if lo < 0 or hi > MAX_CPU:
            raise CpuError(f"range {lo}-{hi} outside 0..{MAX_CPU}")
        return cls(_range_mask(lo, hi))

    # --- views -----------------------------------------------------------------------------------

    def ranges(self) -> Iterator[tuple[int, int]]:
        """Maximal runs (lo, hi), ascending."""
        m = self.mask
        while m:
            lo = (m & -m).bit_length() - 1
            x = m >> lo
            length = (x ^ (x + 1)).bit_length() - 1  # number of trailing one bits
            yield lo, lo + length - 1
            m &= ~(((1 << length) - 1) << lo)

    def __str__(self) -> str:
        return _text(self.mask)

    def __repr__(self) -> str:
        return f"CPUSet({str(self)!r})"

    def __iter__(self) -> Iterator[int]:
        for lo, hi in self.ranges():
            yield from range(lo, hi + 1)

    def __len__(self) -> int:
        return self.mask.bit_count()

    def __bool__(self) -> bool:
        return self.mask != 0

    def __contains__(self, cpu: object) -> bool:
        return isinstance(cpu, int) and 0 <= cpu <= MAX_CPU and bool(self.mask >> cpu & 1)

    # --- set algebra ----------------------------------------------------------------------------

    def __or__(self, other: CPUSet) -> CPUSet:
        return CPUSet(self.mask | other.mask)

    def __and__(self, other: CPUSet) -> CPUSet:
        return CPUSet(self.mask & other.mask)

    def __sub__(self, other: CPUSet) -> CPUSet:
        return CPUSet(self.mask & ~other.mask)

    def __xor__(self, other: CPUSet) -> CPUSet:
        return CPUSet(self.mask ^ other.mask)

    def __le__(self, other: CPUSet) -> bool:
        return self.mask & ~other.mask == 0

    def __lt__(self, other: CPUSet) -> bool:
        return self <= other and self.mask != other.mask

    def __ge__(self, other: CPUSet) -> bool:
        return other <= self

    def __gt__(self, other: CPUSet) -> bool:
        return other < self

    def union(self, *others: CPUSet) -> CPUSet:
        mask = self.mask
        for o in others:
            mask |= o.mask
        return CPUSet(mask)

    def isdisjoint(self, other: CPUSet) -> bool:
        return self.mask & other.mask == 0

    def issubset(self, other: CPUSet) -> bool:
        return self <= other


EMPTY = CPUSet(0)
