"""The core finds a request's method by its `:path` bytes (`UNARY_PATHS`): the same method, for any
bytes, as decoding them and asking `KNOWN` for a unary method."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cri_proxy.relay.methods import KNOWN, UNARY_PATHS, MethodInfo, Shape

PATHS = sorted(path.encode() for path in KNOWN)


def _by_text(raw: bytes) -> MethodInfo | None:
    info = KNOWN.get(raw.decode("utf-8", "replace"))
    return info if info is not None and info.shape is Shape.UNARY else None


@st.composite
def paths(draw: st.DrawFn) -> bytes:
    """A known path (unary or streaming), one cut or changed by a byte, or any bytes."""
    kind = draw(st.sampled_from(("known", "cut", "changed", "any")))
    if kind == "any":
        return draw(st.binary(max_size=80))
    path = draw(st.sampled_from(PATHS))
    if kind == "known":
        return path
    at = draw(st.integers(0, len(path) - 1))
    if kind == "cut":
        return path[:at]
    return path[:at] + bytes([draw(st.integers(0, 255))]) + path[at + 1 :]


@given(paths())
def test_a_path_by_its_bytes_is_the_method_its_text_names(raw: bytes) -> None:
    assert UNARY_PATHS.get(raw) is _by_text(raw)


def test_every_unary_method_and_no_streaming_one() -> None:
    streaming = [path for path, info in KNOWN.items() if info.shape is not Shape.UNARY]
    assert streaming  # GetContainerEvents, the Stream* listings: relayed untouched
    assert all(path.encode() not in UNARY_PATHS for path in streaming)
    assert {info.path for info in UNARY_PATHS.values()} == {
        path for path, info in KNOWN.items() if info.shape is Shape.UNARY
    }
