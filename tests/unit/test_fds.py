"""File descriptors (daemon/fds.py): the limit raised at the start, one warning near it, one all-clear."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from cri_proxy.daemon.fds import CLEAR_AT, WARN_AT, FdGauge

LIMITS = st.integers(min_value=1, max_value=1 << 20)


@given(st.lists(st.tuples(st.floats(min_value=0, max_value=1.2), LIMITS), max_size=60))
def test_a_warning_once_near_the_limit_and_an_all_clear_once_below(samples: list[tuple[float, int]]) -> None:
    """Over any run of looks (the limit may change between them: `prlimit` on a running proxy),
    warnings and all-clears alternate, a warning first; a warning only at WARN_AT of the limit
    or more, an all-clear only below CLEAR_AT; and whenever the use is past one of them, the
    state says so."""
    gauge = FdGauge()
    said: list[str] = []
    for share, limit in samples:
        used = int(share * limit)
        line = gauge.feed(used, limit, connections=7)
        if line is not None:
            level, text = line
            said.append(level)
            assert f"of the limit {limit:,} in use" in text and "(7 client connections)" in text
            if level == "WARNING":
                assert used >= WARN_AT * limit and "LimitNOFILE" in text
            else:
                assert level == "INFO" and used < CLEAR_AT * limit
        if used >= WARN_AT * limit:
            assert gauge.warned
        elif used < CLEAR_AT * limit:
            assert not gauge.warned
    assert said == ["WARNING", "INFO"] * (len(said) // 2) + ["WARNING"] * (len(said) % 2)


def test_without_connections_counted_the_line_leaves_them_out() -> None:
    line = FdGauge().feed(95, 100)
    assert line is not None and "client connections" not in line[1]


def _child(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    out = _child(
        "import resource\n"
        "from cri_proxy.daemon.fds import raise_limit\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (100, 300))\n"
        "print(raise_limit(), resource.getrlimit(resource.RLIMIT_NOFILE), raise_limit())\n"
    )
    assert out == "(100, 300) (300, 300) None"  # raised once; nothing to raise after


def test_at_the_limit_the_count_is_the_limit() -> None:
    """The listing itself needs a descriptor: when there is none left, the proxy is at the limit."""
    out = _child(
        "import os, resource\n"
        "from cri_proxy.daemon.fds import count_open\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))\n"
        "before = count_open()\n"
        "held = []\n"
        "try:\n"
        "    while True:\n"
        "        held.append(os.open('/dev/null', os.O_RDONLY))\n"
        "except OSError:\n"
        "    pass\n"
        "at = count_open()\n"
        "os.close(held.pop())\n"
        "print(before < 40, at, count_open())\n"
    )
    assert out == "True 40 39"
