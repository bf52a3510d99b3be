"""The SIGUSR1 dump (`stacks_text`): each task down the chain of what it awaits, each thread, and
no more than `TASKS_SHOWN` tasks written out (the rest counted by coroutine)."""

from __future__ import annotations

import asyncio
import threading

from cri_proxy.daemon import stacks
from cri_proxy.daemon.stacks import stacks_text


async def _inner(gate: asyncio.Event) -> None:
    await gate.wait()


async def _outer(gate: asyncio.Event) -> None:
    await _inner(gate)


async def _idle(gate: asyncio.Event) -> None:
    await gate.wait()


def test_tasks_down_their_awaits_threads_and_the_bound() -> None:
    parked = threading.Event()
    worker = threading.Thread(target=parked.wait, name="parked-worker", daemon=True)
    worker.start()

    async def main() -> str:
        gate = asyncio.Event()
        chained = asyncio.create_task(_outer(gate), name="chained")
        idle = [asyncio.create_task(_idle(gate)) for _ in range(stacks.TASKS_SHOWN + 20)]
        await asyncio.sleep(0)  # each task runs up to its first wait
        try:
            return stacks_text()
        finally:
            gate.set()
            await asyncio.gather(chained, *idle)

    try:
        text = asyncio.run(main())
    finally:
        parked.set()
    lines = text.splitlines()
    assert lines[0].startswith("=== stacks (SIGUSR1): ") and lines[-1] == "=== end of stacks ==="
    assert f"{stacks.TASKS_SHOWN + 22} asyncio tasks" in lines[0]  # main() itself too
    assert sum(line.startswith("--- task ") for line in lines) == stacks.TASKS_SHOWN
    more = [line for line in lines if "more tasks, not shown" in line]
    assert more == ["--- 22 more tasks, not shown: _idle x22"]  # named first, then as created
    at = lines.index(next(line for line in lines if line.startswith("--- task chained ")))
    assert [line.rsplit(" in ", 1)[1] for line in lines[at + 1 : at + 4]] == [
        "_outer",
        "_inner",
        "Event.wait",
    ]
    assert any(line.startswith("--- thread parked-worker ") for line in lines)
    assert any(line.startswith("--- thread MainThread ") for line in lines)
