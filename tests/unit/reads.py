"""A peer's bytes cut into reads as a property test draws them (for the link core's tests)."""

from __future__ import annotations

from collections.abc import Iterator


def cut(
    data: bytes, ends: list[int], reads: list[tuple[str, int]], call_ends: list[int] | None = None
) -> Iterator[bytes]:
    """`data` in the reads `reads` asks for, then what is left in one: ("bytes", n) cuts anywhere;
    ("frames", n) reads to the end of the frame at hand and n - 1 more (`ends`: where each frame
    ends); ("call", n) the same by `call_ends`; ("past", n) the call at hand and n bytes after it."""
    at = 0
    for how, count in [*reads, ("bytes", len(data))]:
        if at >= len(data):
            return
        if how == "bytes":
            end = at + count
        elif how == "past":
            end = min([e for e in call_ends or () if e > at] or [len(data)]) + count
        else:
            later = [e for e in (ends if how == "frames" else call_ends or ()) if e > at] or [len(data)]
            end = later[min(count, len(later)) - 1]
        yield data[at:end]
        at = end
