"""The cases `inline.start` must meet, with nothing beyond the standard library and the module itself:
`test_relay_inline` runs them under pytest's Python and under every other Python 3.11+ on the
machine, since each version takes its own branch (3.11 steps the coroutine here, 3.12+ starts an
eager task) and only an interpreter of that version tries it. `python -m tests.unit.inline_cases`
runs them all and prints one line."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

from cri_proxy.relay import inline


async def _no_wait(log: list[str]) -> int:
    log.append("ran")
    return 7


async def _waits(gate: asyncio.Event, log: list[str]) -> int:
    log.append("before")
    try:
        await gate.wait()
    except asyncio.CancelledError:
        log.append("cleaned up")
        raise
    log.append("after")
    return 8


def never_waits() -> None:
    """A coroutine that never waits ends at once, in the caller's turn, without a task."""

    async def main() -> None:
        log: list[str] = []
        started = inline.start(_no_wait(log))
        assert started == inline.Finished(7), started
        assert log == ["ran"], log

    asyncio.run(main())


def waits_then_a_task_finishes_it() -> None:
    """One that waits runs up to its wait in the caller's turn; a task finishes it."""

    async def main() -> None:
        log: list[str] = []
        gate = asyncio.Event()
        started = inline.start(_waits(gate, log))
        assert isinstance(started, asyncio.Future), started
        assert log == ["before"], log
        gate.set()
        assert await asyncio.wait_for(started, 5) == 8
        assert log == ["before", "after"], log

    asyncio.run(main())


def _cancel(first_step: bool) -> None:
    async def main() -> None:
        log: list[str] = []
        started = inline.start(_waits(asyncio.Event(), log))
        assert isinstance(started, asyncio.Future), started
        if first_step:
            await asyncio.sleep(0)
        started.cancel()
        try:
            await started
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the cancelled task ended without CancelledError")
        assert log == ["before", "cleaned up"], log

    asyncio.run(main())


def cancel_before_the_first_step() -> None:
    """A cancel of the task reaches the coroutine (its clean-up runs) before the task's first step."""
    _cancel(first_step=False)


def cancel_after_the_first_step() -> None:
    """And after it."""
    _cancel(first_step=True)


def raises_before_its_first_wait() -> None:
    """An exception before the first wait reaches the caller (3.11) or the task (3.12+)."""

    async def broken() -> int:
        raise ValueError("bad")

    async def main() -> None:
        try:
            started = inline.start(broken())
        except ValueError:
            return  # stepped here (3.11)
        assert isinstance(started, asyncio.Future), started  # an eager task holds it (3.12+)
        try:
            await started
        except ValueError:
            return
        raise AssertionError("the task ended without the coroutine's ValueError")

    asyncio.run(main())


CASES: list[Callable[[], None]] = [
    never_waits,
    waits_then_a_task_finishes_it,
    cancel_before_the_first_step,
    cancel_after_the_first_step,
    raises_before_its_first_wait,
]

if __name__ == "__main__":
    for case in CASES:
        case()
    print(f"inline cases passed on Python {sys.version.split()[0]}")
