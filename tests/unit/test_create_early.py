"""A CreateContainer reads its decision from the plan the hooks made after the node's last change
(`Policy.before_create`), so nothing is decided on its call's path; what it reads is what the whole
plan says. Through a real proxy in front of the fake runtime, the calls as the kubelet makes them."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

from cri_proxy.enforce.policy import Early, Policy
from cri_proxy.state.model import PodRecord
from tests.unit.enforce_support import ALLOC, QOS_LABEL, node
from tests.unit.relay_support import run
from tests.unit.test_pass_after_create import create


def reads(policy: Policy) -> list[Early | None]:
    """What each create's `before_create` returns from now on, in order. A question for the pod
    alone (the ready hook's, before it reads the container's keys) counts only when it is
    answered: when it is not, the create asks again for its container."""
    read: list[Early | None] = []
    before_create = policy.before_create

    def spy(pod: PodRecord, container_id: str | None) -> Early | None:
        early = before_create(pod, container_id)
        if container_id is not None or early is not None:
            read.append(early)
        return early

    policy.before_create = spy  # type: ignore[method-assign]
    return read


def whole_plans(policy: Policy, cid: str) -> str:
    """The container's cpuset in the plan a fresh policy makes of the same state."""
    decision = Policy(policy.state, policy.topology, policy.settings).plan().containers[cid]
    return str(decision.cpuset)


def test_creates_read_their_decision_from_the_plan_made_after_the_last_change(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path) as n:
            policy = n.proxy.policy
            read = reads(policy)

            # plain pods, one with three containers, and a Koordinator LS pod: all read
            _, plain = await n.run_pod("plain", qos="besteffort", containers=("a", "b", "c"))
            _, ls = await n.run_pod("ls", labels={QOS_LABEL: "LS"})
            assert len(read) == 4 and all(e is not None for e in read)
            assert [e.decision.qos for e in read if e is not None] == ["BE"] * 3 + ["LS"]
            for cid in (*plain.values(), *ls.values()):
                assert n.cpuset(cid) == whole_plans(policy, cid)

            # an exclusive pod's container is decided on the path (its CPUs are vacated first)
            read.clear()
            lse_pod = {"labels": {QOS_LABEL: "LSE"}, "annotations": {ALLOC: json.dumps({"cpuset": "2-3"})}}
            _, lse = await n.run_pod("lse", **lse_pod)  # type: ignore[arg-type]
            assert read == [None, None]  # asked by the relay's ready hook, then by the pre hook
            assert n.cpuset(lse["main"]) == "2-3"
            # and the next plain container reads the pools that pod left
            read.clear()
            _, after = await n.run_pod("after", qos="besteffort")
            assert read[0] is not None and 2 not in read[0].decision.cpuset
            assert n.cpuset(after["main"]) == whole_plans(policy, after["main"]) == "0-1,4-15"

            await n.settle()

    run(main())


def test_a_create_right_after_its_pod_in_the_same_turn_reads_what_its_pod_made(tmp_path: Path) -> None:
    """No loop turn between the RunPodSandbox answer and the create, and no plan made yet (a proxy
    just started): the RunPodSandbox hook makes the plan itself, before its answer is written
    (`Hooks.post_first`, `EnforceHooks._plan_now`), so the create reads its decision, and rightly."""

    async def main() -> None:
        async with node(tmp_path) as n:
            policy = n.proxy.policy
            read = reads(policy)
            cid = await create(n.proxy.hooks, "quick")
            assert len(read) == 1 and read[0] is not None
            assert str(read[0].decision.cpuset) == whole_plans(policy, cid)
            assert str(policy.plan().containers[cid].cpuset) == whole_plans(policy, cid)
            await n.settle()

    run(main())


def test_the_ready_hook_reads_the_pods_id_and_the_containers_keys_after_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay's ready hook (`EnforceHooks.ready_create`) reads only the pod's id of a create
    whose decision was read ahead for the pod; the container's name and attempt come from the
    request as sent (`Ready.after`), and its pending record, a loop turn later, has them. With
    nothing read ahead it reads the container's keys and asks for the container. Dry run, the
    fail policy, an unknown pod, an id that does not decode: None, the pre hook runs."""
    from cri_api.v1 import api_pb2 as v1
    from cri_proxy.enforce import hooks as hooks_module
    from cri_proxy.enforce.hooks import pending_id
    from cri_proxy.relay.methods import KNOWN

    info = KNOWN["/runtime.v1.RuntimeService/CreateContainer"]
    keys_read: list[bytes] = []
    create_keys = hooks_module.create_keys
    monkeypatch.setattr(hooks_module, "create_keys", lambda m: keys_read.append(m) or create_keys(m))

    def request(sandbox: str, name: str, attempt: int) -> bytes:
        meta = v1.ContainerMetadata(name=name, attempt=attempt)
        data: bytes = v1.CreateContainerRequest(
            pod_sandbox_id=sandbox, config=v1.ContainerConfig(metadata=meta)
        ).SerializeToString()
        return data

    async def main() -> None:
        async with node(tmp_path) as n:
            hooks, policy, state = n.proxy.hooks, n.proxy.policy, n.proxy.state
            sandbox, _ = await n.run_pod("p", qos="besteffort", containers=())
            for read_ahead in (True, False):
                policy.plan()
                policy.prepare([sandbox] if read_ahead else [])
                keys_read.clear()
                raw = request(sandbox, f"web{read_ahead}", 2)
                ready = hooks.ready_create(raw, info)
                assert ready is not None
                assert keys_read == ([] if read_ahead else [raw])
                sent = v1.CreateContainerRequest.FromString(raw + ready.patch)
                assert sent.config.linux.resources.cpuset_cpus == "0-15"
                ready.after(sent)
                pid = pending_id(sandbox, f"web{read_ahead}", 2)
                assert state.container(pid) is None  # a loop turn later (`_record`)
                await asyncio.sleep(0)
                assert state.container(pid) is not None

            policy.plan()
            policy.prepare([sandbox])
            raw = request(sandbox, "other", 0)
            assert hooks.ready_create(request("unknown", "c", 0), info) is None
            assert hooks.ready_create(b"\n\x01\xff", info) is None  # a pod id that is not UTF-8
            settings = hooks.settings()
            for change in ({"dry_run": True}, {"fail_policy": "fail"}):
                changed = dataclasses.replace(settings, **change)
                monkeypatch.setattr(hooks, "settings", lambda changed=changed: changed)
                assert hooks.ready_create(raw, info) is None
            monkeypatch.setattr(hooks, "settings", lambda: settings)
            assert hooks.ready_create(raw, info) is not None

    run(main())


def test_a_ready_create_whose_call_ends_before_its_record_goes_in_as_created_in_one_change(
    tmp_path: Path,
) -> None:
    """The usual create's hooks after the call run right after `Ready.after` (the relay decodes a
    ready request when its call ends): the container goes in under its runtime id at once, in one
    change, not as a pending record renamed (`EnforceHooks._went_in`); its record is the one the
    two steps make, no pass is asked for, its line says what it was given, and what was read
    ahead for the pod still holds (no plan before the next create)."""
    from loguru import logger

    from cri_api.v1 import api_pb2 as v1
    from cri_proxy.enforce.hooks import pending_id
    from cri_proxy.relay.methods import KNOWN

    info = KNOWN["/runtime.v1.RuntimeService/CreateContainer"]
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="INFO", format="{message}")

    async def main() -> None:
        async with node(tmp_path) as n:
            hooks, policy, state = n.proxy.hooks, n.proxy.policy, n.proxy.state
            sandbox, _ = await n.run_pod("p", qos="besteffort", containers=())
            pod = state.pod(sandbox)
            assert pod is not None
            await n.settle()
            asked: list[int] = []
            request = n.proxy.reconciler.request
            n.proxy.reconciler.request = lambda *a, **k: asked.append(1) or request(*a, **k)  # type: ignore[method-assign]
            records = {}
            for name, turn_between in (("one", False), ("two", True), ("three", False)):
                policy.plan()
                policy.prepare([sandbox])
                meta = v1.ContainerMetadata(name=name, attempt=1)
                raw = v1.CreateContainerRequest(
                    pod_sandbox_id=sandbox, config=v1.ContainerConfig(metadata=meta)
                ).SerializeToString()
                ready = hooks.ready_create(raw, info)
                assert ready is not None
                sent = v1.CreateContainerRequest.FromString(raw + ready.patch)
                before = state.rules_generation
                ready.after(sent)
                if turn_between:  # the answer came a loop turn later: the pending record went in
                    await asyncio.sleep(0)
                    assert state.container(pending_id(sandbox, name, 1)) is not None
                cached = policy._cached
                cid = f"ctr-{name}"
                await hooks.container_created(sent, v1.CreateContainerResponse(container_id=cid), info)
                await asyncio.sleep(0)
                assert state.container(pending_id(sandbox, name, 1)) is None
                assert state.rules_generation == before + (2 if turn_between else 1)
                record = state.container(cid)
                assert record is not None
                records[name] = dataclasses.replace(record, id="", name="")
                assert policy.before_create(pod, None) is not None and policy._cached is cached
                line = f"{name}: BE -> cpuset 0-15 (BE share pool); created {cid}"
                for _ in range(200):  # put off a moment (`put_off`): deadline 2 s
                    if any(text.rstrip().endswith(line) for text in lines):
                        break
                    await asyncio.sleep(0.01)
                assert any(text.rstrip().endswith(line) for text in lines), lines
            assert records["one"] == records["two"] == records["three"]
            assert records["one"].state.value == "created" and records["one"].applied == "0-15"
            assert asked == []
            assert hooks.injected["BE"] == 3

    try:
        run(main())
    finally:
        logger.remove(sink)
