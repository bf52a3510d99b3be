"""inline.start: a coroutine that never waits ends in the caller's turn; one that waits goes on in a
task, and a cancel of that task reaches the coroutine (its clean-up runs) even before its first step."""

from __future__ import annotations

import asyncio

import pytest

from cri_proxy.relay import inline


async def no_wait(log: list[str]) -> int:
    log.append("ran")
    return 7


async def waits(gate: asyncio.Event, log: list[str]) -> int:
    log.append("before")
    try:
        await gate.wait()
    except asyncio.CancelledError:
        log.append("cleaned up")
        raise
    log.append("after")
    return 8


def test_a_coroutine_that_never_waits_ends_at_once_without_a_task() -> None:
    async def main() -> None:
        log: list[str] = []
        started = inline.start(no_wait(log))
        assert started == inline.Finished(7)
        assert log == ["ran"]  # in this very turn

    asyncio.run(main())


def test_a_coroutine_that_waits_runs_up_to_its_wait_then_a_task_finishes_it() -> None:
    async def main() -> None:
        log: list[str] = []
        gate = asyncio.Event()
        started = inline.start(waits(gate, log))
        assert isinstance(started, asyncio.Future)
        assert log == ["before"]
        gate.set()
        assert await asyncio.wait_for(started, 5) == 8
        assert log == ["before", "after"]

    asyncio.run(main())


@pytest.mark.parametrize("first_step", [False, True])
def test_a_cancel_reaches_the_coroutine_before_or_after_the_tasks_first_step(first_step: bool) -> None:
    async def main() -> None:
        log: list[str] = []
        started = inline.start(waits(asyncio.Event(), log))
        assert isinstance(started, asyncio.Future)
        if first_step:
            await asyncio.sleep(0)
        started.cancel()
        with pytest.raises(asyncio.CancelledError):
            await started
        assert log == ["before", "cleaned up"]

    asyncio.run(main())


def test_an_exception_before_the_first_wait_reaches_the_caller_or_the_task() -> None:
    async def broken() -> int:
        raise ValueError("bad")

    async def main() -> None:
        try:
            started = inline.start(broken())
        except ValueError:
            return  # stepped here (3.11)
        assert isinstance(started, asyncio.Future)  # an eager task holds it (3.12+)
        with pytest.raises(ValueError):
            await started

    asyncio.run(main())
