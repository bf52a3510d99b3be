"""Enforcement end to end in one process: kubelet-like calls through the proxy to the fake runtime."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import grpc
import grpc.aio
import pytest

from cri_api.v1 import api_pb2 as v1
from cri_proxy.enforce.hooks import EnforceHooks
from cri_proxy.fake_runtime.server import FakeOptions, FakeRuntime
from tests.unit.enforce_support import QOS_LABEL, alloc, node
from tests.unit.relay_support import run

LSR = {QOS_LABEL: "LSR"}
LSE = {QOS_LABEL: "LSE"}


def test_lsr_pod_carves_the_ls_pool_before_its_container_is_created_and_gives_it_back(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path) as n:
            _, be = await n.run_pod("be", "besteffort")
            _, ls = await n.run_pod("ls", "burstable")
            _, numa1 = await n.run_pod(
                "numa1",
                "burstable",
                {QOS_LABEL: "LS"},
                alloc(numaNodeResources=[{"node": 1, "resources": {"cpu": "2"}}]),
            )
            assert (n.cpuset(be["main"]), n.cpuset(ls["main"]), n.cpuset(numa1["main"])) == (
                "0-15",
                "0-15",
                "8-15",
            )
            updates_before = len(n.fake.store.containers[ls["main"]].updates)
            lsr_sandbox, lsr = await n.run_pod("lsr", "guaranteed", LSR, alloc("2-3,9"))
            assert n.cpuset(lsr["main"]) == "2-3,9"
            # the LS containers left 2-3,9 before the LSR container existed: the update came first
            ls_record = n.fake.store.containers[ls["main"]]
            assert [u.cpuset_cpus for u in ls_record.updates[updates_before:]] == ["0-1,4-8,10-15"]
            assert n.cpuset(numa1["main"]) == "8,10-15"
            assert n.cpuset(be["main"]) == "0-15"  # BE may run on LSR CPUs
            # the update carried the full resources, not just the cpuset
            update = ls_record.updates[-1]
            assert (update.cpu_shares, update.cpu_quota, update.memory_limit_in_bytes) == (
                512,
                50000,
                64 << 20,
            )
            await n.remove_pod(lsr_sandbox)
            await n.settle()
            assert (n.cpuset(ls["main"]), n.cpuset(numa1["main"])) == ("0-15", "8-15")

    run(main())


def test_lse_pod_moves_be_too(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path) as n:
            _, be = await n.run_pod("be", "besteffort")
            _, lse = await n.run_pod("lse", "guaranteed", LSE, alloc("0-3"))
            await n.settle()
            assert (n.cpuset(lse["main"]), n.cpuset(be["main"])) == ("0-3", "4-15")

    run(main())


def test_kubelets_update_keeps_the_decision_and_merges_the_rest(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path) as n:
            await n.run_pod("lsr", "guaranteed", LSR, alloc("0-1"))
            _, ls = await n.run_pod("ls", "burstable")
            assert n.cpuset(ls["main"]) == "2-15"
            rt = n.stub()
            # the static CPU manager re-sends only a cpuset; in-place resize sends CPU fields
            await rt.UpdateContainerResources(
                v1.UpdateContainerResourcesRequest(
                    container_id=ls["main"], linux=v1.LinuxContainerResources(cpuset_cpus="0-15")
                )
            )
            await rt.UpdateContainerResources(
                v1.UpdateContainerResourcesRequest(
                    container_id=ls["main"], linux=v1.LinuxContainerResources(cpu_quota=80000)
                )
            )
            record = n.fake.store.containers[ls["main"]]
            assert [u.cpuset_cpus for u in record.updates[-2:]] == ["2-15", "2-15"]
            last = record.updates[-1]  # forwarded whole: merged with what was known
            assert (last.cpu_quota, last.cpu_shares, last.memory_limit_in_bytes) == (80000, 512, 64 << 20)

    run(main())


def test_a_limit_changed_at_the_runtime_directly_is_what_the_proxy_sends_after(tmp_path: Path) -> None:
    """A change at the runtime behind the proxy's back (`crictl update --memory` on its socket):
    the kubelet's cpuset-only update merged into what the runtime holds, and the proxy's own move
    of the container too, carry the runtime's limit, not the proxy's copy from the create."""

    async def main() -> None:
        async with node(tmp_path) as n:
            _, ls = await n.run_pod("ls", "burstable")  # 64 MiB
            held = n.fake.store.containers[ls["main"]]
            held.resources.memory_limit_in_bytes = 48 << 20  # changed at the runtime directly
            await n.stub().UpdateContainerResources(
                v1.UpdateContainerResourcesRequest(
                    container_id=ls["main"], linux=v1.LinuxContainerResources(cpuset_cpus="0-15")
                )
            )
            assert held.updates[-1].memory_limit_in_bytes == 48 << 20  # was the copy's 64 MiB
            held.resources.memory_limit_in_bytes = 40 << 20
            await n.run_pod("lsr", "guaranteed", LSR, alloc("0-1"))  # the LS container is moved
            await n.settle()
            last = held.updates[-1]
            assert (last.cpuset_cpus, last.memory_limit_in_bytes, last.cpu_quota) == ("2-15", 40 << 20, 50000)

    run(main())


def test_kubelet_static_containers_follow_the_state_file_and_others_avoid_them(tmp_path: Path) -> None:
    state = {
        "policyName": "static",
        "defaultCpuSet": "0,3-15",
        "entries": {"uid-pinned": {"main": "1-2"}},
        "checksum": 1,
    }

    async def main() -> None:
        async with node(tmp_path, kubelet_state=state) as n:
            _, ls = await n.run_pod("ls", "burstable")
            _, pinned = await n.run_pod("pinned", "guaranteed")
            assert (n.cpuset(pinned["main"]), n.cpuset(ls["main"])) == ("1-2", "0,3-15")
            rt = n.stub()
            await rt.UpdateContainerResources(
                v1.UpdateContainerResourcesRequest(
                    container_id=pinned["main"], linux=v1.LinuxContainerResources(cpuset_cpus="1-2")
                )
            )
            assert n.cpuset(pinned["main"]) == "1-2"
            # kubelet re-pins: the file changes, the LS container moves off the new CPUs
            new = {**state, "entries": {"uid-pinned": {"main": "4-5"}}}
            (tmp_path / "cpu_manager_state").write_text(json.dumps(new))
            for _ in range(100):
                if n.cpuset(ls["main"]) == "0-3,6-15":
                    break
                await asyncio.sleep(0.05)
            assert n.cpuset(ls["main"]) == "0-3,6-15"
            assert n.cpuset(pinned["main"]) == "4-5"
            # a half-written file: the last good contents are kept, nothing moves
            (tmp_path / "cpu_manager_state").write_text('{"policyName": "static", "entr')
            await asyncio.sleep(0.3)
            await n.settle()
            assert n.cpuset(ls["main"]) == "0-3,6-15"
            problems = (await n.introspect("Plan"))["problems"]
            assert [p["kind"] for p in problems] == ["bad-kubelet-state"]

    run(main())


@pytest.mark.parametrize("policy", ["ignore", "fail"])
def test_bad_annotation_follows_the_fail_policy(tmp_path: Path, policy: str) -> None:
    async def main() -> None:
        async with node(tmp_path, fail_policy=policy) as n:
            broken = {"scheduling.koordinator.sh/resource-status": '{"cpuset": 5'}
            if policy == "ignore":
                _, ids = await n.run_pod("broken", "burstable", LSR, broken)
                assert n.cpuset(ids["main"]) == "0-15"  # treated as absent: the LS rule
            else:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await n.run_pod("broken", "burstable", LSR, broken)
                assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert "default/broken" in (err.value.details() or "")
                assert "resource-status" in (err.value.details() or "")
                assert not n.fake.store.containers
                assert not [c for c in n.proxy.state.containers() if c.id.startswith("pending/")]

    run(main())


def test_dry_run_decides_and_changes_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, dry_run=True) as n:
            _, ls = await n.run_pod("ls", "burstable")
            await n.run_pod("lsr", "guaranteed", LSR, alloc("0-1"))
            await n.settle()
            assert n.cpuset(ls["main"]) == ""
            assert not n.fake.store.containers[ls["main"]].updates
            rows = {r["pod"]: r for r in await n.introspect("Cpusets")}
            assert rows["default/ls"]["decided"] == "2-15"

    run(main())


def test_restart_recovers_every_container_with_the_same_decisions(tmp_path: Path) -> None:
    async def main() -> None:
        fake = FakeRuntime(FakeOptions(listen=f"unix://{tmp_path}/runtime.sock"))
        await fake.start()
        try:
            async with node(tmp_path, fake=fake) as n:
                await n.run_pod("lsr", "guaranteed", LSR, alloc("0-1"))
                await n.run_pod("ls", "burstable", containers=("a", "b"))
                await n.run_pod("be", "besteffort")
                await n.settle()
                before = await n.introspect("Cpusets")
                updates = {cid: len(c.updates) for cid, c in fake.store.containers.items()}
            (tmp_path / "proxy.sock").unlink(missing_ok=True)
            for checkpoint in ("keep", "corrupt"):
                if checkpoint == "corrupt":
                    (tmp_path / "state/checkpoint.json").write_text('{"version": 1, "pods": [')
                async with node(tmp_path, fake=fake) as again:
                    await again.settle()
                    assert await again.introspect("Cpusets") == before
                    assert {cid: len(c.updates) for cid, c in fake.store.containers.items()} == updates
                    snapshot = await again.introspect("Snapshot")
                    assert len(snapshot["pods"]) == 3
        finally:
            await fake.stop(0)

    run(main())


def test_snapshot_replayed_by_plan_gives_the_live_decisions(tmp_path: Path) -> None:
    import subprocess
    import sys

    async def main() -> tuple[dict[str, object], dict[str, object]]:
        async with node(tmp_path) as n:
            await n.run_pod("lsr", "guaranteed", LSR, alloc("3"))
            await n.run_pod("ls", "burstable")
            await n.run_pod("be", "besteffort")
            return await n.introspect("Snapshot"), await n.introspect("Plan")

    snapshot, live = run(main())
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(snapshot))
    cli = str(Path(sys.executable).parent / "cri-proxy")
    out = subprocess.run([cli, "plan", "--snapshot", str(path)], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == live


def test_a_container_gone_behind_the_proxys_back_is_forgotten(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path) as n:
            _, ls = await n.run_pod("ls", "burstable")
            del n.fake.store.containers[ls["main"]]  # removed straight at the runtime
            await n.run_pod("lsr", "guaranteed", LSR, alloc("0"))
            await n.settle()
            assert n.proxy.state.container(ls["main"]) is None
            assert n.proxy.reconciler.totals.dropped == 1

    run(main())


def test_exclusive_wait_is_bounded_when_the_runtime_is_slow(tmp_path: Path) -> None:
    async def main() -> None:
        fake = FakeRuntime(FakeOptions(listen=f"unix://{tmp_path}/runtime.sock", update_latency=1.5))
        await fake.start()
        try:
            async with node(tmp_path, fake=fake, exclusive_wait_seconds=0.2) as n:
                await n.run_pod("ls", "burstable")
                loop = asyncio.get_running_loop()
                began = loop.time()
                await n.run_pod("lsr", "guaranteed", LSR, alloc("0-1"))
                assert loop.time() - began < 1.4  # did not wait for the 1.5 s update
                assert n.proxy.hooks.exclusive_timeouts == 1
        finally:
            await fake.stop(0)

    run(main())


def test_v1alpha2_calls_are_enforced_too(tmp_path: Path) -> None:
    from cri_api.v1alpha2 import api_pb2 as v1alpha2

    async def main() -> None:
        async with node(tmp_path) as n:
            n.pb = v1alpha2
            from cri_api.v1alpha2 import api_pb2_grpc

            n.stub = lambda: api_pb2_grpc.RuntimeServiceStub(n.channel)  # type: ignore[method-assign,no-untyped-call]
            _, ls = await n.run_pod("ls", "burstable")
            _, lsr = await n.run_pod("lsr", "guaranteed", LSR, alloc("4-7"))
            await n.settle()
            assert (n.cpuset(lsr["main"]), n.cpuset(ls["main"])) == ("4-7", "0-3,8-15")

    run(main())


@pytest.mark.parametrize("mode", ["frames", "grpc"])
@pytest.mark.parametrize("where", ["waiting-for-exclusivity", "at-the-runtime"])
def test_a_cancelled_create_container_leaves_nothing_pending(tmp_path: Path, mode: str, where: str) -> None:
    """kubelet gives up on a CreateContainer (deadline): no half-created container stays in the
    state, and the line about the create says it was not made."""
    from loguru import logger

    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="INFO", format="{message}")

    async def main() -> None:
        slow = FakeOptions(
            listen=f"unix://{tmp_path}/runtime.sock",
            update_latency=2.0 if where == "waiting-for-exclusivity" else 0.0,
            create_latency=2.0 if where == "at-the-runtime" else 0.0,
        )
        fake = FakeRuntime(slow)
        await fake.start()
        try:
            async with node(tmp_path, fake=fake, relay_mode=mode) as n:
                await n.run_pod("ls", "burstable")
                pb, rt = n.pb, n.stub()
                config = pb.PodSandboxConfig(
                    metadata=pb.PodSandboxMetadata(name="lsr", uid="uid-lsr", namespace="default"),
                    labels=LSR,
                    annotations=alloc("0-1"),
                    linux=pb.LinuxPodSandboxConfig(cgroup_parent="/kubepods/poduid-lsr"),
                )
                sandbox = (await rt.RunPodSandbox(pb.RunPodSandboxRequest(config=config))).pod_sandbox_id
                create = pb.CreateContainerRequest(
                    pod_sandbox_id=sandbox,
                    sandbox_config=config,
                    config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name="main")),
                )
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await rt.CreateContainer(create, timeout=0.3)
                assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
                head = "default/lsr main: LSR -> cpuset 0-1 (allocation cpuset); "
                for _ in range(100):  # the line comes a moment after the call ended (`put_off`)
                    pending = [c for c in n.proxy.state.containers() if c.id.startswith("pending/")]
                    if not pending and any(line.startswith(head) for line in lines):
                        break
                    await asyncio.sleep(0.05)
                assert not [c.id for c in n.proxy.state.containers() if c.id.startswith("pending/")]
                about = [line for line in lines if line.startswith("default/lsr main: LSR -> cpuset 0-1")]
                # at the runtime, the client's cancel and the runtime's own deadline race (both
                # at 0.3 s): the call ends as whichever reached the proxy first
                ended = (
                    ["not forwarded: the call was cancelled"]
                    if where == "waiting-for-exclusivity"
                    else ["not created: CANCELLED", "not created: DEADLINE_EXCEEDED"]
                )
                assert len(about) == 1 and about[0].removeprefix(head) in ended, about
        finally:
            await fake.stop(0)

    try:
        run(main())
    finally:
        logger.remove(sink)


def test_an_update_naming_a_container_made_behind_the_proxys_back_gets_its_decision(tmp_path: Path) -> None:
    """kubelet's update for a container the proxy has not listed yet (made behind its back, or
    right after a proxy restart) is not forwarded blind: the proxy lists the runtime first."""

    async def main() -> None:
        async with node(tmp_path, reconcile_period_seconds=0) as n:  # no periodic listing
            direct = grpc.aio.insecure_channel(n.fake.opts.listen)
            try:
                behind = dataclasses.replace(n, channel=direct)
                _, lsr = await behind.run_pod("lsr", "guaranteed", LSR, alloc("2-3"))
                assert n.proxy.state.container(lsr["main"]) is None  # not through the proxy
                kubelet_says = v1.LinuxContainerResources(cpuset_cpus="0-15", cpu_shares=2048)
                await n.stub().UpdateContainerResources(
                    v1.UpdateContainerResourcesRequest(container_id=lsr["main"], linux=kubelet_says)
                )
                assert n.cpuset(lsr["main"]) == "2-3"  # pinned, not the kubelet's pool
                assert n.fake.store.containers[lsr["main"]].resources.cpu_shares == 2048  # the rest kept
                assert n.proxy.state.container(lsr["main"]) is not None  # adopted on the way
                # an id the runtime does not have either: its own answer, as directly
                with pytest.raises(grpc.aio.AioRpcError) as proxied:
                    await n.stub().UpdateContainerResources(
                        v1.UpdateContainerResourcesRequest(container_id="nope", linux=kubelet_says)
                    )
                with pytest.raises(grpc.aio.AioRpcError) as straight:
                    await behind.stub().UpdateContainerResources(
                        v1.UpdateContainerResourcesRequest(container_id="nope", linux=kubelet_says)
                    )
                assert proxied.value.code() == straight.value.code() == grpc.StatusCode.NOT_FOUND
            finally:
                await direct.close(None)

    run(main())


async def pod_d_p(hooks: EnforceHooks) -> None:
    """Pod d/p (sandbox "s", BestEffort) as its RunPodSandbox's post hook records it."""
    from cri_proxy.relay.methods import KNOWN

    config = v1.PodSandboxConfig(
        metadata=v1.PodSandboxMetadata(name="p", uid="uid-p", namespace="d"),
        linux=v1.LinuxPodSandboxConfig(cgroup_parent="/kubepods/besteffort/poduid-p"),
    )
    run_pod = KNOWN["/runtime.v1.RuntimeService/RunPodSandbox"]
    response = v1.RunPodSandboxResponse(pod_sandbox_id="s")
    await hooks.run_pod_sandbox(v1.RunPodSandboxRequest(config=config), response, run_pod)


async def kubelet_container(hooks: EnforceHooks, name: str, updated: bool = False, sandbox: str = "s") -> str:
    """A container of pod d/p (or of `sandbox`) as a kubelet makes it, through the hooks: created
    (id `name`), then (`updated`: after a client's update) started; the cpuset its create was sent
    with."""
    from cri_proxy.relay.methods import KNOWN

    service = "/runtime.v1.RuntimeService/"
    config = v1.ContainerConfig(metadata=v1.ContainerMetadata(name=name))
    create = KNOWN[service + "CreateContainer"]
    request = v1.CreateContainerRequest(pod_sandbox_id=sandbox, config=config)
    sent = await hooks.create_container(request, create)
    await asyncio.sleep(0)  # the create's record goes in, as after its request went on
    await hooks.container_created(sent, v1.CreateContainerResponse(container_id=name), create)
    if updated:
        change = v1.UpdateContainerResourcesRequest(
            container_id=name, linux=v1.LinuxContainerResources(cpu_shares=256)
        )
        await hooks.update_resources(change, KNOWN[service + "UpdateContainerResources"])
    start = v1.StartContainerRequest(container_id=name)
    await hooks.container_started(start, v1.StartContainerResponse(), KNOWN[service + "StartContainer"])
    await asyncio.sleep(0)
    return sent.config.linux.resources.cpuset_cpus  # type: ignore[attr-defined,no-any-return]


def test_the_line_about_each_create_is_written_once_when_its_call_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The INFO line about a create waits for its call's end and says how it ended; lines waiting
    are bounded (a runtime that never answers): past the bound the oldest is written at once, and
    so is the line of a create sent again before the first one ended."""
    from loguru import logger

    from cri_proxy.enforce import hooks as hooks_module
    from cri_proxy.logs import write_put_off
    from cri_proxy.relay.methods import KNOWN

    monkeypatch.setattr(hooks_module, "LINES_WAITING", 2)
    create = KNOWN["/runtime.v1.RuntimeService/CreateContainer"]
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="INFO", format="{message}")

    async def main() -> None:
        async with node(tmp_path) as n:
            hooks = n.proxy.hooks
            await pod_d_p(hooks)
            requests = {}
            lines.clear()
            for name in ("a", "b", "c", "c"):
                meta = v1.ContainerMetadata(name=name)
                config_c = v1.ContainerConfig(metadata=meta)
                request = v1.CreateContainerRequest(pod_sandbox_id="s", config=config_c)
                requests[name] = await hooks.create_container(request, create)
                await asyncio.sleep(0)  # the loop turns between calls (a create's record may wait for it)
            write_put_off()  # the lines put off, now
            assert lines == [
                "d/p a: BE -> cpuset 0-15 (BE share pool); no answer yet",  # pushed out by c
                "d/p c: BE -> cpuset 0-15 (BE share pool); no answer yet",  # the same create again
            ]
            made = v1.CreateContainerResponse
            await hooks.container_created(requests["b"], made(container_id="ctr-b"), create)
            await hooks.create_failed(requests["c"], grpc.StatusCode.DEADLINE_EXCEEDED, create)
            await hooks.container_created(requests["a"], made(container_id="ctr-a"), create)
            write_put_off()
            assert lines[2:] == [
                "d/p b: BE -> cpuset 0-15 (BE share pool); created ctr-b",
                "d/p c: BE -> cpuset 0-15 (BE share pool); not created: DEADLINE_EXCEEDED",
            ]  # a's line was written already: not twice

    try:
        run(main())
    finally:
        logger.remove(sink)


def test_a_create_answered_before_its_record_went_in_loses_nothing(tmp_path: Path) -> None:
    """A create decided early (`Policy.before_create`) goes on before its pending record and line
    go in (they follow in the next loop turn); an answer or a failure that comes sooner, in the
    same turn, finds them all the same: the container is kept, a failed create leaves nothing."""
    from loguru import logger

    from cri_proxy.enforce.hooks import pending_id
    from cri_proxy.logs import write_put_off
    from cri_proxy.relay.methods import KNOWN

    create = KNOWN["/runtime.v1.RuntimeService/CreateContainer"]
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="INFO", format="{message}")

    async def main() -> None:
        async with node(tmp_path) as n:
            hooks, state = n.proxy.hooks, n.proxy.state
            await pod_d_p(hooks)
            await asyncio.sleep(0)  # the plan after the change, the next create read ahead
            lines.clear()
            for name, ends in (("a", "created"), ("b", "failed")):
                request = v1.CreateContainerRequest(
                    pod_sandbox_id="s", config=v1.ContainerConfig(metadata=v1.ContainerMetadata(name=name))
                )
                sent = await hooks.create_container(request, create)
                assert sent.config.linux.resources.cpuset_cpus == "0-15"  # type: ignore[attr-defined]
                assert state.container(pending_id("s", name, 0)) is None  # decided early: not in yet
                if ends == "created":
                    answer = v1.CreateContainerResponse(container_id="ctr-a")
                    await hooks.container_created(sent, answer, create)
                else:
                    await hooks.create_failed(sent, grpc.StatusCode.UNAVAILABLE, create)
                await asyncio.sleep(0)  # the turn after: the record's own callback finds it done
                await asyncio.sleep(0)
            assert [c.id for c in state.containers()] == ["ctr-a"]
            write_put_off()
            assert lines == [
                "d/p a: BE -> cpuset 0-15 (BE share pool); created ctr-a",
                "d/p b: BE -> cpuset 0-15 (BE share pool); not created: UNAVAILABLE",
            ]
            assert hooks.injected == {"BE": 2}

    try:
        run(main())
    finally:
        logger.remove(sink)


def test_a_kubelets_creates_in_a_pod_read_ahead_without_a_plan_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod's containers as a kubelet makes them (create, start, create, ...), right after one
    another: each create reads the decision read ahead, with no plan on its path; the plan after a
    create is made in its start's hook, before the start's answer (`EnforceHooks._plan_now`), not
    PLAN_LATER after, as the next create may come. A new pod that moves no pool: its first create
    and the next in the pod before read ahead still (`Policy.read_ahead`, then
    `Policy.prepare_after_plan`). A new pod that may move the pools: its hook makes the plan, and
    the next create reads what it decides, rightly."""
    from cri_proxy.enforce import hooks as hooks_module
    from cri_proxy.enforce.policy import Policy
    from cri_proxy.relay.methods import KNOWN
    from tests.unit.test_create_early import reads

    monkeypatch.setattr(hooks_module, "PLAN_LATER", 0.05)
    run_pod = KNOWN["/runtime.v1.RuntimeService/RunPodSandbox"]

    async def new_pod(name: str, labels: dict[str, str]) -> None:
        config = v1.PodSandboxConfig(
            metadata=v1.PodSandboxMetadata(name=name, uid=f"uid-{name}", namespace="d"),
            linux=v1.LinuxPodSandboxConfig(cgroup_parent=f"/kubepods/besteffort/poduid-{name}"),
            labels=labels,
        )
        response = v1.RunPodSandboxResponse(pod_sandbox_id=name)
        await hooks.run_pod_sandbox(v1.RunPodSandboxRequest(config=config), response, run_pod)

    async def main() -> None:
        nonlocal hooks
        async with node(tmp_path) as n:
            hooks, policy = n.proxy.hooks, n.proxy.policy
            await pod_d_p(hooks)
            await asyncio.sleep(0)  # the plan after the new pod, its next create read ahead
            read = reads(policy)
            plans = 0
            plan = policy.plan

            def counted() -> object:
                nonlocal plans
                plans += 1
                return plan()

            policy.plan = counted  # type: ignore[assignment,method-assign]

            for name in ("a", "b", "c"):
                assert await kubelet_container(hooks, name) == "0-15"
            assert len(read) == 3 and all(e is not None for e in read)
            assert plans == 3 and hooks._planning is None  # one in each start's hook; none waits
            # a new pod that moves no pool: its first create, and the next one in d/p, read ahead
            plans = 0
            await new_pod("n", {})
            assert plans == 0
            assert await kubelet_container(hooks, "n1", sandbox="n") == "0-15"
            assert read[-1] is not None
            d_p = policy.state.pod("s")  # still read ahead after the plan in n1's start: asked alone
            assert d_p is not None and policy.before_create(d_p, None) is not None
            assert await kubelet_container(hooks, "d1") == "0-15"
            assert read[-1] is not None and plans == 2
            fresh = Policy(policy.state, policy.topology, policy.settings).plan()
            assert str(fresh.containers["n1"].cpuset) == str(fresh.containers["d1"].cpuset) == "0-15"
            # another pod comes that may move the pools: its hook makes the plan, before its answer
            plans = 0
            await new_pod("o", {QOS_LABEL: "LS"})
            assert plans == 1
            assert await kubelet_container(hooks, "d") == "0-15"
            assert read[-1] is not None
            fresh = Policy(policy.state, policy.topology, policy.settings).plan()
            assert str(fresh.containers["d"].cpuset) == "0-15"
            await n.settle()

    hooks: EnforceHooks
    run(main())


def test_a_start_is_checked_only_when_an_update_went_to_its_container(tmp_path: Path) -> None:
    """A container's start is checked against its cgroup (`Reconciler.verify_started`) when an
    update went to it since its create, a client's included (the kubelet's, relayed here): it may
    have landed around the start. A container as its create left it is not checked."""

    async def main() -> None:
        async with node(tmp_path) as n:
            hooks, reconciler = n.proxy.hooks, n.proxy.reconciler
            await pod_d_p(hooks)
            for name, updated in (("a", False), ("b", True)):
                await kubelet_container(hooks, name, updated)
                assert reconciler.totals.start_checks == int(updated)
            await reconciler.checks_done()

    run(main())
