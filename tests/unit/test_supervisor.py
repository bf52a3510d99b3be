"""The supervisor: a failed loop is restarted with back-off, reported in health, metrics and the log,
and stop leaves nothing pending."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import grpc.aio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
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


def test_a_call_cancelled_under_a_loop_is_a_failure_not_a_silent_end(log: list[str]) -> None:
    """grpc.aio raises CancelledError in the caller when its channel is closed under the call: the
    loop's task is not being cancelled, yet the error looked like a stop, and the loop ended with
    nobody told (up in health, never restarted). Now it is a failure like any other."""
    channels: list[grpc.aio.Channel] = []
    calls: list[int] = []

    async def hang(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        calls.append(1)
        await asyncio.Event().wait()
        return b""

    async def main() -> None:
        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(hang)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Hang", {"Call": handler}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()

        async def probe() -> None:
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
            channels.append(channel)
            await channel.unary_unary("/t.Hang/Call", None, None)(b"", timeout=60)

        supervisor = Supervisor(FAST)
        supervisor.loop("probe", probe)
        try:
            await until(lambda: len(calls) == 1, "the first call under way")
            await channels[0].close()
            await until(lambda: len(channels) == 2, "the loop restarted")
            assert supervisor.restarts() == {"probe": 1}
            assert supervisor.statuses()[0].last_error.startswith("CancelledError: cancelled from within")
        finally:
            await supervisor.stop()
            for channel in channels:
                await channel.close()
            await server.stop(0)

    asyncio.run(main())
    assert any(line.startswith("ERROR background loop 'probe' failed: CancelledError") for line in log)


def test_what_ends_once_stopping_began_is_no_failure(log: list[str]) -> None:
    """Between `stopping()` and `stop()` the proxy closes what its tasks use: a task that ends then
    is not restarted, not down in health, not an ERROR; a job asked for then does not start."""
    release = asyncio.Event()
    started: list[str] = []

    async def until_released() -> None:
        await release.wait()
        raise RuntimeError("its channel closed")

    async def job() -> None:
        started.append("job")

    async def main() -> None:
        supervisor = Supervisor(FAST)
        supervisor.loop("probe", until_released)
        await asyncio.sleep(0)
        supervisor.stopping()
        release.set()
        await until(lambda: not supervisor.statuses(), "the loop ended")
        supervisor.job("reload", job)
        await asyncio.sleep(0.05)
        assert supervisor.restarts() == {"probe": 0}
        assert supervisor.health() == (True, "ok")
        await supervisor.stop()

    asyncio.run(main())
    assert started == []
    assert not [line for line in log if line.startswith("ERROR")], log
    assert "DEBUG background 'probe' ended while stopping: RuntimeError: its channel closed\n" in log


def test_backoff_grows_to_its_cap() -> None:
    backoff = Backoff(first=0.5, factor=2.0, most=5.0)
    assert [backoff.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


ENDS = ["raise", "return", "cancelled", "hang"]
NAMES = ["a", "b", "c"]
STEP = st.one_of(
    st.tuples(
        st.sampled_from(["loop", "job"]), st.sampled_from(NAMES), st.lists(st.sampled_from(ENDS), max_size=4)
    ),
    st.tuples(st.sampled_from(["end"]), st.sampled_from(NAMES), st.sampled_from(ENDS[:3])),
    st.tuples(st.just("yield"), st.integers(0, 3)),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(STEP, max_size=25))
def test_whatever_the_tasks_do_none_ends_unseen_and_stop_leaves_nothing(steps: list[tuple[Any, ...]]) -> None:
    """Loops and jobs started in any order, each run ending by raising, returning, a CancelledError
    from within, or hanging until told how to end. After every step: a loop is running or down
    awaiting its restart, never silently gone; a job likewise until it completes; health says
    down exactly when one is. Stop then ends every task and starts nothing more."""
    running: dict[str, asyncio.Event] = {}  # name -> the hanging run's release
    how: dict[str, str] = {}  # name -> how the hanging run ends when released
    scripts: dict[str, list[str]] = {}
    completed: set[str] = set()  # jobs whose run returned

    def work(name: str, loop: bool) -> Any:
        async def run() -> None:
            end = scripts[name].pop(0) if scripts[name] else "hang"
            if end == "hang":
                release = running[name] = asyncio.Event()
                try:
                    await release.wait()
                finally:
                    running.pop(name, None)
                end = how.pop(name)
            if end == "raise":
                raise RuntimeError(f"{name} failed")
            if end == "cancelled":
                gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                gone.cancel()
                await gone  # a CancelledError not from this task's cancel
            if not loop:
                completed.add(name)

        return run

    async def main() -> None:
        supervisor = Supervisor(Backoff(first=0.001, factor=2.0, most=0.004))
        kinds: dict[str, bool] = {}  # name -> loop? (the last started under that name)
        for op, *args in steps:
            if op in ("loop", "job"):
                name, script = args
                busy = any(s.name == name for s in supervisor.statuses())
                if op == "loop" and busy:
                    with pytest.raises(ValueError):
                        supervisor.loop(name, work(name, True))
                    continue
                if busy:
                    supervisor.job(name, work(name, False))  # left alone: one at a time
                    continue
                scripts[name] = list(script)
                kinds[name] = op == "loop"
                completed.discard(name)
                (supervisor.loop if op == "loop" else supervisor.job)(name, work(name, op == "loop"))
                await asyncio.sleep(0)
            elif op == "end":
                name, end = args
                if name in running:
                    how[name] = end
                    running[name].set()
            else:
                await asyncio.sleep(0.002 * args[0])
            statuses = {s.name: s for s in supervisor.statuses()}
            for name, loop in kinds.items():
                if name in running or (name in completed and not loop):
                    continue
                status = statuses.get(name)
                assert status is not None and not status.up, f"{name} is neither running nor down"
            down = [s for s in statuses.values() if not s.up]
            assert supervisor.health()[0] == (not down)
        await supervisor.stop()
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
        supervisor.loop("late", work("late", True))
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(main())
