"""Each rule of cpuset-rules.md as a table row: inputs -> pools, per-container (QoS, cpuset), problems."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from cri_proxy.cpu import ContainerInfo, CPUSet, NodeInputs, ProblemKind, QoS, decide
from cri_proxy.cpu.decide import DecideMemo, decide_added, decide_one
from cri_proxy.cpu.keys import ALLOC_STATUS_ANNOTATION

from .helpers import node, pod

V2 = {"policyName": "static", "defaultCpuSet": "", "entries": {}}


@dataclass
class Row:
    inputs: NodeInputs
    containers: dict[str, tuple[str | None, str | None]]
    pools: tuple[str, str] | None = None
    problems: set[str] = field(default_factory=set)


ROWS: dict[str, Row] = {
    # --- pools ---------------------------------------------------------------------------------
    "no pods: pools are all online CPUs": Row(node(), {}, ("0-15", "0-15")),
    "reserved leaves both pools": Row(node(reserved="0-1"), {}, ("2-15", "2-15")),
    "LSE leaves both pools": Row(
        node(pod("a", qos="LSE", alloc={"cpuset": "0-1"})), {"a-main": ("LSE", "0-1")}, ("2-15", "2-15")
    ),
    "LSR leaves only the LS pool": Row(
        node(pod("a", qos="LSR", alloc={"cpuset": "0-1"})), {"a-main": ("LSR", "0-1")}, ("2-15", "0-15")
    ),
    "unlabelled pod with cpuset is LSR": Row(
        node(pod("a", "besteffort", alloc={"cpuset": "3"})), {"a-main": ("LSR", "3")}, ("0-2,4-15", "0-15")
    ),
    "offline allocation CPUs do not shrink pools": Row(
        node(pod("a", qos="LSE", alloc={"cpuset": "15-17"})),
        {"a-main": ("LSE", "15")},
        ("0-14", "0-14"),
        {"cpus-not-online"},
    ),
    "kubelet static entries leave both pools": Row(
        node(pod("g", "guaranteed"), kubelet={**V2, "entries": {"g": {"main": "4-5"}}}),
        {"g-main": ("KUBELET", "4-5")},
        ("0-3,6-15", "0-3,6-15"),
    ),
    "kubelet entries of unknown pods count": Row(
        node(kubelet={**V2, "entries": {"gone": {"x": "0-1"}}}), {}, ("2-15", "2-15")
    ),
    "kubelet v1 entries of unknown containers count": Row(
        node(kubelet={"policyName": "static", "entries": {"cid-x": "0-1"}}), {}, ("2-15", "2-15")
    ),
    "kubelet entries of LS-labelled pods do not count": Row(
        node(pod("g", "guaranteed", qos="LS"), kubelet={**V2, "entries": {"g": {"main": "4-5"}}}),
        {"g-main": ("LS", "0-15")},
        ("0-15", "0-15"),
    ),
    "kubelet entries of BE-labelled pods do not count (v1)": Row(
        node(
            pod("g", "guaranteed", qos="BE"), kubelet={"policyName": "static", "entries": {"g-main": "4-5"}}
        ),
        {"g-main": ("BE", "0-15")},
        ("0-15", "0-15"),
    ),
    "kubelet entries of pods with a cpuset do not count": Row(
        node(
            pod("g", "guaranteed", alloc={"cpuset": "8"}), kubelet={**V2, "entries": {"g": {"main": "4-5"}}}
        ),
        {"g-main": ("LSR", "8")},
        ("0-7,9-15", "0-15"),
    ),
    "kubelet entries of LSE-labelled pods count": Row(
        node(pod("g", "guaranteed", qos="LSE"), pod("b"), kubelet={**V2, "entries": {"g": {"main": "4-5"}}}),
        {"g-main": ("LSE", "0-3,6-15"), "b-main": ("LS", "0-3,6-15")},
        ("0-3,6-15", "0-3,6-15"),
        {"missing-cpuset"},
    ),
    "kubelet none policy is ignored": Row(
        node(pod("g", "guaranteed"), kubelet={"policyName": "none", "entries": {"g": {"main": "4-5"}}}),
        {"g-main": ("LS", "0-15")},
        ("0-15", "0-15"),
    ),
    # --- per class -----------------------------------------------------------------------------
    "LSE gets its cpuset": Row(
        node(pod("a", qos="LSE", alloc={"cpuset": "4-5"})), {"a-main": ("LSE", "4-5")}
    ),
    "every container of the pod gets it": Row(
        node(pod("a", qos="LSR", alloc={"cpuset": "4-5"}, containers=("init", "main", "debug"))),
        {"a-init": ("LSR", "4-5"), "a-main": ("LSR", "4-5"), "a-debug": ("LSR", "4-5")},
    ),
    "LSR from the proposal's annotation name": Row(
        node(pod("a", qos="LSR", alloc={"cpuset": "4,6"}, annotation=ALLOC_STATUS_ANNOTATION)),
        {"a-main": ("LSR", "4,6")},
    ),
    "LSR without cpuset falls back to the LS pool": Row(
        node(pod("a", qos="LSR", alloc={})), {"a-main": ("LSR", "0-15")}, problems={"missing-cpuset"}
    ),
    "LSE without annotation falls back to the LS pool": Row(
        node(pod("a", qos="LSE")), {"a-main": ("LSE", "0-15")}, problems={"missing-cpuset"}
    ),
    "LSR with empty cpuset falls back": Row(
        node(pod("a", qos="LSR", alloc={"cpuset": ""})),
        {"a-main": ("LSR", "0-15")},
        problems={"missing-cpuset"},
    ),
    "LSR fallback keeps the NUMA binding": Row(
        node(pod("a", qos="LSR", alloc={"numaNode": 1})),
        {"a-main": ("LSR", "8-15")},
        problems={"missing-cpuset"},
    ),
    "LSE entirely offline falls back (reported as not online)": Row(
        node(pod("a", qos="LSE", alloc={"cpuset": "20-21", "numaSocket": 0})),
        {"a-main": ("LSE", "0-7")},
        ("0-15", "0-15"),
        {"cpus-not-online"},
    ),
    "bad annotation on LSR: bad + missing": Row(
        node(pod("a", qos="LSR", alloc="{nope")),
        {"a-main": ("LSR", "0-15")},
        problems={"bad-annotation", "missing-cpuset"},
    ),
    "bad annotation on LS: only bad": Row(
        node(pod("a", qos="LS", alloc='{"cpuset": 5}')),
        {"a-main": ("LS", "0-15")},
        problems={"bad-annotation"},
    ),
    "LS gets the LS pool": Row(node(pod("a")), {"a-main": ("LS", "0-15")}),
    "LS bound to a NUMA node": Row(node(pod("a", alloc={"numaNode": 0})), {"a-main": ("LS", "0-7")}),
    "LS bound to a socket": Row(
        node(
            pod("a", alloc={"numaSocket": 1}),
            nodes={0: "0-3", 1: "4-7", 2: "8-11", 3: "12-15"},
            sockets={0: "0-7", 1: "8-15"},
        ),
        {"a-main": ("LS", "8-15")},
    ),
    "LS bound to nodes and sockets: their union": Row(
        node(
            pod("a", alloc={"numaNode": 0, "numaSocket": 1}),
            nodes={0: "0-3", 1: "4-7", 2: "8-11", 3: "12-15"},
            sockets={0: "0-7", 1: "8-15"},
        ),
        {"a-main": ("LS", "0-3,8-15")},
    ),
    "LS bound via cpuSharedPools": Row(
        node(pod("a", alloc={"cpuSharedPools": [{"socket": 0, "node": 1, "cpuset": "8-15"}]})),
        {"a-main": ("LS", "8-15")},
    ),
    "LS NUMA binding is cut by exclusive CPUs": Row(
        node(pod("x", qos="LSR", alloc={"cpuset": "8-11"}), pod("a", alloc={"numaNode": [1]})),
        {"a-main": ("LS", "12-15")},
    ),
    "LS NUMA node fully taken: whole pool, reported": Row(
        node(pod("x", qos="LSE", alloc={"cpuset": "8-15"}), pod("a", alloc={"numaNode": 1})),
        {"a-main": ("LS", "0-7")},
        ("0-7", "0-7"),
        {"numa-empty"},
    ),
    "LS NUMA node absent: whole pool, reported": Row(
        node(pod("a", alloc={"numaNode": [7]})), {"a-main": ("LS", "0-15")}, problems={"numa-empty"}
    ),
    "LS ignores an allocation cpuset": Row(
        node(pod("a", qos="LS", alloc={"cpuset": "1"})), {"a-main": ("LS", "0-15")}, ("0-15", "0-15")
    ),
    "BE gets the BE pool, including LSR CPUs": Row(
        node(pod("x", qos="LSR", alloc={"cpuset": "0-3"}), pod("b", "besteffort")), {"b-main": ("BE", "0-15")}
    ),
    "BE ignores cpuset and NUMA binding": Row(
        node(pod("b", qos="BE", alloc={"cpuset": "1", "numaNode": 1})), {"b-main": ("BE", "0-15")}
    ),
    "SYSTEM gets system_cpus": Row(node(pod("s", qos="SYSTEM"), system="0-1"), {"s-main": ("SYSTEM", "0-1")}),
    "SYSTEM system_cpus are cut to online": Row(
        node(pod("s", qos="SYSTEM"), system="14-20"), {"s-main": ("SYSTEM", "14-15")}
    ),
    "SYSTEM without system_cpus gets the LS pool": Row(
        node(pod("s", qos="SYSTEM", alloc={"numaNode": 0}), pod("x", qos="LSR", alloc={"cpuset": "0"})),
        {"s-main": ("SYSTEM", "1-15")},
    ),
    "SYSTEM with offline system_cpus gets the LS pool": Row(
        node(pod("s", qos="SYSTEM"), system="20"), {"s-main": ("SYSTEM", "0-15")}
    ),
    "KUBELET container keeps kubelet's CPUs, sidecar is LS": Row(
        node(
            pod("g", "guaranteed", containers=("app", "side")),
            kubelet={**V2, "entries": {"g": {"app": "1-2"}}},
        ),
        {"g-app": ("KUBELET", "1-2"), "g-side": ("LS", "0,3-15")},
    ),
    "KUBELET v1 by container id": Row(
        node(pod("g", "guaranteed"), kubelet={"policyName": "static", "entries": {"g-main": "2-3"}}),
        {"g-main": ("KUBELET", "2-3")},
        ("0-1,4-15", "0-1,4-15"),
    ),
    "KUBELET needs a Guaranteed cgroup": Row(
        node(pod("g", "burstable"), kubelet={**V2, "entries": {"g": {"main": "1"}}}),
        {"g-main": ("LS", "0,2-15")},
    ),
    "systemd and cgroup root forms": Row(
        node(
            pod("a", "/r/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poda.slice"),
            pod("b", "/custom/kubepods/burstable/podb"),
        ),
        {"a-main": ("BE", "0-15"), "b-main": ("LS", "0-15")},
    ),
    "unknown cgroup parent is not managed": Row(
        node(pod("a", "/system.slice/foo.service")), {"a-main": (None, None)}
    ),
    "labelled pod with unknown cgroup parent follows its label": Row(
        node(pod("a", "/system.slice/foo.service", qos="LSR", alloc={"cpuset": "3"})),
        {"a-main": ("LSR", "3")},
    ),
    # --- exhaustion and conflicts ---------------------------------------------------------------
    "exhausted pools leave containers unchanged": Row(
        node(
            pod("x", qos="LSE", alloc={"cpuset": "0-15"}),
            pod("l"),
            pod("b", "besteffort"),
            pod("s", qos="SYSTEM"),
        ),
        {
            "x-main": ("LSE", "0-15"),
            "l-main": ("LS", None),
            "b-main": ("BE", None),
            "s-main": ("SYSTEM", None),
        },
        ("", ""),
        {"pool-exhausted"},
    ),
    "LS pool exhausted by LSR, BE pool still there": Row(
        node(
            pod("x", qos="LSR", alloc={"cpuset": "0-15"}),
            pod("l", alloc={"numaNode": 0}),
            pod("b", "besteffort"),
        ),
        {"l-main": ("LS", None), "b-main": ("BE", "0-15")},
        ("", "0-15"),
        {"pool-exhausted"},
    ),
    "LSR fallback into an exhausted pool": Row(
        node(pod("x", qos="LSE", alloc={"cpuset": "0-15"}), pod("y", qos="LSR")),
        {"y-main": ("LSR", None)},
        ("", ""),
        {"pool-exhausted", "missing-cpuset"},
    ),
    "exclusive conflict: both get what the scheduler said": Row(
        node(pod("a", qos="LSE", alloc={"cpuset": "0-3"}), pod("b", qos="LSR", alloc={"cpuset": "3-4"})),
        {"a-main": ("LSE", "0-3"), "b-main": ("LSR", "3-4")},
        ("5-15", "4-15"),
        {"exclusive-conflict"},
    ),
    "conflict on an offline CPU is still a conflict": Row(
        node(pod("a", qos="LSE", alloc={"cpuset": "0,20"}), pod("b", qos="LSE", alloc={"cpuset": "1,20"})),
        {"a-main": ("LSE", "0"), "b-main": ("LSE", "1")},
        ("2-15", "2-15"),
        {"exclusive-conflict", "cpus-not-online"},
    ),
    "same CPUs in LS-labelled pods are no conflict": Row(
        node(pod("a", qos="LS", alloc={"cpuset": "0"}), pod("b", qos="LSR", alloc={"cpuset": "0"})),
        {"a-main": ("LS", "1-15")},
        ("1-15", "0-15"),
    ),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_rule(row: Row) -> None:
    plan = decide(row.inputs)
    got = {
        cid: (None if d.qos is None else str(d.qos), None if d.cpuset is None else str(d.cpuset))
        for cid, d in plan.containers.items()
    }
    for cid, want in row.containers.items():
        assert got[cid] == want, cid
    if row.pools is not None:
        assert (str(plan.pools.ls), str(plan.pools.be)) == row.pools
    assert {str(p.kind) for p in plan.problems} == row.problems


def test_problem_details_name_pod_and_container() -> None:
    plan = decide(
        node(
            pod("x", qos="LSR", alloc="{bad"),
            pod("y", qos="LSE", alloc={"cpuset": "1"}),
            pod("z", qos="LSE", alloc={"cpuset": "1-2"}),
        )
    )
    by_kind = {p.kind: p for p in plan.problems}
    assert by_kind[ProblemKind.BAD_ANNOTATION].pod == "default/x"
    assert "scheduling.koordinator.sh/resource-status" in by_kind[ProblemKind.BAD_ANNOTATION].message
    assert by_kind[ProblemKind.MISSING_CPUSET].pod == "default/x"
    assert "container main" in by_kind[ProblemKind.MISSING_CPUSET].message
    conflicts = [p for p in plan.problems if p.kind is ProblemKind.EXCLUSIVE_CONFLICT]
    assert [(p.pod, p.message) for p in conflicts] == [
        ("default/y", "CPUs 1 of allocation cpuset 1 are also claimed by default/z"),
        ("default/z", "CPUs 1 of allocation cpuset 1-2 are also claimed by default/y"),
    ]


def test_many_way_conflict_stays_bounded() -> None:
    pods = [pod(f"p{i:03d}", qos="LSE", alloc={"cpuset": "0-15"}) for i in range(300)]
    plan = decide(node(*pods))
    conflicts = [p for p in plan.problems if p.kind is ProblemKind.EXCLUSIVE_CONFLICT]
    assert len(conflicts) == 300
    assert conflicts[0].message.endswith("default/p005 and others")
    assert all(len(p.message) < 200 for p in conflicts)


def test_conflict_storm_is_not_quadratic() -> None:
    """A scheduler gone wrong (every pod claims every CPU) must not stall the proxy."""
    import time

    pods = [pod(f"p{i}", qos="LSE", alloc={"cpuset": "0-15"}) for i in range(3000)]
    start = time.perf_counter()
    plan = decide(node(*pods))
    assert time.perf_counter() - start < 3.0  # quadratic naming took minutes here
    assert len(plan.problems) == 3000


def test_decision_fields() -> None:
    plan = decide(node(pod("a", qos="LSR", alloc={"cpuset": "2-3"}), pod("u", "/system.slice/x")))
    d = plan.containers["a-main"]
    assert d.pod == "default/a" and d.qos is QoS.LSR and d.cpuset == CPUSet.parse("2-3") and d.managed
    assert d.why == "allocation cpuset"
    assert not plan.containers["u-main"].managed
    assert plan.pools.lsr == CPUSet.parse("2-3")


def test_input_problems_are_carried_into_the_plan() -> None:
    from dataclasses import replace

    from cri_proxy.cpu import Problem

    p = Problem(None, ProblemKind.BAD_KUBELET_STATE, "kept last good state")
    assert decide(replace(node(), input_problems=(p,))).problems == (p,)


def test_decide_never_raises_on_garbage_annotations() -> None:
    garbage = [
        "",
        "null",
        "1e999",
        '{"cpuset": "' + "9" * 5000 + '"}',
        '{"numaNode": ' + "9" * 5000 + "}",
        "[" * 10_000,
        '{"numaNodeResources": [null]}',
        "\x00",
    ]
    pods = [pod(f"p{i}", qos="LSR", alloc=g) for i, g in enumerate(garbage)]
    plan = decide(node(*pods))
    assert {str(p.kind) for p in plan.problems} == {"bad-annotation", "missing-cpuset"}
    assert all(d.cpuset == CPUSet.parse("0-15") for d in plan.containers.values())


def test_pool_exhausted_names_who_holds_the_cpus() -> None:
    """An LSE pod on every LS CPU: the problem names it and its CPUs (message and `holders`)."""
    import json
    from pathlib import Path

    from cri_proxy.cpu import load_snapshot

    case = Path(__file__).resolve().parents[2] / "cases" / "13-pool-exhausted.json"
    plan = decide(load_snapshot(json.dumps(json.loads(case.read_text())["snapshot"])))
    exhausted = [p for p in plan.problems if p.kind is ProblemKind.POOL_EXHAUSTED]
    assert {p.pod for p in exhausted} == {"default/ls", "default/be"}
    for p in exhausted:
        assert p.holders == ("LSE default/x (0-3)",)
        assert "held by LSE default/x (0-3)" in p.message


def test_decide_one_answers_for_a_new_container_of_a_plain_pod_and_not_past_a_problem() -> None:
    """`decide_one` after a plan: a new plain pod's container gets what the whole plan gives it,
    without deciding the node; a second sandbox of a pod whose first one has a problem (the same
    `namespace/name`, so the plan reports the problem against it too) is the whole plan's to say."""
    memo = DecideMemo()
    first = node(pod("ls", qos="LS"), pod("twice", alloc="{not json"))
    decide(first, memo)
    plain = pod("plain", "besteffort")
    inputs = replace(first, pods=(*first.pods, plain))
    one = decide_one(inputs, memo, "plain-main")
    assert one is not None and one == decide(inputs).containers["plain-main"]
    again = replace(pod("twice", "besteffort"), uid="twice-2", containers=(ContainerInfo("t2", "main"),))
    inputs = replace(first, pods=(*first.pods, again))
    assert [p.kind for p in decide(inputs).problems if p.pod == again.key] == [ProblemKind.BAD_ANNOTATION]
    assert decide_one(inputs, memo, "t2") is None


def _with_container(inputs: NodeInputs, at: int, name: str) -> NodeInputs:
    """`inputs` with container `<uid>-<name>` added to the pod at `at`, in its place."""
    pods = list(inputs.pods)
    p = pods[at]
    pods[at] = replace(p, containers=(*p.containers, ContainerInfo(f"{p.uid}-{name}", name)))
    return replace(inputs, pods=tuple(pods))


def test_a_pod_with_another_sandbox_changed_since_is_not_answered_ahead() -> None:
    """Two sandboxes of one pod (its sandbox made again while the old one is still listed ready),
    the new one added since the last plan: its containers' problem (here the LS pool left empty by
    an LSR pod) is the pod's, which only a plan says. So neither `decide_added` nor `decide_one`
    answers for the pod's other sandbox: the create's caller plans. Found by the property test
    (CI): both answered, and the plan then had a problem of the pod."""
    old = pod("web", "besteffort")
    lsr = pod("lsr", "guaranteed", alloc={"cpuset": "0-15"})
    memo = DecideMemo()
    before = node(old, lsr)
    decide(before, memo)
    again = replace(pod("web", "guaranteed"), containers=(ContainerInfo("web-new-main", "main"),))
    now = replace(before, pods=(*before.pods, again))
    plan = decide(_with_container(now, 0, "b"))
    assert [p.kind.value for p in plan.problems if p.pod == old.key] == ["pool-exhausted"]
    assert decide_added(memo, old, "web-b", now) is None
    assert decide_one(_with_container(now, 0, "b"), memo, "web-b") is None


def test_decide_added_gives_a_new_container_its_pods_rule_or_nothing() -> None:
    """Right after a plan: a new container of an LS or a plain pod gets its pod's rule (what the
    whole plan then gives it); not one that would move the pools (the kubelet's v1 entry of a
    container in a pod whose entries the LS label overrides), nor one of a Guaranteed pod, which
    may have a kubelet entry of its own, nor one pinned exclusively."""
    v1 = {"policyName": "static", "entries": {"ls-b": "4-5"}, "checksum": 1}
    v2 = {**V2, "entries": {"gu": {"b": "6-7"}}}
    for kubelet in (v1, v2):
        memo = DecideMemo()
        inputs = node(
            pod("ls", qos="LS"),
            pod("plain", "besteffort"),
            pod("gu", "guaranteed"),
            pod("lse", qos="LSE", alloc={"cpuset": "0-1"}),
            kubelet=kubelet,
        )
        decide(inputs, memo)
        for at, name in ((0, "c"), (1, "b")):
            cid = f"{inputs.pods[at].uid}-{name}"
            added = decide_added(memo, inputs.pods[at], cid)
            assert added is not None
            assert added == decide(_with_container(inputs, at, name)).containers[cid]
        assert decide_added(memo, inputs.pods[3], "lse-b") is None
        moved = decide(_with_container(inputs, 0, "b"))
        if kubelet is v1:  # the entry no longer counts: the pools grow
            assert decide_added(memo, inputs.pods[0], "ls-b") is None
            assert moved.pools != decide(inputs).pools
        else:
            assert decide_added(memo, inputs.pods[2], "gu-b") is None
            assert decide(_with_container(inputs, 2, "b")).containers["gu-b"].qos is QoS.KUBELET
        assert decide_added(DecideMemo(), inputs.pods[1], "plain-b") is None  # no call before
