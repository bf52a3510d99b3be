"""Invariants of `decide` over generated nodes (hypothesis), checked against a small oracle.

The oracle recomputes the exclusive CPU sets straight from what the generator put in, so a
wrong pool computation cannot hide behind itself.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from cri_proxy.cpu import (
    ContainerInfo,
    CPUSet,
    NodeInputs,
    PodInfo,
    QoS,
    Topology,
    decide,
    parse_kubelet_state,
    plan_to_json,
)
from cri_proxy.cpu.decide import DecideMemo, decide_added, decide_one, may_move_pools
from cri_proxy.cpu.keys import QOS_LABEL, RESOURCE_STATUS_ANNOTATION

CANONICAL = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")
CGROUPS = [
    "/kubepods/pod{u}",
    "/kubepods/burstable/pod{u}",
    "/kubepods/besteffort/pod{u}",
    "/kubepods.slice/kubepods-pod{u}.slice",
    "/system.slice/{u}.service",
]


@dataclass(frozen=True)
class Generated:
    inputs: NodeInputs
    exclusive: CPUSet  # LSE/LSR allocation CPUs that are online
    lse: CPUSet
    kubelet: CPUSet


def _cpus(draw: st.DrawFn, top: int) -> CPUSet:
    return CPUSet.of(draw(st.frozensets(st.integers(0, top), max_size=6)))


@st.composite
def generated(draw: st.DrawFn) -> Generated:
    n_nodes, per_node = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    numa = {n: CPUSet.range(n * per_node, (n + 1) * per_node - 1) for n in range(n_nodes)}
    topology = Topology.build(numa)
    online = topology.online
    top = n_nodes * per_node + 2  # a few offline ids too
    pods: list[PodInfo] = []
    skip_uids: set[str] = set()
    excl_mask = lse_mask = 0
    for i in range(draw(st.integers(0, 7))):
        uid = f"u{i}"
        label = draw(st.sampled_from([None, "LSE", "LSR", "LS", "BE", "SYSTEM", "GOLD"]))
        kind = draw(st.sampled_from(["none", "bad", "cpuset", "numa", "both"]))
        cpuset = _cpus(draw, top)
        alloc: dict[str, Any] = {}
        if kind in ("cpuset", "both"):
            alloc["cpuset"] = str(cpuset)
        if kind in ("numa", "both"):
            alloc["numaNode"] = draw(st.lists(st.integers(0, 5), max_size=2))
        annotations = {}
        if kind == "bad":
            annotations[RESOURCE_STATUS_ANNOTATION] = draw(st.sampled_from(["{x", '{"cpuset": 1}', "[]"]))
        elif kind != "none":
            annotations[RESOURCE_STATUS_ANNOTATION] = json.dumps(alloc)
        has_cpuset = "cpuset" in alloc and bool(cpuset)
        klass = label if label in ("LSE", "LSR", "LS", "BE", "SYSTEM") else ("LSR" if has_cpuset else None)
        if klass in ("LSE", "LSR") and has_cpuset:
            excl_mask |= (cpuset & online).mask
            if klass == "LSE":
                lse_mask |= (cpuset & online).mask
        if has_cpuset or label in ("LS", "BE"):
            skip_uids.add(uid)
        names = draw(st.lists(st.sampled_from("abc"), min_size=1, max_size=3, unique=True))
        pods.append(
            PodInfo(
                uid=uid,
                name=f"p{i}",
                namespace="ns",
                cgroup_parent=draw(st.sampled_from(CGROUPS)).format(u=uid),
                labels={QOS_LABEL: label} if label else {},
                annotations=annotations,
                containers=tuple(ContainerInfo(f"{uid}-{n}", n) for n in names),
            )
        )
    kubelet = None
    kubelet_mask = 0
    shape = draw(st.sampled_from(["absent", "none", "v1", "v2"]))
    if shape != "absent":
        uids = [p.uid for p in pods] + ["gone"]
        entries: dict[str, Any] = {}
        for uid in draw(st.lists(st.sampled_from(uids), max_size=4, unique=True)):
            cpus = _cpus(draw, top)
            cname = draw(st.sampled_from("abc"))
            if uid not in skip_uids:
                kubelet_mask |= cpus.mask
            if shape == "v1":
                entries[f"{uid}-{cname}"] = str(cpus)
            else:
                entries[uid] = {cname: str(cpus)}
        if shape == "none":
            kubelet_mask = 0
        kubelet = parse_kubelet_state(
            {"policyName": "none" if shape == "none" else "static", "entries": entries}
        )
    inputs = NodeInputs(
        topology=topology,
        pods=tuple(pods),
        reserved=_cpus(draw, top),
        system=_cpus(draw, top),
        kubelet=kubelet,
    )
    return Generated(inputs, CPUSet(excl_mask), CPUSet(lse_mask), CPUSet(kubelet_mask & online.mask))


@settings(max_examples=300, deadline=None)
@given(generated())
def test_invariants(g: Generated) -> None:
    plan = decide(g.inputs)
    online = g.inputs.topology.online
    ids = {c.id for p in g.inputs.pods for c in p.containers}
    assert set(plan.containers) == ids
    assert plan.pools.ls.isdisjoint(g.exclusive | g.kubelet | g.inputs.reserved)
    assert plan.pools.be.isdisjoint(g.lse | g.kubelet | g.inputs.reserved)
    for d in plan.containers.values():
        if d.cpuset is not None:
            assert d.cpuset, "never an empty cpuset"
            assert CANONICAL.fullmatch(str(d.cpuset))
        if d.qos is QoS.LS and d.cpuset is not None:
            assert d.cpuset.isdisjoint(g.exclusive | g.kubelet), "LS on an exclusive CPU"
            assert d.cpuset <= online
        if d.qos is QoS.BE and d.cpuset is not None:
            assert d.cpuset.isdisjoint(g.lse | g.kubelet), "BE on an LSE or kubelet CPU"
        if d.qos is None:
            assert d.cpuset is None
    out = plan_to_json(plan)
    for c in out["containers"].values():
        s = c["cpuset_cpus"]
        assert s is None or (CANONICAL.fullmatch(s) and str(CPUSet.parse(s)) == s)
    for s in out["pools"].values():
        assert s == "" or CANONICAL.fullmatch(s)


@settings(max_examples=200, deadline=None)
@given(generated(), st.randoms(use_true_random=False))
def test_pod_order_does_not_matter(g: Generated, rnd: random.Random) -> None:
    pods = list(g.inputs.pods)
    rnd.shuffle(pods)
    a = plan_to_json(decide(g.inputs))
    b = plan_to_json(decide(replace(g.inputs, pods=tuple(pods))))
    # fully equal, problems included: conflicts are reported against every pod involved
    assert a["pools"] == b["pools"]
    assert a["containers"] == b["containers"]
    assert a["problems"] == b["problems"]


@settings(max_examples=200, deadline=None)
@given(generated(), generated(), st.randoms(use_true_random=False))
def test_a_memo_changes_no_plan(g: Generated, other: Generated, rnd: random.Random) -> None:
    """`decide` with a memo from earlier calls (some pods the same objects, some new, other
    pools, another kubelet state) gives the plan `decide` gives without one, and its `changed`
    names every container whose decision differs from the call before."""
    memo = DecideMemo()
    first = decide(other.inputs, memo)
    assert first == decide(other.inputs)
    kept = [p for p in other.inputs.pods if rnd.random() < 0.5]
    mixed = replace(g.inputs, pods=tuple(kept + list(g.inputs.pods)))
    previous = first
    for inputs in (g.inputs, mixed, mixed, replace(mixed, kubelet=other.inputs.kubelet), g.inputs):
        plan = decide(inputs, memo)
        assert plan == decide(inputs)
        if memo.changed is not None:  # names every container whose decision is not what it was
            ids = previous.containers.keys() | plan.containers.keys()
            differ = {c for c in ids if previous.containers.get(c) != plan.containers.get(c)}
            assert differ <= memo.changed.ids()
        previous = plan


def change_pods(
    step: str, pods: list[PodInfo], spare: list[PodInfo], rnd: random.Random, new_id: str
) -> None:
    """One change to the node's pods, as the kubelet's come and go: `append` one of `spare`, `grow`
    the newest pod (`grow-any`: any pod) by container `new_id`, `replace-last` with one of `spare`,
    `drop-last`, `drop-any`. Any other step changes no pod."""
    if step == "append" and spare:
        pods.append(spare.pop(rnd.randrange(len(spare))))
    elif step in ("grow", "grow-any") and pods:
        at = len(pods) - 1 if step == "grow" else rnd.randrange(len(pods))
        pod = pods[at]
        extra = ContainerInfo(new_id, f"g{len(pod.containers)}")
        pods[at] = replace(pod, containers=(*pod.containers, extra))
    elif step == "replace-last" and pods and spare:
        pods[-1] = spare.pop(rnd.randrange(len(spare)))
    elif step == "drop-last" and pods:
        pods.pop()
    elif step == "drop-any" and pods:
        pods.pop(rnd.randrange(len(pods)))


def node_step(
    step: str,
    step_no: int,
    pods: list[PodInfo],
    spare: list[PodInfo],
    g: Generated,
    other: Generated,
    rnd: random.Random,
) -> Generated:
    """One change to the node between calls: `change_pods`' steps, a plain pod (with a container)
    or a new one (without, as RunPodSandbox adds it), another kubelet state, other reserved CPUs."""
    if step in ("new-pod", "plain-pod"):  # the kubelet's usual pod: no class label, no allocation
        uid = f"plain{step_no}"
        cgroup = rnd.choice(CGROUPS).format(u=uid)
        containers = (ContainerInfo(f"{uid}-a", "a"),) if step == "plain-pod" else ()
        pods.append(PodInfo(uid, uid, "ns", cgroup, {}, {}, containers))
    change_pods(step, pods, spare, rnd, f"grown{step_no}")
    if step == "kubelet":
        return replace(g, inputs=replace(g.inputs, kubelet=rnd.choice([other.inputs.kubelet, None])))
    if step == "reserved":
        return replace(g, inputs=replace(g.inputs, reserved=other.inputs.reserved))
    return g


@settings(max_examples=300, deadline=None)
@given(generated(), generated(), st.randoms(use_true_random=False))
def test_a_memo_follows_pods_coming_and_going_at_the_end(
    g: Generated, other: Generated, rnd: random.Random
) -> None:
    """The memo folds on from the last call's totals when the pods begin with its pods (all of
    them, or all but the last): new pods at the end, the newest pod changed or gone, as the
    kubelet's pods come and go. Any sequence of such changes (and others) gives the plan `decide`
    gives without a memo, and `changed` names every container whose decision differs."""
    memo = DecideMemo()
    pods = list(g.inputs.pods)
    spare = list(other.inputs.pods)
    previous = decide(g.inputs, memo)
    for _ in range(10):
        step = rnd.choice(["append", "grow", "replace-last", "drop-last", "drop-any", "same", "kubelet"])
        change_pods(step, pods, spare, rnd, f"grown{rnd.randrange(1000)}")
        inputs = replace(g.inputs, pods=tuple(pods))
        if step == "kubelet":
            inputs = replace(inputs, kubelet=rnd.choice([other.inputs.kubelet, g.inputs.kubelet]))
        plan = decide(inputs, memo)
        assert plan == decide(inputs)
        if memo.changed is not None:
            ids = previous.containers.keys() | plan.containers.keys()
            differ = {c for c in ids if previous.containers.get(c) != plan.containers.get(c)}
            assert differ <= memo.changed.ids()
        previous = plan


@settings(max_examples=300, deadline=None)
@given(generated(), generated(), st.randoms(use_true_random=False))
def test_decide_one_says_what_decide_says_or_nothing(
    g: Generated, other: Generated, rnd: random.Random
) -> None:
    """`decide_one` between full calls (the memo as the last full call left it, the pods changed
    since in any way): when it answers, the answer is the whole plan's decision, the container's pod
    has no problem in it, and the pools and the exclusive containers are the last full call's. A
    full call after it still gives the plan `decide` gives without a memo."""
    memo = DecideMemo()
    pods = list(g.inputs.pods)
    spare = list(other.inputs.pods)
    last = decide(g.inputs, memo)
    steps = ["plain-pod"] * 3 + ["grow"] * 3 + ["full"] * 2 + ["ask"] * 5
    steps += ["append", "grow-any", "replace-last", "drop-last", "drop-any", "kubelet", "reserved"]
    for step_no in range(24):
        step = rnd.choice(steps)
        g = node_step(step, step_no, pods, spare, g, other, rnd)
        inputs = replace(g.inputs, pods=tuple(pods))
        if step == "full":
            last = decide(inputs, memo)
            assert last == decide(inputs)
        elif step == "ask":
            ids = [c.id for pod in pods[-3:] for c in pod.containers] + ["no-such-container"]
            cid = rnd.choice(ids)
            one = decide_one(inputs, memo, cid)
            if one is not None:
                plan = decide(inputs)
                assert plan.containers[cid] == one
                assert not [p for p in plan.problems if p.pod == one.pod]
                assert (plan.pools, plan.exclusive) == (last.pools, last.exclusive)
    assert decide(replace(g.inputs, pods=tuple(pods)), memo) == decide(replace(g.inputs, pods=tuple(pods)))


@settings(max_examples=300, deadline=None)
@given(generated(), generated(), st.randoms(use_true_random=False))
def test_decide_added_says_what_decide_says_or_nothing(
    g: Generated, other: Generated, rnd: random.Random
) -> None:
    """`decide_added` right after a call (the memo as any sequence of calls left it, the folding
    ones and `decide_one` included): when it answers for a pod and a container id, adding that
    container to that pod gives it that answer in the whole plan, no problem of its pod, and
    changes no pool, no exclusive container and no other container's decision."""
    memo = DecideMemo()
    pods = list(g.inputs.pods)
    spare = list(other.inputs.pods)
    decide(g.inputs, memo)
    steps = ["plain-pod"] * 3 + ["grow", "append", "replace-last", "drop-last", "drop-any", "kubelet"]
    answered = 0
    for step_no in range(16):
        step = rnd.choice(steps)
        if step == "plain-pod":  # the kubelet's usual pod: no class label, no allocation
            uid = f"plain{step_no}"
            cgroup = rnd.choice(CGROUPS).format(u=uid)
            containers = (ContainerInfo(f"{uid}-a", "a"),) if rnd.random() < 0.5 else ()
            pods.append(PodInfo(uid, uid, "ns", cgroup, {}, {}, containers))
        change_pods(step, pods, spare, rnd, f"grown{step_no}")
        if step == "kubelet":
            g = replace(g, inputs=replace(g.inputs, kubelet=rnd.choice([other.inputs.kubelet, None])))
        inputs = replace(g.inputs, pods=tuple(pods))
        if rnd.random() < 0.3 and pods:  # a fold in between, as a create's pre hook may ask
            decide_one(inputs, memo, rnd.choice([c.id for p in pods for c in p.containers] or ["none"]))
        last = decide(inputs, memo)
        if not pods:
            continue
        at = rnd.randrange(len(pods))
        pod = pods[at]
        # most often one the kubelet has an entry for (v2 by pod and name, v1 by id: `uid-name`)
        free = [n for n in "abcd" if n not in {c.name for c in pod.containers}]
        kube = inputs.kubelet
        entries = (
            set(kube.pod_entries.get(pod.uid, {}))
            | {cid.removeprefix(f"{pod.uid}-") for cid in kube.container_entries}
            if kube is not None
            else set()
        )
        named = [n for n in free if n in entries]
        name = rnd.choice(named if named and rnd.random() < 0.7 else free)
        new = ContainerInfo(f"{pod.uid}-{name}", name)
        if any(c.id == new.id for p in pods for c in p.containers):
            continue  # an id in two pods: not what a create makes
        added = decide_added(memo, pod, new.id)
        if added is None:
            continue
        answered += 1
        grown = list(pods)
        grown[at] = replace(pod, containers=(*pod.containers, new))
        plan = decide(replace(inputs, pods=tuple(grown)))
        assert plan.containers[new.id] == added
        assert not [p for p in plan.problems if p.pod == pod.key]
        assert (plan.pools, plan.exclusive) == (last.pools, last.exclusive)
        assert {k: v for k, v in plan.containers.items() if k != new.id} == dict(last.containers)
    event(f"decide_added answered {min(answered, 3)}+ times")


@settings(max_examples=300, deadline=None)
@given(generated(), generated(), st.randoms(use_true_random=False))
def test_decide_added_over_pods_changed_since_says_what_decide_says_or_nothing(
    g: Generated, other: Generated, rnd: random.Random
) -> None:
    """`decide_added` with the inputs of now, the pods changed since the last full call in any way
    (new pods without containers yet, as RunPodSandbox adds them, most often): when it answers for
    a pod and a container id, adding that container gives it that answer in the whole plan, no
    problem of its pod, and the pools, the exclusive containers and every other container's
    decision are those of the plan without it, which are the last full call's."""
    memo = DecideMemo()
    pods = list(g.inputs.pods)
    spare = list(other.inputs.pods)
    last = decide(g.inputs, memo)
    steps = ["new-pod"] * 4 + ["plain-pod", "grow", "full", "ask", "ask", "ask"]
    steps += ["append", "grow-any", "replace-last", "drop-last", "drop-any", "kubelet", "reserved"]
    answered = 0
    for step_no in range(24):
        step = rnd.choice(steps)
        g = node_step(step, step_no, pods, spare, g, other, rnd)
        inputs = replace(g.inputs, pods=tuple(pods))
        if step == "full":
            last = decide(inputs, memo)
        if step != "ask" or not pods:
            continue
        newest = rnd.random() < 0.8  # most often one of the newest pods, as a kubelet's create is
        at = rnd.randrange(max(0, len(pods) - 4) if newest else 0, len(pods))
        pod = pods[at]
        name = next(n for n in "abcdefgh" if n not in {c.name for c in pod.containers})
        new = ContainerInfo(f"{pod.uid}-{name}-{step_no}", name)
        if any(c.id == new.id for p in pods for c in p.containers):
            continue
        if rnd.random() < 0.5:  # another pod's asked first, of the very same pods: the fold is reused
            decide_added(memo, rnd.choice(pods), "other", inputs)
        added = decide_added(memo, pod, new.id, inputs)
        if added is None:
            continue
        answered += 1
        without = decide(inputs)
        grown = list(pods)
        grown[at] = replace(pod, containers=(*pod.containers, new))
        plan = decide(replace(inputs, pods=tuple(grown)))
        assert plan.containers[new.id] == added
        assert not [p for p in plan.problems if p.pod == pod.key]
        assert (plan.pools, plan.exclusive) == (without.pools, without.exclusive)
        assert (plan.pools, plan.exclusive) == (last.pools, last.exclusive)
        assert {k: v for k, v in plan.containers.items() if k != new.id} == dict(without.containers)
    assert decide(replace(g.inputs, pods=tuple(pods)), memo) == decide(replace(g.inputs, pods=tuple(pods)))
    event(f"decide_added over changes answered {min(answered, 3)}+ times")


@settings(max_examples=300, deadline=None)
@given(
    generated(),
    st.dictionaries(st.sampled_from([QOS_LABEL, "app", "tier"]), st.sampled_from(["LSE", "LSR", "BE", "x"])),
    st.dictionaries(
        st.sampled_from([RESOURCE_STATUS_ANNOTATION, "note"]), st.sampled_from(['{"cpuset": "0-1"}', "x"])
    ),
    st.sampled_from(CGROUPS),
)
def test_a_new_pod_that_may_not_move_the_pools_moves_no_decision(
    g: Generated, labels: dict[str, str], annotations: dict[str, str], cgroup: str
) -> None:
    """`may_move_pools` False (the RunPodSandbox hook then asks for no pass): the pod, before it
    has containers, changes neither the pools nor any other container's decision."""
    pod = PodInfo("u-new", "new", "default", cgroup.format(u="u-new"), labels, annotations)
    with_pod = decide(replace(g.inputs, pods=(*g.inputs.pods, pod)))
    if not may_move_pools(labels, annotations):
        before = decide(g.inputs)
        assert with_pod.pools == before.pools
        assert with_pod.containers == before.containers
