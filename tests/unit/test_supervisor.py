"""The supervisor: a failed loop is restarted with back-off, reported in health, metrics and the log,
and stop leaves nothing pending."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from loguru import logger
from prometheus_client import CollectorRegistry, generate_latest

from cri_proxy.daemon.loop_metrics import SupervisorCollector
from cri_proxy.daemon.supervisor import Backoff, Supervisor
from tests.unit.relay_support import eventually as until

FAST = Backoff(first=0.01, factor=2.0, most=0.05)
SLOW = Backoff(first=3600.0)  # a failed task stays down for the whole test


@pytest.fixture
def log() -> Iterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(
        lines.append, level="DEBUG", format="{level} {message}", backtrace=False, diagnose=False
    )
    yield lines
    logger.remove(sink)


def _metrics(supervisor: Supervisor) -> str:
    registry = CollectorRegistry()
    registry.register(SupervisorCollector(supervisor))
    return generate_latest(registry).decode()


def test_a_loop_that_raises_is_restarted_and_reported(log: list[str]) -> None:
    runs: list[int] = []

    async def flaky() -> None:
        runs.append(1)
        if len(runs) <= 2:
            raise RuntimeError(f"boom {len(runs)}")
        await asyncio.Event().wait()  # the third run keeps going

    async def main() -> None:
        supervisor = Supervisor(FAST)
        supervisor.loop("flaky", flaky)
        await until(lambda: len(runs) == 3, "the third run")
        assert supervisor.health() == (True, "ok")
        [status] = supervisor.statuses()
        assert (status.name, status.up, status.restarts) == ("flaky", True, 2)
        assert status.last_error == "RuntimeError: boom 2"
        text = _metrics(supervisor)
        assert 'cri_proxy_loop_restarts_total{loop="flaky"} 2.0' in text
        assert 'cri_proxy_loop_up{loop="flaky"} 1.0' in text and "cri_proxy_loops_up 1.0" in text
        await supervisor.stop()

    asyncio.run(main())
    failures = [line for line in log if line.startswith("ERROR background loop 'flaky' failed")]
    assert len(failures) == 2
    assert "RuntimeError: boom 1; restarting in 0.0 s (restart 1)" in failures[0]
    assert "Traceback" in failures[0] and "in flaky" in failures[0]  # the traceback, with the frame


def test_a_failed_loop_is_down_in_health_and_metrics_until_its_restart(log: list[str]) -> None:
    async def broken() -> None:
        raise OSError("disk gone")

    async def steady() -> None:
        await asyncio.Event().wait()

    async def main() -> None:
        supervisor = Supervisor(SLOW)
        supervisor.loop("steady", steady)
        supervisor.loop("checkpoint", broken)
        await until(lambda: bool(supervisor.down()), "the failure")
        ok, why = supervisor.health()
        assert not ok
        assert why.startswith("background checkpoint failed (OSError: disk gone), restart 1 in ")
        text = _metrics(supervisor)
        assert 'cri_proxy_loop_up{loop="checkpoint"} 0.0' in text
        assert 'cri_proxy_loop_up{loop="steady"} 1.0' in text and "cri_proxy_loops_up 1.0" in text
        await supervisor.stop()

    asyncio.run(main())


def test_a_loop_that_returns_is_restarted_too(log: list[str]) -> None:
    runs: list[int] = []

    async def quits() -> None:
        runs.append(1)
        if len(runs) > 1:
            await asyncio.Event().wait()

    async def main() -> None:
        supervisor = Supervisor(FAST)
        supervisor.loop("watch", quits)
        await until(lambda: len(runs) == 2, "the restart")
        assert supervisor.restarts() == {"watch": 1}
        await supervisor.stop()

    asyncio.run(main())
    assert any("returned (a loop must run until stopped)" in line for line in log)


def test_a_job_runs_until_it_completes_and_one_at_a_time(log: list[str]) -> None:
    runs: list[int] = []
    gate = asyncio.Event()

    async def recovery() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise ConnectionError("runtime not there yet")
        await gate.wait()

    async def main() -> None:
        supervisor = Supervisor(FAST)
        supervisor.job("recovery", recovery)
        await until(lambda: len(runs) == 2, "the retry")
        supervisor.job("recovery", recovery)  # still running: not a second copy
        gate.set()
        await until(lambda: not supervisor.statuses(), "the job to finish")
        assert len(runs) == 2
        assert supervisor.restarts() == {"recovery": 1}
        assert supervisor.health() == (True, "ok")
        supervisor.job("recovery", recovery)  # done: may run again
        await until(lambda: len(runs) == 3, "the second run")
        await supervisor.stop()

    asyncio.run(main())


def test_stop_cancels_every_task_and_leaves_nothing_pending() -> None:
    cleaned: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(name)

    async def failing() -> None:
        raise RuntimeError("down")

    async def main() -> None:
        supervisor = Supervisor(SLOW)
        for name in ("reconciler", "kubelet-file", "probe"):
            supervisor.loop(name, lambda name=name: forever(name))  # type: ignore[misc]
        supervisor.loop("failing", failing)  # asleep in its back-off when stopped
        await until(lambda: len(supervisor.down()) == 1, "the failure")
        await supervisor.stop()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert others == []
        supervisor.loop("late", failing)  # after stop: nothing starts
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(main())
    assert sorted(cleaned) == ["kubelet-file", "probe", "reconciler"]


def test_backoff_grows_to_its_cap() -> None:
    backoff = Backoff(first=0.5, factor=2.0, most=5.0)
    assert [backoff.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
