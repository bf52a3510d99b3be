"""The reconciler on its own: coalescing, bounded concurrency, retries, NOT_FOUND, drift repair."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import replace
from typing import Any

import grpc
import grpc.aio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cri_api.v1 import api_pb2 as v1
from cri_proxy.config import Config
from cri_proxy.cpu import CPUSet, Topology
from cri_proxy.enforce.actual import Reading
from cri_proxy.enforce.policy import Policy
from cri_proxy.enforce.reconciler import Reconciler
from cri_proxy.state.model import ACTUAL_CGROUP, ContainerRecord, ContainerState, NodeState, PodRecord
from tests.unit.relay_support import run

TOPOLOGY = Topology.build({0: CPUSet.parse("0-7"), 1: CPUSet.parse("8-15")})
FULL = v1.LinuxContainerResources(
    cpu_shares=512, cpu_quota=20000, memory_limit_in_bytes=1 << 30, cpuset_cpus="0-15"
)


def rpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=f"fake {code.name}")


def node_with(ls_containers: int, lsr_cpus: str | None = "0-1") -> NodeState:
    """LS pods with one running container each on 0-15, plus (optionally) an LSR pod on `lsr_cpus`."""
    state = NodeState()
    for i in range(ls_containers):
        state.put_pod(PodRecord(f"s{i}", f"u{i}", f"ls{i}", "default", f"/kubepods/burstable/podu{i}"))
        state.put_container(
            ContainerRecord(
                f"c{i}", f"s{i}", "main", FULL.SerializeToString(), ContainerState.RUNNING, applied="0-15"
            )
        )
    if lsr_cpus is not None:
        state.put_pod(lsr_pod(lsr_cpus))
    return state


def lsr_pod(cpus: str) -> PodRecord:
    """The LSR pod `s-lsr`, allocated `cpus`."""
    return PodRecord(
        "s-lsr",
        "u-lsr",
        "lsr",
        "default",
        "/kubepods/podu-lsr",
        labels={"koordinator.sh/qosClass": "LSR"},
        annotations={"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": cpus})},
    )


SETTING = {"concurrency": "reconcile_concurrency", "period": "reconcile_period_seconds", "dry_run": "dry_run"}


def reconciler(state: NodeState, send: Recorder, **options: Any) -> Reconciler:
    """A reconciler for `state` on TOPOLOGY, nothing reserved, updates sent to `send`; `options` are
    settings by their short names (concurrency, period, dry_run) or Reconciler arguments."""
    settings = Config(**{SETTING[k]: options.pop(k) for k in list(options) if k in SETTING})
    return Reconciler(state, Policy(state, TOPOLOGY, lambda: settings), send, lambda: settings, **options)


class Recorder:
    """A runtime stand-in for UpdateContainerResources: records calls, can fail or block."""

    def __init__(self, failures: list[grpc.StatusCode] | None = None, gated: bool = False) -> None:
        """`gated`: every call waits until `gate` is set."""
        self.calls: list[tuple[str, v1.LinuxContainerResources]] = []
        self.failures = list(failures or [])
        self.gate: asyncio.Event | None = asyncio.Event() if gated else None
        self.active = 0
        self.peak = 0

    async def __call__(self, c: ContainerRecord, linux: bytes) -> None:
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(0.001)
            if self.gate is not None:
                await self.gate.wait()
            self.calls.append((c.id, v1.LinuxContainerResources.FromString(linux)))
            if self.failures:
                raise rpc_error(self.failures.pop(0))
        finally:
            self.active -= 1


def test_updates_carry_full_resources_with_bounded_concurrency() -> None:
    async def main() -> None:
        state = node_with(20)
        send = Recorder()
        r = reconciler(state, send, concurrency=3)
        result = await r.pass_once()
        assert result.updated == 20 and send.peak <= 3
        assert {cid for cid, _ in send.calls} == {f"c{i}" for i in range(20)}
        sent = send.calls[0][1]
        assert (sent.cpuset_cpus, sent.cpu_shares, sent.cpu_quota, sent.memory_limit_in_bytes) == (
            "2-15",
            512,
            20000,
            1 << 30,
        )
        assert all(c.applied == "2-15" for c in state.containers())
        assert (await r.pass_once()).updated == 0  # nothing left to do

    run(main())


def test_transient_errors_are_retried_permanent_ones_are_not() -> None:
    async def main() -> None:
        state = node_with(1)
        send = Recorder([grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED])
        r = reconciler(state, send)
        assert (await r.pass_once()).updated == 1
        assert len(send.calls) == 3
        state2 = node_with(1)
        send2 = Recorder([grpc.StatusCode.INVALID_ARGUMENT])
        r2 = reconciler(state2, send2)
        result = await r2.pass_once()
        assert (result.updated, result.failed, len(send2.calls)) == (0, 1, 1)
        assert state2.container("c0").applied == "0-15"  # type: ignore[union-attr]  # tried again next pass

    run(main())


def test_the_same_failure_pass_after_pass_is_written_out_once() -> None:
    """A runtime that refuses a container's update the same way every pass (cgroup v1: its pod
    cgroup lacks CPUs that came back online) is named once, then at DEBUG; another failure is
    named again, and the update that goes through at last says so."""
    from loguru import logger

    async def main() -> None:
        state = node_with(1)
        code = grpc.StatusCode.UNKNOWN
        send = Recorder([code, code, code, grpc.StatusCode.PERMISSION_DENIED, code])
        r = reconciler(state, send)
        lines: list[str] = []
        sink = logger.add(lambda m: lines.append(str(m).strip()), level="DEBUG", format="{level} {message}")
        try:
            results = [await r.pass_once() for _ in range(6)]
        finally:
            logger.remove(sink)
        assert [(x.updated, x.failed) for x in results] == [(0, 1)] * 5 + [(1, 0)]
        said = [line for line in lines if "update to cpuset" in line or "->" in line]
        assert said == [
            "WARNING default/ls0 main (c0): update to cpuset 2-15 failed: UNKNOWN fake UNKNOWN",
            "DEBUG default/ls0 main (c0): update to cpuset 2-15 failed again: UNKNOWN fake UNKNOWN",
            "DEBUG default/ls0 main (c0): update to cpuset 2-15 failed again: UNKNOWN fake UNKNOWN",
            "WARNING default/ls0 main (c0): update to cpuset 2-15 failed: PERMISSION_DENIED fake"
            " PERMISSION_DENIED",
            "WARNING default/ls0 main (c0): update to cpuset 2-15 failed: UNKNOWN fake UNKNOWN",
            "INFO default/ls0 main (c0): cpuset '0-15' -> '2-15' (after failing)",
        ]
        assert r.totals.failed == 5  # every failure still counted

    run(main())


def test_a_container_the_runtime_no_longer_has_is_forgotten() -> None:
    async def main() -> None:
        state = node_with(2)
        send = Recorder([grpc.StatusCode.NOT_FOUND])
        r = reconciler(state, send, concurrency=1)
        result = await r.pass_once()
        assert (result.updated, result.dropped) == (1, 1)
        assert len(state.containers()) == 1

    run(main())


def test_a_burst_of_requests_during_a_pass_gives_one_more_pass() -> None:
    async def main() -> None:
        state = node_with(1)
        send = Recorder(gated=True)
        r = reconciler(state, send, period=0)
        task = asyncio.ensure_future(r.run())
        first = r.request()
        while not send.active:
            await asyncio.sleep(0.001)
        tickets = [r.request() for _ in range(50)]  # while the first pass is stuck in the runtime
        send.gate.set()
        assert await r.wait_for(first, 5)
        assert await r.wait_for(tickets[-1], 5)
        assert r.totals.passes == 2
        task.cancel()

    run(main())


def test_wait_for_times_out_when_the_runtime_hangs() -> None:
    async def main() -> None:
        state = node_with(1)
        send = Recorder(gated=True)
        r = reconciler(state, send, period=0)
        task = asyncio.ensure_future(r.run())
        assert not await r.wait_for(r.request(), 0.2)
        send.gate.set()
        task.cancel()

    run(main())


def test_drift_behind_the_proxys_back_is_repaired() -> None:
    async def main() -> None:
        state = node_with(2, lsr_cpus=None)
        actual = {"c0": "3", "c1": "0-15"}  # someone changed c0 at the runtime

        async def read(c: ContainerRecord, status_too: bool) -> Reading | None:
            return Reading(actual[c.id], ACTUAL_CGROUP)

        send = Recorder()
        r = reconciler(state, send, read_actual=read)
        assert (await r.pass_once()).updated == 0  # by our records all is well
        assert await r.refresh_applied() == 1
        assert r.totals.repaired == 1
        c0 = state.container("c0")
        assert c0 is not None and (c0.actual_cpuset, c0.actual_source) == ("3", "cgroup")
        assert (await r.pass_once()).updated == 1
        assert send.calls[0][0] == "c0" and send.calls[0][1].cpuset_cpus == "0-15"

    run(main())


@pytest.mark.parametrize("dry_run", [True, False])
def test_dry_run_sends_nothing(dry_run: bool) -> None:
    async def main() -> None:
        state = node_with(3)
        send = Recorder()
        r = reconciler(state, send, dry_run=dry_run)
        result = await r.pass_once()
        assert (len(send.calls), result.would_update) == ((0, 3) if dry_run else (3, 0))

    run(main())


def test_containers_with_unknown_resources_are_not_sent_a_bare_cpuset() -> None:
    async def main() -> None:
        state = node_with(1)
        state.put_container(ContainerRecord("bare", "s0", "side", b"", ContainerState.RUNNING, applied=None))
        send = Recorder()
        r = reconciler(state, send)
        await r.pass_once()
        assert [cid for cid, _ in send.calls] == ["c0"]

    run(main())


class Cgroups:
    """Containers' cgroup cpusets; an update reaches them unless `dropping` (containerd 1.6's race)."""

    def __init__(self, sets: dict[str, str]) -> None:
        self.sets = sets
        self.dropping = False
        self.reads: list[str] = []

    async def read(self, c: ContainerRecord, status_too: bool) -> Reading | None:
        self.reads.append(c.id)
        return Reading(self.sets[c.id], ACTUAL_CGROUP)

    def sender(self, inner: Recorder) -> Any:
        async def send(c: ContainerRecord, linux: bytes) -> None:
            await inner(c, linux)
            if not self.dropping:
                self.sets[c.id] = v1.LinuxContainerResources.FromString(linux).cpuset_cpus

        return send


def test_an_update_the_cgroup_never_got_is_found_and_sent_again() -> None:
    async def main() -> None:
        state = node_with(1)
        cgroups = Cgroups({"c0": "0-15"})
        send = Recorder()
        r = reconciler(state, cgroups.sender(send), read_actual=cgroups.read)
        cgroups.dropping = True
        assert (await r.pass_once()).updated == 1  # the runtime said OK
        c0 = state.container("c0")
        assert c0 is not None and (c0.applied, c0.actual_cpuset, c0.actual_source) == (
            "0-15",
            "0-15",
            "cgroup",
        )
        assert r.totals.repaired == 1
        cgroups.dropping = False
        assert (await r.pass_once()).updated == 1
        assert cgroups.sets["c0"] == "2-15" and len(send.calls) == 2
        assert (await r.pass_once()).updated == 0

    run(main())


def test_after_a_start_the_cgroup_is_checked_once_no_update_is_in_flight() -> None:
    async def main() -> None:
        state = node_with(1)
        cgroups = Cgroups({"c0": "0-15"})
        send = Recorder(gated=True)
        r = reconciler(state, cgroups.sender(send), read_actual=cgroups.read, period=0)
        task = asyncio.ensure_future(r.run())
        cgroups.dropping = True  # the update lands around the start: OK, but the cgroup keeps 0-15
        first = r.request()
        while not send.active:
            await asyncio.sleep(0.001)
        r.verify_started("c0")  # StartContainer answered while the update is in flight
        await asyncio.sleep(0.01)
        assert cgroups.reads == []  # the check waits for the update
        send.gate.set()
        assert await r.wait_for(first, 5)
        await r.checks_done()
        assert r.totals.repaired >= 1
        cgroups.dropping = False
        deadline = asyncio.get_running_loop().time() + 5
        while cgroups.sets["c0"] != "2-15" and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        assert cgroups.sets["c0"] == "2-15"  # re-sent by the pass the check asked for
        task.cancel()

    run(main())


def test_a_start_whose_cgroup_matches_asks_for_nothing() -> None:
    async def main() -> None:
        state = node_with(1, lsr_cpus=None)
        cgroups = Cgroups({"c0": "0-15"})
        r = reconciler(state, cgroups.sender(Recorder()), read_actual=cgroups.read)
        before = r.request()
        r.verify_started("c0")
        await r.checks_done()
        assert cgroups.reads == ["c0"] and r.totals.repaired == 0 and r.request() == before + 1

    run(main())


def test_a_start_no_update_went_to_since_its_create_is_not_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A container created with its cpuset (`created`) and started with no update sent to it since:
    nothing can have landed around its start, so no cgroup nor status is read (the kubelet's next
    call comes meanwhile). After an update (a client's, or the reconciler's own), the start is
    checked; so is one of more created containers than are remembered (the oldest is forgotten)."""
    from cri_proxy.enforce import reconciler as reconciler_module

    monkeypatch.setattr(reconciler_module, "FRESH_KEPT", 2)

    async def main() -> None:
        state = node_with(4, lsr_cpus=None)
        cgroups = Cgroups({f"c{i}": "0-15" for i in range(4)})
        r = reconciler(state, cgroups.sender(Recorder()), read_actual=cgroups.read)
        r.created("c0")
        r.verify_started("c0")
        await r.checks_done()
        assert cgroups.reads == []
        r.verify_started("c0")  # a second start (it was restarted): checked
        await r.checks_done()
        assert cgroups.reads == ["c0"]
        r.created("c1")
        r.updating("c1")  # a client's update relayed to it
        r.verify_started("c1")
        await r.checks_done()
        assert cgroups.reads == ["c0", "c1"]
        for cid in ("c2", "c3", "c0"):  # c2 is forgotten: more than FRESH_KEPT created
            r.created(cid)
        for cid in ("c2", "c3", "c0"):
            r.verify_started(cid)
        await r.checks_done()
        assert cgroups.reads == ["c0", "c1", "c2"]

    run(main())


def test_a_start_after_an_update_the_reconciler_sent_is_checked() -> None:
    """Created with its cpuset (`created`), then updated by a pass, its cgroup took the update; the
    start then puts the old set back (containerd 1.6): the start's check finds it."""

    async def main() -> None:
        state = node_with(1)  # an LSR pod on 0-1: the LS container must leave them
        cgroups = Cgroups({"c0": "0-15"})
        r = reconciler(state, cgroups.sender(Recorder()), read_actual=cgroups.read)
        r.created("c0")
        assert (await r.pass_once()).updated == 1
        assert cgroups.sets["c0"] == "2-15"
        cgroups.sets["c0"] = "0-15"  # the start around the update kept the create's set
        r.verify_started("c0")
        await r.checks_done()
        assert r.totals.repaired == 1

    run(main())


class Runtime:
    """The runtime side for the property test: each container's cgroup cpuset, and how the next
    updates end (ok, a transient or permanent error, or OK with the cgroup left as it was)."""

    def __init__(self, concurrency: int) -> None:
        self.sets: dict[str, str] = {}
        self.fault = "ok"
        self.concurrency = concurrency
        self.in_flight: dict[str, int] = {}

    async def send(self, c: ContainerRecord, linux: bytes) -> None:
        sent = v1.LinuxContainerResources.FromString(linux)
        assert (sent.cpu_shares, sent.cpu_quota, sent.memory_limit_in_bytes) == (512, 20000, 1 << 30)
        self.in_flight[c.id] = self.in_flight.get(c.id, 0) + 1
        assert self.in_flight[c.id] == 1, f"two updates to {c.id} at once"
        assert sum(self.in_flight.values()) <= self.concurrency, "more updates at once than allowed"
        try:
            await asyncio.sleep(0)
            if c.id not in self.sets:
                raise rpc_error(grpc.StatusCode.NOT_FOUND)
            if self.fault == "transient":
                raise rpc_error(grpc.StatusCode.UNAVAILABLE)
            if self.fault == "permanent":
                raise rpc_error(grpc.StatusCode.INVALID_ARGUMENT)
            if self.fault != "drop":
                self.sets[c.id] = sent.cpuset_cpus
        finally:
            self.in_flight[c.id] -= 1

    async def read(self, c: ContainerRecord, status_too: bool) -> Reading | None:
        await asyncio.sleep(0)
        if c.id not in self.sets:
            raise rpc_error(grpc.StatusCode.NOT_FOUND)
        return Reading(self.sets[c.id], ACTUAL_CGROUP)


STEP = st.one_of(
    st.tuples(st.just("add"), st.sampled_from([ContainerState.RUNNING, ContainerState.CREATED])),
    st.tuples(st.just("lsr"), st.sampled_from(["0-1", "2-3", "0-3", "8-9", None])),
    st.tuples(st.just("qos"), st.integers(0, 7), st.sampled_from(["BE", "LS", None])),
    st.tuples(st.sampled_from(["start", "vanish", "remove", "unpin"]), st.integers(0, 7)),
    st.tuples(st.sampled_from(["drift", "pin"]), st.integers(0, 7), st.sampled_from(["0-15", "4-5", "10"])),
    st.tuples(st.just("fault"), st.sampled_from(["ok", "transient", "permanent", "drop"])),
    st.tuples(st.just("request"), st.booleans()),
    st.tuples(st.just("settle")),
    st.tuples(st.just("yield"), st.integers(1, 20)),
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(STEP, min_size=1, max_size=40), st.integers(1, 3))
def test_whatever_happens_one_settled_pass_leaves_every_container_as_decided(
    steps: list[tuple[Any, ...]], concurrency: int
) -> None:
    """Containers come, start, vanish behind the proxy's back or are removed; the share pool moves;
    a pod is relabelled to another QoS (its containers change, not their records);
    an operator pins; cgroups drift; updates fail (transient, permanent) or are dropped, in any
    interleaving with the passes the reconciler runs. Never two updates to a container at once,
    never more than the concurrency allowed, always the full resources. Once the runtime behaves, a
    plain pass leaves what the proxy knows as decided (and every cgroup not written behind its
    back), and one asked with a refresh leaves every container the runtime has as decided (cgroup
    and `applied` alike), and none it lacks in the state."""

    async def main() -> None:
        state = node_with(2)
        runtime = Runtime(concurrency)
        runtime.sets.update({"c0": "0-15", "c1": "0-15"})
        r = reconciler(
            state, runtime.send, concurrency=concurrency, period=0, retry_wait=0.001, read_actual=runtime.read
        )
        task = asyncio.ensure_future(r.run())
        made = 2
        tampered: set[str] = set()  # cgroups written behind the proxy's back: only a refresh sees them
        try:
            for step in steps:
                op, *args = step
                ids = sorted(c.id for c in state.containers())
                pods = sorted((p.sandbox_id, p) for p in state.pods() if p.sandbox_id != "s-lsr")
                pick = (
                    ids[args[0] % len(ids)] if ids and op in ("start", "vanish", "remove", "unpin") else None
                )
                if op == "add":
                    cid, sid = f"c{made}", f"s{made}"
                    made += 1
                    state.put_pod(
                        PodRecord(sid, f"u{cid}", f"ls-{cid}", "default", f"/kubepods/burstable/pod{cid}")
                    )
                    state.put_container(
                        ContainerRecord(cid, sid, "main", FULL.SerializeToString(), args[0], "0-15")
                    )
                    runtime.sets[cid] = "0-15"
                    if args[0] is ContainerState.CREATED:
                        r.created(cid)  # as the create's hook says: its cgroup has what the create set
                elif op == "lsr":
                    if args[0] is None:
                        state.remove_pod("s-lsr")
                    else:
                        state.put_pod(lsr_pod(args[0]))
                elif op == "qos" and pods:  # relabelled (the API's view): its pool, not the pools, moves
                    pod = pods[args[0] % len(pods)][1]
                    labels = {"koordinator.sh/qosClass": args[1]} if args[1] else {}
                    state.put_pod(replace(pod, labels=labels))
                elif op == "start" and pick is not None:
                    state.update_container(pick, state=ContainerState.RUNNING)
                    r.verify_started(pick)
                elif op == "vanish" and pick is not None:
                    runtime.sets.pop(pick, None)  # removed behind the proxy's back
                elif op == "remove" and pick is not None:
                    runtime.sets.pop(pick, None)
                    state.remove_container(pick)
                elif op == "unpin" and pick is not None:
                    r.policy.unpin(pick)
                elif op in ("drift", "pin") and ids:
                    cid = ids[args[0] % len(ids)]
                    if op == "pin":
                        r.policy.pin(cid, CPUSet.parse(args[1]))
                        r.request()
                    elif cid in runtime.sets:
                        runtime.sets[cid] = args[1]
                        tampered.add(cid)
                elif op == "fault":
                    runtime.fault = args[0]
                elif op == "request":
                    r.request(refresh=args[0])
                elif op == "settle":  # passes until one finds nothing to do: the next sees only what follows
                    for _ in range(5):
                        done = (r.totals.updated, r.totals.failed, r.totals.dropped)
                        await r.wait_for(r.request(), 10)
                        if (r.totals.updated, r.totals.failed, r.totals.dropped) == done:
                            break
                elif op == "yield":
                    for _ in range(args[0]):
                        await asyncio.sleep(0)
            runtime.fault = "ok"
            await r.checks_done()  # the start checks: a drift they find asks for a pass
            assert await r.wait_for(r.request(), 10)
            plan = r.policy.plan()
            for c in state.containers():  # a pass without a refresh: what the proxy knows, as decided
                decision = plan.containers.get(c.id)
                if decision is None or decision.cpuset is None or decision.qos is None:
                    continue
                if c.id in runtime.sets:
                    assert c.applied == str(decision.cpuset), c.id
                if c.id in runtime.sets and c.id not in tampered:  # a dropped update was found and sent again
                    assert runtime.sets[c.id] == c.applied, c.id
            assert await r.wait_for(r.request(refresh=True), 10)
            plan = r.policy.plan()
            for c in state.containers():
                assert c.id in runtime.sets, f"{c.id} is gone from the runtime but not from the state"
                decision = plan.containers.get(c.id)
                if decision is None or decision.cpuset is None or decision.qos is None:
                    continue
                want = str(decision.cpuset)
                assert (runtime.sets[c.id], c.applied) == (want, want), c.id
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    run(main())


def test_an_update_carries_what_the_runtime_holds_now_where_it_was_changed_directly() -> None:
    """`crictl update --memory` on the runtime's own socket: the proxy's next update of that
    container carries the runtime's limit (and containerd's own swap limit), not its older copy;
    a container the runtime no longer has is forgotten, and a runtime that does not answer the
    status leaves the copy as it is (the update then says what is wrong)."""
    changed = v1.LinuxContainerResources()
    changed.CopyFrom(FULL)
    changed.memory_limit_in_bytes = changed.memory_swap_limit_in_bytes = 512 << 20
    answers: dict[str, Any] = {"c0": changed.SerializeToString(), "c1": None}
    answers |= {"c2": rpc_error(grpc.StatusCode.NOT_FOUND), "c3": rpc_error(grpc.StatusCode.UNAVAILABLE)}

    async def held(c: ContainerRecord) -> bytes | None:
        answer = answers[c.id]
        if isinstance(answer, grpc.aio.AioRpcError):
            raise answer
        return answer  # type: ignore[no-any-return]

    async def main() -> None:
        state = node_with(4)
        send = Recorder()
        result = await reconciler(state, send, runtime_resources=held).pass_once()
        assert (result.updated, result.dropped) == (3, 1) and state.container("c2") is None
        sent = {cid: linux for cid, linux in send.calls}
        assert set(sent) == {"c0", "c1", "c3"}
        assert (sent["c0"].memory_limit_in_bytes, sent["c0"].memory_swap_limit_in_bytes) == (
            512 << 20,
            512 << 20,
        )
        # the rest as known, the cpuset as decided
        assert (sent["c0"].cpu_shares, sent["c0"].cpuset_cpus) == (512, "2-15")
        for cid in ("c1", "c3"):  # nothing said, or no answer: the copy
            assert (sent[cid].memory_limit_in_bytes, sent[cid].cpuset_cpus) == (1 << 30, "2-15")
        record = state.container("c0")
        assert record is not None and record.linux_resources().memory_limit_in_bytes == 512 << 20

    run(main())


def test_an_update_through_the_proxy_while_a_pass_waits_is_what_the_pass_sends() -> None:
    """A kubelet's resize that lands (through the proxy) while the pass's update of that container
    waits for its turn: the pass sends the copy as it is then, with the resize, not the one it
    started from, and not what the runtime said before the resize."""
    before = FULL.SerializeToString()

    async def held(c: ContainerRecord) -> bytes | None:
        return before  # what the runtime held when asked: the old limits

    async def main() -> None:
        state = node_with(2)
        send = Recorder(gated=True)
        passing = asyncio.ensure_future(
            reconciler(state, send, concurrency=1, runtime_resources=held).pass_once()
        )
        while send.active == 0:  # the first update holds the only turn
            await asyncio.sleep(0.001)
        resized = v1.LinuxContainerResources()
        resized.CopyFrom(FULL)
        resized.memory_limit_in_bytes = 2 << 30
        for cid in ("c0", "c1"):  # as the post hook of a kubelet's update records it
            state.update_container(cid, resources=resized.SerializeToString())
        assert send.gate is not None
        send.gate.set()
        assert (await passing).updated == 2
        sent = {cid: linux.memory_limit_in_bytes for cid, linux in send.calls}
        waited = next(cid for cid in sent if cid != send.calls[0][0])
        assert sent[waited] == 2 << 30, sent
        record = state.container(waited)
        assert record is not None and record.linux_resources().memory_limit_in_bytes == 2 << 30

    run(main())


def test_requests_more_often_than_the_period_do_not_put_the_periodic_pass_off() -> None:
    """A busy node's creates, or a container whose cgroup keeps refusing its set (asked again
    every period): passes requested more often than the period. The periodic pass (the runtime's
    listing, the drift repair) still comes every period; before, each request restarted its wait,
    and a container the runtime had long since stopped was held live and updated for good."""

    async def main() -> None:
        state = node_with(1, lsr_cpus=None)
        listings = 0

        async def sync() -> None:
            nonlocal listings
            listings += 1

        r = reconciler(state, Recorder(), period=0.3, sync=sync)
        task = asyncio.ensure_future(r.run())
        began = asyncio.get_running_loop().time()
        while asyncio.get_running_loop().time() - began < 1.25:
            r.request()
            await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert 2 <= listings <= 6, listings  # every 0.3 s (four), not never

    run(main())
