"""`LineWriter`: log lines reach stderr in order through a thread, and a stderr that takes nothing
(a stalled journald) never holds up the caller nor grows the buffer past its bound. Against real
pipes, made small so that they fill after a few lines."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cri_proxy.logwriter import LineWriter
from tests.processes import wait_until

PIPE_BYTES = 4096  # the smallest a pipe can be: a page


def small_pipe() -> tuple[int, int]:
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    os.set_blocking(r, False)
    return r, w


def read_all(fd: int) -> bytes:
    """What the pipe holds now (the reader never waits)."""
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk


FAST = 0.001
"""Seconds between polls of a wait here: the state machine's examples add up."""


def line(n: int, size: int = 100) -> str:
    return f"{n:08d} ".ljust(size - 1, "x") + "\n"


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = small_pipe()
    yield r, w
    for fd in (r, w):
        with contextlib.suppress(OSError):  # (closed by the test)
            os.close(fd)


def test_a_stderr_that_takes_nothing_never_holds_up_the_caller(pipe: tuple[int, int]) -> None:
    """10,000 lines into a pipe no one reads: every `put` returns (the putting thread ends), at
    most `held_bytes` are held, and the rest are dropped and counted; once the pipe is read, the
    lines kept arrive whole and in order, followed by one notice naming how many were dropped."""
    r, w = pipe
    gaps: list[int] = []
    writer = LineWriter(w, held_bytes=20_000, say_dropped=lambda n, first, last: gaps.append(n))
    most = 0

    def put_all() -> None:
        nonlocal most
        for n in range(10_000):
            writer.put(line(n))
            most = max(most, writer.held)

    putter = threading.Thread(target=put_all, daemon=True)
    putter.start()
    putter.join(30)
    assert not putter.is_alive(), "put blocked on a full stderr"
    assert most <= 20_000
    assert writer.dropped >= 10_000 - (20_000 + PIPE_BYTES) // 100
    dropped = writer.dropped
    out = b""

    def drained() -> bool:
        nonlocal out
        done = writer.drain(0)  # first: once all is written, the read below gets the last of it
        out += read_all(r)
        return done

    wait_until(drained, 10, every=FAST)
    numbers = [int(text.split()[0]) for text in out.decode().splitlines()]
    assert numbers == sorted(numbers) and len(numbers) == 10_000 - dropped
    assert all(
        text == line(n).rstrip("\n") for n, text in zip(numbers, out.decode().splitlines(), strict=True)
    )
    assert numbers[0] == 0  # the first lines kept: they tell how it began
    wait_until(lambda: sum(gaps) == dropped, 10, every=FAST)  # told once the batch the gap held up went out
    assert writer.dropped == dropped
    writer.close()


def test_a_closed_stderr_drops_everything_without_waiting(pipe: tuple[int, int]) -> None:
    """No reader left (EPIPE): the writer stops trying, lines are counted as dropped, `drain` does
    not wait out its timeout, and no notice is attempted (it would go nowhere)."""
    r, w = pipe
    os.close(r)
    told: list[int] = []
    writer = LineWriter(w, say_dropped=lambda n, first, last: told.append(n))
    writer.put(line(0))
    wait_until(lambda: writer.broken is not None, 10, every=FAST)
    assert writer.broken == "EPIPE"
    for n in range(1, 5):
        writer.put(line(n))
    assert writer.dropped == 5
    assert writer.drain(30)  # nothing held: not waited out
    assert told == []
    writer.close()


def test_drain_waits_until_the_lines_held_are_written(pipe: tuple[int, int]) -> None:
    """At exit: `drain` returns True once all is written, False after its timeout while stderr
    takes nothing."""
    r, w = pipe
    writer = LineWriter(w)
    for n in range(60):  # 6,000 bytes: more than the pipe takes
        writer.put(line(n))
    assert writer.drain(0.2) is False
    out = b""

    def read() -> bool:
        nonlocal out
        out += read_all(r)
        return len(out) == 6000

    reader = threading.Thread(target=wait_until, args=(read, 10), daemon=True)
    reader.start()
    assert writer.drain(10) is True
    reader.join(10)
    assert out == "".join(line(n) for n in range(60)).encode()
    writer.close()


class Interleavings(RuleBasedStateMachine):
    """Lines put and the pipe read in any order: the buffer never holds more than its bound, what
    arrives is the lines put, in order, with only dropped ones missing, and when all has been
    read every line is accounted for (written or counted dropped)."""

    def __init__(self) -> None:
        super().__init__()
        self.r, self.w = small_pipe()
        self.gaps: list[int] = []
        self.writer = LineWriter(
            self.w, held_bytes=3000, say_dropped=lambda n, first, last: self.gaps.append(n)
        )
        self.next = 0
        self.out = b""

    @rule(count=st.integers(1, 40), size=st.sampled_from([10, 100, 900]))
    def put(self, count: int, size: int) -> None:
        for _ in range(count):
            self.writer.put(line(self.next, size))
            self.next += 1

    @rule()
    def read(self) -> None:
        self.out += read_all(self.r)

    @invariant()
    def bounded_and_in_order(self) -> None:
        assert self.writer.held <= 3000
        whole = self.out[: self.out.rfind(b"\n") + 1].decode()
        numbers = [int(text.split()[0]) for text in whole.splitlines()]
        assert numbers == sorted(set(numbers))

    def teardown(self) -> None:
        try:

            def drained() -> bool:
                done = self.writer.drain(0)  # (as in the first test)
                self.out += read_all(self.r)
                return done

            wait_until(drained, 10, every=FAST)
            written = len(self.out.decode().splitlines())
            assert written + self.writer.dropped == self.next
            assert sum(self.gaps) <= self.writer.dropped  # a gap after the last line is told later
        finally:
            self.writer.close()
            os.close(self.r)
            os.close(self.w)


Interleavings.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
TestInterleavings = Interleavings.TestCase
