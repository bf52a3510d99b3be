"""A CreateContainer reads its decision from the plan the hooks made after the node's last change
(`Policy.before_create`), so nothing is decided on its call's path; what it reads is what the whole
plan says. Through a real proxy in front of the fake runtime, the calls as the kubelet makes them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from cri_proxy.enforce.policy import Early, Policy
from tests.unit.enforce_support import ALLOC, QOS_LABEL, node
from tests.unit.relay_support import run
from tests.unit.test_pass_after_create import create


def reads(policy: Policy) -> list[Early | None]:
    """What each create's `before_create` returns from now on, in order."""
    read: list[Early | None] = []
    before_create = policy.before_create
    policy.before_create = lambda *a: read.append(before_create(*a)) or read[-1]  # type: ignore[method-assign]
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


def test_a_create_right_after_its_pod_in_the_same_turn_is_decided_on_the_path(tmp_path: Path) -> None:
    """No loop turn between the RunPodSandbox answer and the create (the plan is not made yet): the
    create decides as before, and rightly."""

    async def main() -> None:
        async with node(tmp_path) as n:
            policy = n.proxy.policy
            read = reads(policy)
            cid = await create(n.proxy.hooks, "quick")
            assert read == [None]
            await asyncio.sleep(0)  # the plan the hooks asked for
            assert str(policy.plan().containers[cid].cpuset) == whole_plans(policy, cid)
            await n.settle()

    run(main())
