"""Exclusivity holds or is reported: every container left on an LSE/LSR container's CPUs is named."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, generate_latest

from cri_proxy.config import Config
from cri_proxy.cpu import CPUSet, ProblemKind, Topology
from cri_proxy.daemon.metrics import StateCollector
from cri_proxy.enforce.policy import Policy
from cri_proxy.state.model import ContainerRecord, ContainerState, NodeState, PodRecord

SETTINGS = Config()  # nothing reserved
TOPOLOGY = Topology.build({0: CPUSet.parse("0-7")})
QOS = "koordinator.sh/qosClass"
ALLOC = "scheduling.koordinator.sh/resource-status"


def add_pod(state: NodeState, name: str, tier: str, labels: dict[str, str], cpuset: str | None = None) -> str:
    parent = f"/kubepods/{tier}/pod{name}" if tier else f"/kubepods/pod{name}"
    annotations = {ALLOC: json.dumps({"cpuset": cpuset})} if cpuset else {}
    state.put_pod(PodRecord(f"s-{name}", name, name, "team", parent, labels=labels, annotations=annotations))
    return f"s-{name}"


def add_container(
    state: NodeState,
    sid: str,
    name: str,
    applied: str | None,
    cid: str | None = None,
    state_: ContainerState = ContainerState.RUNNING,
) -> str:
    cid = cid or f"{sid}-{name}"
    state.put_container(ContainerRecord(cid, sid, name, state=state_, applied=applied))
    return cid


def overlap_messages(policy: Policy) -> list[str]:
    return [p.message for p in policy.plan().problems if p.kind is ProblemKind.EXCLUSIVE_OVERLAP]


def test_containers_left_on_exclusive_cpus_are_named() -> None:
    state = NodeState()
    policy = Policy(state, TOPOLOGY, lambda: SETTINGS)
    lsr = add_pod(state, "lsr", "", {QOS: "LSR"}, "0-1")
    add_container(state, lsr, "main", "0-1", state_=ContainerState.PENDING, cid="pending/s-lsr/main/0")
    ls = add_pod(state, "ls", "burstable", {})
    add_container(state, ls, "web", "0-7")  # not moved yet (the wait timed out)
    add_container(state, ls, "side", "")  # no cpuset at all: every CPU
    be = add_pod(state, "be", "besteffort", {QOS: "BE"})
    add_container(state, be, "batch", "0-7")  # BE may share LSR CPUs

    (overlap,) = policy.overlaps()
    assert (overlap.pod, overlap.container, str(overlap.cpus)) == ("team/lsr", "main", "0-1")
    assert [(p, c, str(cpus)) for p, c, cpus in overlap.others] == [
        ("team/ls", "side", "0-1"),
        ("team/ls", "web", "0-1"),
    ]
    (message,) = overlap_messages(policy)
    assert "team/ls web" in message and "team/ls side" in message and "batch" not in message

    # the reconciler moved them: nothing to report
    state.update_container(f"{ls}-web", applied="2-7")
    state.update_container(f"{ls}-side", applied="2-7")
    assert policy.overlaps() == [] and overlap_messages(policy) == []


def test_the_cgroup_reading_wins_over_what_was_applied() -> None:
    state = NodeState()
    policy = Policy(state, TOPOLOGY, lambda: SETTINGS)
    lse = add_pod(state, "lse", "", {QOS: "LSE"}, "3")
    add_container(state, lse, "main", "3")
    be = add_pod(state, "be", "besteffort", {QOS: "BE"})
    batch = add_container(state, be, "batch", "0-2,4-7")
    assert policy.overlaps() == []
    state.observe_container(batch, "0-7", "cgroup", 1.0)  # the update never reached the cgroup
    (overlap,) = policy.overlaps()
    assert [(p, c, str(cpus)) for p, c, cpus in overlap.others] == [("team/be", "batch", "3")]


def test_two_exclusive_pods_claiming_the_same_cpus_name_each_other() -> None:
    state = NodeState()
    policy = Policy(state, TOPOLOGY, lambda: SETTINGS)
    a = add_pod(state, "a", "", {QOS: "LSR"}, "0-1")
    b = add_pod(state, "b", "", {QOS: "LSE"}, "1-2")
    add_container(state, a, "main", "0-1")
    add_container(state, b, "main", "1-2")
    assert {(o.pod, o.others[0][0], str(o.others[0][2])) for o in policy.overlaps()} == {
        ("team/a", "team/b", "1"),
        ("team/b", "team/a", "1"),
    }
    kinds = {p.kind for p in policy.plan().problems}
    assert {ProblemKind.EXCLUSIVE_CONFLICT, ProblemKind.EXCLUSIVE_OVERLAP} <= kinds


def test_a_label_that_is_not_utf8_is_a_problem_on_its_pod() -> None:
    state = NodeState()
    policy = Policy(state, TOPOLOGY, lambda: SETTINGS)
    state.put_pod(
        PodRecord("s1", "u1", "odd", "team", "/kubepods/burstable/podu1", problems=("annotation 'x' is bad",))
    )
    (problem,) = [p for p in policy.plan().problems if p.kind is ProblemKind.BAD_TEXT]
    assert (problem.pod, problem.message) == ("team/odd", "annotation 'x' is bad")


def test_the_metric_names_both_containers() -> None:
    state = NodeState()
    policy = Policy(state, TOPOLOGY, lambda: SETTINGS)
    lse = add_pod(state, "lse", "", {QOS: "LSE"}, "0-1")
    add_container(state, lse, "main", "0-1")
    ls = add_pod(state, "ls", "burstable", {})
    add_container(state, ls, "web", "0-7")
    registry = CollectorRegistry()
    view = {
        "pods": 2,
        "containers": 2,
        "runtime_up": True,
        "injections": {},
        "problem_kinds": [str(p.kind) for p in policy.plan().problems],
        "reconcile": {"passes": 0, "updated": 0, "failed": 0, "dropped": 0, "repaired": 0, "start_checks": 0},
        "dry_run": False,
        "replaced": 0,
        "overlaps": [
            (o.pod, o.container, p, c, len(cpus)) for o in policy.overlaps() for p, c, cpus in o.others
        ],
    }
    registry.register(StateCollector(lambda: view))
    text = generate_latest(registry).decode()
    labels = 'container="main",other_container="web",other_pod="team/ls",pod="team/lse"'
    assert f"cri_proxy_exclusive_overlap_cpus{{{labels}}} 2.0" in text
    assert 'cri_proxy_problems{kind="exclusive-overlap"} 1.0' in text
