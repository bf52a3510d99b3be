"""The proxy's background work under its supervisor, and its settings swapped whole.

In-process proxy on the fake runtime, health and metrics read over real HTTP; the only stand-in is
the failure itself (a loop made to raise), since no real input makes a healthy loop raise.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

from loguru import logger

from cri_proxy.config import Config
from cri_proxy.daemon.recovery_runs import RecoveryRuns
from cri_proxy.daemon.supervisor import Backoff, Supervisor
from cri_proxy.relay.forward import FailPolicy
from cri_proxy.serve import Proxy
from tests.processes import wait_until
from tests.unit.enforce_support import QOS_LABEL, node
from tests.unit.relay_support import run
from tests.unit.test_daemon import Daemon


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


async def _http(url: str) -> tuple[int, str]:
    return await asyncio.to_thread(_get, url)


async def _until(predicate: object, what: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = predicate()  # type: ignore[operator]
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def break_kubelet_reader(proxy: Proxy) -> asyncio.Event:
    """Make the kubelet-state-file loop raise on every read until the returned event is set."""
    mended = asyncio.Event()
    real_refresh = proxy.kubelet.refresh

    async def refresh() -> bool:
        if not mended.is_set():
            raise RuntimeError("kubelet file reader broke")
        return await real_refresh()

    proxy.kubelet.refresh = refresh  # type: ignore[method-assign]
    return mended


def test_a_failing_loop_is_restarted_and_shown_in_health_and_metrics(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, metrics_address="127.0.0.1:0") as n:
            proxy = n.proxy
            assert proxy.http is not None
            base = f"http://127.0.0.1:{proxy.http.port}"
            await _until(lambda: proxy.probe.up, "the runtime probe")
            assert await _http(base + "/healthz") == (200, "ok\n")
            break_kubelet_reader(proxy)  # never mended here
            proxy.supervisor.backoff = Backoff(first=3600.0)  # stays down until we look
            await _until(lambda: proxy.supervisor.down(), "the failure")
            status, text = await _http(base + "/healthz")
            assert status == 503
            assert "background kubelet-state-file failed (RuntimeError: kubelet file reader broke)" in text
            assert (await _http(base + "/readyz"))[0] == 503
            _, metrics = await _http(base + "/metrics")
            assert 'cri_proxy_loop_restarts_total{loop="kubelet-state-file"} 1.0' in metrics
            assert 'cri_proxy_loop_up{loop="kubelet-state-file"} 0.0' in metrics
            assert 'cri_proxy_loop_up{loop="reconciler"} 1.0' in metrics
            # CRI calls go on meanwhile
            _, ids = await n.run_pod("ls", "burstable")
            assert n.cpuset(ids["main"]) == "0-15"

    run(main())


def test_a_loop_that_fails_then_recovers_is_up_again(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, metrics_address="127.0.0.1:0") as n:
            proxy = n.proxy
            assert proxy.http is not None
            proxy.supervisor.backoff = Backoff(first=0.05)
            failures = [RuntimeError("once"), RuntimeError("twice")]
            real_save = proxy.checkpoints.save

            async def save(deadline: float | None = None) -> bool:
                if failures:
                    raise failures.pop()
                return await real_save(deadline)

            proxy.checkpoints.save = save  # type: ignore[method-assign]
            await _until(lambda: proxy.supervisor.restarts().get("checkpoint") == 2, "two restarts")
            await _until(lambda: not proxy.supervisor.down(), "the loop up again")
            base = f"http://127.0.0.1:{proxy.http.port}"
            await _until(lambda: proxy.probe.up, "the runtime probe")
            assert await _http(base + "/healthz") == (200, "ok\n")
            _, ids = await n.run_pod("ls", "burstable")  # and the checkpoint is written again
            saved = tmp_path / "state" / "checkpoint.json"
            await _until(lambda: saved.exists() and ids["main"] in saved.read_text(), "the checkpoint")

    run(main())


def test_stop_leaves_no_task_behind(tmp_path: Path) -> None:
    async def main() -> None:
        before = set(asyncio.all_tasks())
        async with node(tmp_path, metrics_address="127.0.0.1:0") as n:
            await n.run_pod("ls", "burstable")
            assert len(n.proxy.supervisor.statuses()) >= 4
        await asyncio.sleep(0)  # let cancelled callbacks run
        left = [t for t in asyncio.all_tasks() - before if not t.done()]
        assert left == [], left

    run(main())


def test_a_loop_with_a_call_under_way_at_the_stop_is_no_failure(tmp_path: Path) -> None:
    """The runtime probe's call under way when the proxy stops. The relay's stop used to close the
    runtime channel before the loops were cancelled, and grpc.aio then raised CancelledError in
    the call: found by the e2e chaos test, every such stop logged an ERROR with a traceback and
    "restarting"."""
    lines: list[str] = []
    sink = logger.add(lines.append, level="DEBUG", format="{level} {message}")
    under_way = asyncio.Event()

    async def main() -> None:
        async with node(tmp_path) as n:
            proxy = n.proxy
            await _until(lambda: proxy.probe.up, "the runtime probe")
            events = proxy.relay.channel.unary_stream("/runtime.v1.RuntimeService/GetContainerEvents")

            async def check() -> bool:  # a call that waits for the runtime's next event: none comes
                call = events(b"", timeout=60)
                under_way.set()
                async for _ in call:
                    pass
                return True

            proxy.probe.check = check  # type: ignore[method-assign]
            await asyncio.wait_for(under_way.wait(), 10)
        assert proxy.supervisor.restarts()["runtime-probe"] == 0

    try:
        run(main())
    finally:
        logger.remove(sink)
    assert not [line for line in lines if line.startswith(("ERROR", "WARNING"))], lines


def test_a_reconcile_pass_during_the_stop_still_has_the_runtime(tmp_path: Path) -> None:
    """A pass asked for while the proxy stops (a call finishing in the stop's grace changed the
    node) still reaches the runtime: the channel closes only once the loops have ended. Found by
    the e2e chaos test: closed first, the pass logged "reconcile pass failed: Channel is closed"
    at ERROR with a traceback."""
    lines: list[str] = []
    sink = logger.add(lines.append, level="DEBUG", format="{level} {message}")
    passed: list[bool] = []

    async def main() -> None:
        async with node(tmp_path) as n:
            proxy = n.proxy
            await n.run_pod("ls", labels={QOS_LABEL: "LS"})
            await n.settle()
            admin_stop = proxy.admin.stop

            async def stop(grace: float | None) -> None:  # after the relay, before the loops
                ticket = proxy.reconciler.request(refresh=True)  # reads every container anew
                passed.append(await proxy.reconciler.wait_for(ticket, 10))
                await admin_stop(grace)

            proxy.admin.stop = stop  # type: ignore[method-assign]

    try:
        run(main())
    finally:
        logger.remove(sink)
    assert passed == [True]
    assert not [line for line in lines if line.startswith("ERROR")], lines


def test_reload_swaps_every_setting_at_once_or_none(tmp_path: Path) -> None:
    async def main() -> None:
        new_file: list[Config] = []

        async with node(tmp_path) as n:
            proxy = n.proxy
            proxy.reloader.read = lambda: new_file[0]
            old = proxy.settings.current

            def seen() -> tuple[object, ...]:
                return (
                    str(proxy.policy.reserved),
                    proxy.hooks.dry_run,
                    proxy.reconciler.dry_run,
                    proxy.hooks.fail_policy,
                    proxy.relay.forwarder.fail_policy,
                    proxy.hooks.exclusive_wait,
                    proxy.reconciler.period,
                )

            before = seen()
            assert before == ("", False, False, FailPolicy.IGNORE, FailPolicy.IGNORE, 5.0, 30.0)
            samples: list[tuple[object, ...]] = []
            stop = asyncio.Event()

            async def sample() -> None:
                while not stop.is_set():
                    samples.append(seen())
                    await asyncio.sleep(0)

            sampler = asyncio.create_task(sample())
            # refused: CPUs not online on this node; nothing of the file is taken
            new_file.append(replace(old, reserved_cpus="0-99", dry_run=True, fail_policy="fail"))
            assert not await proxy.reloader.reload()
            assert proxy.settings.current is old and seen() == before
            # taken: all at once
            new_file[0] = replace(
                old,
                reserved_cpus="0-1",
                dry_run=True,
                fail_policy="fail",
                exclusive_wait_seconds=1.0,
                reconcile_period_seconds=7.0,
                max_recv_message_bytes=2048,  # restart-only: keeps its running value
            )
            assert await proxy.reloader.reload()
            after = ("0-1", True, True, FailPolicy.FAIL, FailPolicy.FAIL, 1.0, 7.0)
            assert seen() == after
            assert proxy.settings.current.max_recv_message_bytes == old.max_recv_message_bytes
            assert str(proxy.policy.plan().pools.ls) == "2-15"  # the plan follows without a nudge
            await _until(lambda: samples[-1] == after, "the sampler to see the new settings")
            stop.set()
            await sampler
            assert set(samples) == {before, after}  # never a mix of the two

    run(main())


def test_recovery_fault_is_reported_and_retried_a_silent_runtime_quietly(tmp_path: Path) -> None:
    """A runtime that does not answer is "not yet" (retried inside the job); any other exception is
    a fault: logged with its traceback, shown in health, and the job restarted until it completes."""
    lines: list[str] = []
    sink = logger.add(lines.append, level="DEBUG", format="{level} {message}")
    outcomes: list[BaseException | None] = [None, ValueError("bad annotation bytes"), ConnectionError("down")]

    async def attempt() -> None:
        outcome = outcomes.pop()
        if outcome is not None:
            raise outcome

    async def main() -> None:
        runs = RecoveryRuns(attempt, "unix:///runtime.sock")
        supervisor = Supervisor(Backoff(first=3600.0))
        supervisor.job("recovery", runs.until_done)
        await _until(lambda: supervisor.down(), "the fault")
        ok, why = supervisor.health()
        assert not ok and "background recovery failed (ValueError: bad annotation bytes)" in why
        assert not runs.done.is_set()
        supervisor.backoff = Backoff(first=0.01)
        supervisor.job("recovery", runs.until_done)  # still in its back-off: left alone
        assert supervisor.restarts() == {"recovery": 1}
        await supervisor.stop()
        runs2 = RecoveryRuns(attempt, "unix:///runtime.sock")
        assert await runs2.first(give_up_after=5.0)  # the last outcome: done
        assert runs2.done.is_set()

    try:
        run(main())
    finally:
        logger.remove(sink)
    faults = [line for line in lines if "background job 'recovery' failed" in line]
    assert len(faults) == 1 and "Traceback" in faults[0] and "ValueError: bad annotation bytes" in faults[0]
    assert not any("ConnectionError" in line and line.startswith("ERROR") for line in lines)


def test_first_recovery_reports_a_fault_and_returns(tmp_path: Path) -> None:
    lines: list[str] = []
    sink = logger.add(lines.append, level="DEBUG", format="{level} {message}")

    async def attempt() -> None:
        raise KeyError("labels")

    try:
        assert run(RecoveryRuns(attempt, "unix:///r.sock").first(give_up_after=5.0)) is False
    finally:
        logger.remove(sink)
    assert any(line.startswith("ERROR recovery from runtime unix:///r.sock failed") for line in lines)


def test_the_real_serve_reports_its_loops_and_stops_clean(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    daemon = Daemon(tmp_path, f'metrics_address = "127.0.0.1:{port}"\n')
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _probe(base + "/readyz") == (200, "ok\n"), what="/readyz ok")
        _, metrics = _get(base + "/metrics")
        for loop in (
            "reconciler",
            "kubelet-state-file",
            "checkpoint",
            "runtime-probe",
            "file-descriptors",
            "cpu-topology",
        ):
            assert f'cri_proxy_loop_up{{loop="{loop}"}} 1.0' in metrics
            assert f'cri_proxy_loop_restarts_total{{loop="{loop}"}} 0.0' in metrics
        assert "cri_proxy_loops_up 7.0" in metrics
        for _ in range(3):
            daemon.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "configuration reloaded" in daemon.logs(), what="a reload")
    finally:
        assert daemon.stop() == 0
    for sign in ("Task was destroyed but it is pending", "was never awaited", "Traceback"):
        assert sign not in daemon.logs()


def _probe(url: str) -> tuple[int, str]:
    try:
        return _get(url)
    except urllib.error.URLError:  # not listening yet
        return 0, ""


def test_grpc_health_tells_what_healthz_tells(tmp_path: Path) -> None:
    """grpc.health.v1 on the admin socket: the overall service ("") is NOT_SERVING while a loop is
    down waiting for its restart, as /healthz is 503; SERVING again once it is back; and both say
    so while the runtime does not answer (then the CRI services are NOT_SERVING too)."""
    from tests.unit.test_admin_socket import HEALTH

    def request(service: str) -> bytes:
        name = service.encode()
        return bytes([0x0A, len(name)]) + name if name else b""

    async def main() -> None:
        async with node(tmp_path, metrics_address="127.0.0.1:0") as n:
            proxy = n.proxy
            assert proxy.http is not None
            base = f"http://127.0.0.1:{proxy.http.port}"
            check = n.admin.unary_unary(HEALTH, None, None)

            async def status(service: str = "") -> int:
                reply: bytes = await check(request(service), timeout=5)
                return reply[1]

            await _until(lambda: proxy.probe.up, "the runtime probe")
            assert (await status(), await status("runtime.v1.RuntimeService")) == (1, 1)
            assert (await _http(base + "/healthz"))[0] == 200
            mended = break_kubelet_reader(proxy)
            proxy.supervisor.backoff = Backoff(first=0.2, most=0.5)
            await _until(lambda: proxy.supervisor.down(), "the failure")

            async def not_serving() -> bool:
                return await status() == 2

            await _until(not_serving, "NOT_SERVING while the loop is down")
            assert (await _http(base + "/healthz"))[0] == 503
            assert await status("runtime.v1.RuntimeService") == 1  # the relay serves CRI meanwhile
            mended.set()
            await _until(lambda: not proxy.supervisor.down(), "the loop up again")
            assert await status() == 1 and (await _http(base + "/healthz"))[0] == 200
            # the runtime gone: every service NOT_SERVING, as /healthz says
            await n.fake.stop(0)
            await _until(lambda: not proxy.probe.up, "the probe to see the runtime gone")
            assert (await status(), await status("runtime.v1.RuntimeService")) == (2, 2)
            status_code, text = await _http(base + "/healthz")
            assert status_code == 503 and "not answering" in text

    run(main())
