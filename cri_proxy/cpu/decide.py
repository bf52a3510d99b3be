"""Decision per container ("Decision per container" in cpuset-rules.md): `decide(inputs) -> Plan`.

Pure and total: bad input becomes a `Problem` in the plan, never an exception. Two passes over the
pods: the first (`_Survey`) parses and classifies each pod and collects the exclusive claims (the
pools depend on every pod), the second decides every container against the finished pools.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import islice
from operator import is_
from types import MappingProxyType

from cri_proxy.cpu.allocation import Allocation, allocation_from_annotations
from cri_proxy.cpu.cgroup import CgroupParent, KubeQoS, parse_cgroup_parent
from cri_proxy.cpu.cpuset import CPUSet
from cri_proxy.cpu.inputs import NodeInputs, PodInfo
from cri_proxy.cpu.keys import ALLOCATION_ANNOTATIONS, QOS_LABEL
from cri_proxy.cpu.kubelet import KubeletState
from cri_proxy.cpu.pools import Pools, compute_pools, kubelet_exclusive
from cri_proxy.cpu.problems import Problem, ProblemKind
from cri_proxy.cpu.qos import EXCLUSIVE_CLASSES, QoS, classify, label_qos
from cri_proxy.cpu.topology import Topology
from cri_proxy.errors import AllocationError


@dataclass(frozen=True, slots=True)
class ContainerDecision:
    """What to do with one container. `cpuset` None: leave it unchanged (tri-state "leave")."""

    pod: str
    qos: QoS | None
    cpuset: CPUSet | None
    why: str

    @property
    def managed(self) -> bool:
        """False for containers the proxy passes through untouched (unknown cgroup parent)."""
        return self.qos is not None


@dataclass(frozen=True)
class Plan:
    """The whole node's decision: pools, one decision per container id, and what was wrong."""

    pools: Pools
    containers: Mapping[str, ContainerDecision]
    problems: tuple[Problem, ...]
    # ids of the containers decided LSE/LSR with a cpuset (who exclusivity is about); None: not counted
    exclusive: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class _PodView:
    """A pod parsed once: its class before the per-container kubelet check, allocation, cgroup."""

    pod: PodInfo
    label: QoS | None
    allocation: Allocation | None
    cgroup: CgroupParent | None
    exclusive_cpus: CPUSet | None  # allocation cpuset ∩ online, for an LSE/LSR pod that has one


_Notes = tuple[tuple[ProblemKind, str, tuple[str, ...]], ...]  # kind, message, holders


@dataclass(frozen=True, slots=True)
class _Rule:
    """A pod-level outcome shared by its containers; `notes` become per-container problems."""

    qos: QoS | None
    cpuset: CPUSet | None
    why: str
    notes: _Notes = ()


_MAX_IDS = 8  # ids named in a `why`: an annotation may list 100k node ids, the text stays one line


def _ids_text(ids: frozenset[int]) -> str:
    ordered = sorted(ids)
    text = ",".join(map(str, ordered[:_MAX_IDS]))
    return text if len(ordered) <= _MAX_IDS else f"{text},... ({len(ordered)} ids)"


def _cpus_text(nodes: frozenset[int], sockets: frozenset[int]) -> str:
    parts = []
    if nodes:
        parts.append("NUMA node " + _ids_text(nodes))
    if sockets:
        parts.append("socket " + _ids_text(sockets))
    return " / ".join(parts)


class _Decider:
    """The state of one `decide` call: the pools and a cache of NUMA-narrowed LS pools."""

    def __init__(
        self,
        topology: Topology,
        pools: Pools,
        system: CPUSet,
        holders: Mapping[QoS, tuple[str, ...]] | None = None,
    ) -> None:
        self.topology = topology
        self.pools = pools
        self.system = system & topology.online
        self.holders = holders or {}
        self._numa: dict[tuple[frozenset[int], frozenset[int]], tuple[CPUSet, str, _Notes]] = {}

    def exhausted(self, qos: QoS, pool: str, prefix: str = "") -> _Rule:
        """The pool is empty: leave the container, and say who holds the CPUs the pool lost."""
        held = self.holders.get(QoS.LS if pool == "LS" else QoS.BE, ())
        text = f"the {pool} share pool is empty"
        if held:
            text += ": its CPUs are held by " + "; ".join(held)
        return _Rule(
            qos,
            None,
            prefix + f"{pool} share pool is empty: left unchanged",
            ((ProblemKind.POOL_EXHAUSTED, text, held),),
        )

    def ls_rule(self, qos: QoS, allocation: Allocation | None, prefix: str = "") -> _Rule:
        """LS pool, narrowed to the allocation's NUMA nodes/sockets when it names any."""
        pool = self.pools.ls
        if not pool:
            return self.exhausted(qos, "LS", prefix)
        if allocation is None or not allocation.numa_bound:
            return _Rule(qos, pool, prefix + "LS share pool")
        key = (allocation.numa_nodes, allocation.sockets)
        found = self._numa.get(key)
        if found is None:
            where = _cpus_text(*key)
            narrowed = pool & self.topology.cpus_of(*key)
            if narrowed:
                found = (narrowed, f"LS share pool on {where}", ())
            else:
                found = (
                    pool,
                    f"whole LS share pool: none of it on {where}",
                    ((ProblemKind.NUMA_EMPTY, f"no LS pool CPU on {where}: whole LS pool used", ()),),
                )
            self._numa[key] = found
        cpuset, why, notes = found
        return _Rule(qos, cpuset, prefix + why, notes)

    def pod_rule(self, view: _PodView, qos: QoS | None) -> _Rule:
        """The decision every non-KUBELET container of the pod shares."""
        if qos is None:
            return _Rule(None, None, "cgroup parent is not a kubepods pod cgroup: not managed")
        if qos in EXCLUSIVE_CLASSES:
            if view.exclusive_cpus:
                whole = view.allocation is not None and view.allocation.cpuset == view.exclusive_cpus
                return _Rule(
                    qos,
                    view.exclusive_cpus,
                    "allocation cpuset" if whole else "allocation cpuset, offline CPUs dropped",
                )
            alloc = view.allocation
            if alloc is None or not alloc.cpuset:
                rule = self.ls_rule(qos, alloc, "no allocation cpuset: ")
                note = (ProblemKind.MISSING_CPUSET, f"{qos} pod has no allocation cpuset: LS rule used", ())
                return _Rule(qos, rule.cpuset, rule.why, (note, *rule.notes))
            return self.ls_rule(qos, alloc, "allocation cpuset not online: ")
        if qos is QoS.LS:
            return self.ls_rule(qos, view.allocation)
        if qos is QoS.BE:
            if self.pools.be:
                return _Rule(qos, self.pools.be, "BE share pool")
            return self.exhausted(qos, "BE")
        # SYSTEM
        if self.system:
            return _Rule(qos, self.system, "system_cpus")
        return self.ls_rule(qos, None, "no online system_cpus: ")


_MAX_NAMED = 5  # other pods named in one conflict message
_KEEP = _MAX_NAMED + 2  # smallest keys kept per CPU: room for the pod itself and one to tell "and others"


def _conflicts(claims: list[tuple[str, CPUSet]], shared: CPUSet) -> list[Problem]:
    """One problem for every exclusive pod holding a CPU another one holds too, naming others.

    Reported against each side, so the report does not depend on the order of the pods. Bounded
    work even for a scheduler gone wrong (5,000 pods claiming the same CPUs): claims are grouped
    by identical cpuset, and each shared CPU keeps only the few smallest pod keys, which is all
    a message names.
    """
    groups: dict[int, list[str]] = {}
    for key, cpus in claims:
        groups.setdefault(cpus.mask, []).append(key)
    lowest: dict[int, list[str]] = {}
    for mask, keys in groups.items():
        keys.sort()
        head = keys[:_KEEP]
        for cpu in CPUSet(mask & shared.mask):
            cur = lowest.get(cpu)
            lowest[cpu] = head if cur is None else sorted(set(cur).union(head))[:_KEEP]
    problems = []
    for mask, keys in groups.items():
        overlap = CPUSet(mask & shared.mask)
        if not overlap:
            continue
        candidates = sorted(set().union(*(lowest[cpu] for cpu in overlap)))[:_KEEP]
        for key in keys:
            others = [k for k in candidates if k != key]
            if others:
                more = " and others" if len(others) > _MAX_NAMED else ""
                problems.append(
                    Problem(
                        key,
                        ProblemKind.EXCLUSIVE_CONFLICT,
                        f"CPUs {overlap} of allocation cpuset {CPUSet(mask)} are also "
                        f"claimed by {', '.join(others[:_MAX_NAMED])}{more}",
                    )
                )
    return problems


def _kubelet_state(inputs: NodeInputs) -> KubeletState | None:
    k = inputs.kubelet
    return k if k is not None and k.static else None


# a pod's label class, allocation, the allocation's error (None: none), cgroup parent
_Parsed = tuple[QoS | None, Allocation | None, str | None, CgroupParent | None]


def _parse(pod: PodInfo) -> _Parsed:
    """What a pod's label, annotations and cgroup parent say (depends on the pod alone)."""
    try:
        alloc, bad = allocation_from_annotations(pod.annotations), None
    except AllocationError as e:
        alloc, bad = None, str(e)
    return label_qos(pod.labels), alloc, bad, parse_cgroup_parent(pod.cgroup_parent)


@dataclass
class _Survey:
    """First pass over the pods: everything the pools depend on, and pod-level problems. Folded
    pod by pod, so the part of a prefix of the pods can be kept (`copy`) and folded on from."""

    problems: list[Problem] = field(default_factory=list)
    lse: int = 0
    lsr: int = 0
    claimed: int = 0
    shared: int = 0  # CPUs claimed by more than one exclusive pod
    claims: list[tuple[str, CPUSet]] = field(default_factory=list)
    classes: dict[str, QoS] = field(default_factory=dict)  # exclusive pod key -> LSE or LSR
    skip_uids: set[str] = field(default_factory=set)  # kubelet entries the scheduler/label overrides
    skip_cids: set[str] = field(default_factory=set)

    def fold(self, e: _Entry) -> None:
        """Add one pod's part (`_entry`) to the node's: the pools depend on all of them together."""
        if e.problems:
            self.problems.extend(e.problems)
        if e.skip:
            pod = e.view.pod
            self.skip_uids.add(pod.uid)
            self.skip_cids.update(c.id for c in pod.containers)
        if e.claim is not None:
            pod_class, cpus, exclusive = e.claim
            key = e.view.pod.key
            self.shared |= cpus.mask & self.claimed
            self.claimed |= cpus.mask
            self.claims.append((key, cpus))
            self.classes[key] = pod_class
            if pod_class is QoS.LSE:
                self.lse |= exclusive.mask
            else:
                self.lsr |= exclusive.mask

    def copy(self) -> _Survey:
        return _Survey(
            list(self.problems),
            self.lse,
            self.lsr,
            self.claimed,
            self.shared,
            list(self.claims),
            dict(self.classes),
            set(self.skip_uids),
            set(self.skip_cids),
        )


@dataclass(frozen=True, slots=True)
class _Entry:
    """What one pod brings to the survey; depends on the pod and the online CPUs alone, so a
    `DecideMemo` keeps it while the pod is unchanged."""

    problems: tuple[Problem, ...]
    skip: bool  # the kubelet's entries for this pod are overridden (allocation cpuset, LS/BE label)
    claim: tuple[QoS, CPUSet, CPUSet] | None  # LSE/LSR with a cpuset: class, cpuset, its online part
    view: _PodView


def _entry(pod: PodInfo, online: CPUSet, parsed: _Parsed) -> _Entry:
    key = pod.key
    label, alloc, bad, cgroup = parsed
    problems: list[Problem] = []
    if bad is not None:
        problems.append(Problem(key, ProblemKind.BAD_ANNOTATION, f"{bad}; treated as absent"))
    cpus = alloc.cpuset if alloc is not None and alloc.cpuset else None
    skip = cpus is not None or label is QoS.LS or label is QoS.BE
    pod_class = label if label is not None else (QoS.LSR if cpus is not None else None)
    exclusive: CPUSet | None = None
    claim: tuple[QoS, CPUSet, CPUSet] | None = None
    if pod_class in EXCLUSIVE_CLASSES and cpus is not None:
        assert pod_class is not None
        exclusive = cpus & online
        if exclusive != cpus:
            problems.append(
                Problem(
                    key,
                    ProblemKind.CPUS_NOT_ONLINE,
                    f"allocation cpuset {cpus} names CPUs {cpus - online} "
                    f"that are not online; using {exclusive or 'none'}",
                )
            )
        claim = (pod_class, cpus, exclusive)
    return _Entry(tuple(problems), skip, claim, _PodView(pod, label, alloc, cgroup, exclusive))


def may_move_pools(labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
    """Whether a pod with these labels and annotations may change the pools by being there (or
    going): it names a QoS class or an allocation. A pod with neither claims no CPU and overrides
    no kubelet entry, so no other container's decision depends on it (conservative: any value)."""
    return QOS_LABEL in labels or any(key in annotations for key in ALLOCATION_ANNOTATIONS)


_MAX_HOLDERS = 6  # holders named in one pool-exhausted message


def _holders(survey: _Survey, pools: Pools, reserved: CPUSet) -> dict[QoS, tuple[str, ...]]:
    """Who took the share pools' CPUs, per pool (LS: reserved, LSE, LSR, kubelet; BE: no LSR)."""
    exclusive = [
        (f"{survey.classes[key]} {key} ({cpus})", survey.classes[key])
        for key, cpus in sorted(survey.claims, key=lambda kc: (kc[1].mask, kc[0]))  # any pod order
    ]
    common = [f"reserved ({reserved})"] if reserved else []
    kubelet = [f"kubelet static CPU manager ({pools.kubelet})"] if pools.kubelet else []

    def bounded(items: list[str]) -> tuple[str, ...]:
        more = len(items) - _MAX_HOLDERS
        return tuple(items[:_MAX_HOLDERS] + ([f"and {more} more"] if more > 0 else []))

    ls = [text for text, _ in exclusive]
    be = [text for text, qos in exclusive if qos is QoS.LSE]
    return {QoS.LS: bounded(common + ls + kubelet), QoS.BE: bounded(common + be + kubelet)}


_PodDone = tuple[PodInfo, dict[str, ContainerDecision], list[Problem], list[str]]


class DecideMemo:
    """What a `decide` call may take from the one before it, so that a change costs its own pod.

    Per pod (by identity: the caller hands the same `PodInfo` object while the pod is unchanged),
    its survey part and its containers' decisions and problems as long as the pools and everything
    else they depend on are equal. Only the last call's pods are kept. The pods the caller hands
    keep their order, and a change is most often at the end (a new pod, the newest pod's new
    container), so the node's totals over all pods but the last, and over all, are kept too: a
    call whose pods begin with the last call's (all of them, or all but its last) folds on from
    there instead of going over every pod again.

    After a call, `changed` names the containers whose decision differs from the call before (of
    the pods decided again, or gone, those not equal to what they were); None: any may (the first
    call, other pools, ...).
    """

    __slots__ = (
        "changed",
        "context",
        "decider",
        "extra",
        "folded",
        "folds",
        "kube",
        "merged",
        "online",
        "parsed",
        "pods",
        "reserved",
        "seq",
        "troubled",
    )

    def __init__(self) -> None:
        self.context: tuple[object, ...] = ()
        self.online: CPUSet | None = None  # the online CPUs `parsed` and `folds` were made with
        self.seq: tuple[PodInfo, ...] = ()  # the last call's pods, in order
        self.parsed: dict[int, tuple[PodInfo, _Entry]] = {}  # id(pod) -> pod, its survey part
        self.pods: dict[int, _PodDone] = {}  # id(pod) -> its decisions under `context`
        # the totals after all of `seq` but its last pod, and after all of it (never changed later)
        self.folds: tuple[_Fold | None, _Fold] | None = None
        self.merged: dict[str, ContainerDecision] = {}  # the last call's decisions (never changed)
        self.changed: Changed | None = None
        self.reserved: CPUSet | None = None  # the last call's reserved CPUs (the pools depend on them)
        self.decider: _Decider | None = None  # the last call's, for `decide_one` and `decide_added`
        self.kube: KubeletState | None = None  # the last call's kubelet state (static policy), ditto
        self.extra: dict[int, tuple[PodInfo, _Entry]] = {}  # id(pod) -> part `decide_one` made since
        # the last fold (`_folded`): the pods it was over (that very tuple), what it made of them
        self.folded: tuple[tuple[PodInfo, ...], dict[int, tuple[PodInfo, _Entry]] | None] | None = None
        self.troubled: frozenset[str | None] = frozenset()  # keys of the pods the last plan has problems of


@dataclass
class _Decided:
    """The second pass's totals over a prefix of the pods (under one context)."""

    problems: list[Problem] = field(default_factory=list)
    exclusive: list[str] = field(default_factory=list)
    count: int = 0  # decisions made (more than the ids when an id is in two pods)

    def add(self, done: _PodDone) -> None:
        if done[2]:
            self.problems.extend(done[2])
        if done[3]:
            self.exclusive.extend(done[3])
        self.count += len(done[1])

    def copy(self) -> _Decided:
        return _Decided(list(self.problems), list(self.exclusive), self.count)


_Fold = tuple[_Survey, _Decided]


def _decide_pod(view: _PodView, decider: _Decider, kube: KubeletState | None) -> _PodDone:
    """One pod's containers: their decisions, the problems they carry, the exclusive ones' ids."""
    pod = view.pod
    key = pod.key
    decisions: dict[str, ContainerDecision] = {}
    problems: list[Problem] = []
    shared: _Rule | None = None
    if not _per_container(view, kube):
        # no per-container kubelet entry to look up: every container gets the same decision
        if pod.containers:
            shared = _shared_rule(view, decider)
            decisions = dict.fromkeys(
                [c.id for c in pod.containers], ContainerDecision(key, shared.qos, shared.cpuset, shared.why)
            )
            for c in pod.containers if shared.notes else ():
                for kind, text, held in shared.notes:
                    problems.append(Problem(key, kind, f"container {c.name}: {text}", held))
        exclusive = list(decisions) if shared and _pins_exclusive(shared) else []
        return pod, decisions, problems, exclusive
    for c in pod.containers:
        kcpus = kube.container_cpus(pod.uid, c.name, c.id) if kube else None
        qos = classify(view.label, view.allocation, view.cgroup, kcpus)
        if qos is QoS.KUBELET:
            decisions[c.id] = ContainerDecision(key, qos, kcpus, "kubelet static CPU manager entry")
            continue
        if shared is None:
            shared = decider.pod_rule(view, qos)
        decisions[c.id] = ContainerDecision(key, shared.qos, shared.cpuset, shared.why)
        for kind, text, held in shared.notes:
            problems.append(Problem(key, kind, f"container {c.name}: {text}", held))
    return pod, decisions, problems, _exclusive(decisions)


def _shared_rule(view: _PodView, decider: _Decider) -> _Rule:
    """The rule all containers of a pod share when none has a kubelet entry of its own."""
    return decider.pod_rule(view, classify(view.label, view.allocation, view.cgroup, None))


def _pins_exclusive(rule: _Rule) -> bool:
    """Whether containers under `rule` hold CPUs exclusively (LSE/LSR with a cpuset)."""
    return rule.qos in EXCLUSIVE_CLASSES and bool(rule.cpuset)


def _per_container(view: _PodView, kube: KubeletState | None) -> bool:
    """Whether the pod's containers may each have a kubelet entry of their own (a Guaranteed pod,
    and a kubelet state): then each is decided alone; else they all share the pod's rule."""
    return view.cgroup is not None and view.cgroup.qos is KubeQoS.GUARANTEED and bool(kube)


def _exclusive(decisions: Mapping[str, ContainerDecision]) -> list[str]:
    return [cid for cid, d in decisions.items() if d.qos in EXCLUSIVE_CLASSES and d.cpuset]


def _merge(
    gone: list[_PodDone],
    come: list[_PodDone],
    merged: dict[str, ContainerDecision],
    count: int,
    pods: tuple[PodInfo, ...],
    dones: Mapping[int, _PodDone],
) -> dict[str, ContainerDecision]:
    """Every pod's decisions in one dict: the last call's dict copied at once (a dict copy, not one
    insert per container), less the pods gone from the end, plus the pods come after the kept
    ones (typically the newest pod, which gets the new containers). Built from every pod when an
    id turns out to be in two pods (`count`: the decisions made, one per container of each pod)."""
    decisions = dict(merged)
    if len(gone) == 1 and len(come) == 1 and _prefix(gone[0][1], come[0][1]):
        decisions.update(come[0][1])  # the last pod grew: its ids stay where they were
    else:
        _drop(decisions, [cid for done in gone for cid in done[1]])
        for done in come:
            decisions.update(done[1])
    if len(decisions) == count:
        return decisions
    decisions = {}
    for pod in pods:
        decisions.update(dones[id(pod)][1])
    return decisions


def _drop(decisions: dict[str, ContainerDecision], ids: list[str]) -> None:
    """Remove `ids` from `decisions`: from its end while they are its last keys (the pods gone are
    the last ones), which keeps the dict without holes; a dict with holes copies ~10x slower, and
    the next call copies it."""
    gone = set(ids)
    for _ in range(len(gone)):
        if not decisions:
            break
        cid, decision = decisions.popitem()
        if cid not in gone:
            decisions[cid] = decision  # back in its place, the last
            break
        gone.discard(cid)
    for cid in gone:
        decisions.pop(cid, None)


class Changed:
    """The containers of the pods decided again, or gone, whose decision is not what it was; worked
    out when first asked (by the reconcile pass after the call, not in the plan a pre hook waits
    for). A pod that grew by one container names that one, not all of its containers: they share
    one decision object each side, so equality is asked once per pair of objects."""

    __slots__ = ("_after", "_before", "_ids", "_looked")

    def __init__(
        self,
        looked: list[dict[str, ContainerDecision]],
        before: Mapping[str, ContainerDecision],
        after: Mapping[str, ContainerDecision],
    ) -> None:
        self._looked, self._before, self._after = looked, before, after  # never changed after a call
        self._ids: set[str] | None = None

    def ids(self) -> set[str]:
        if self._ids is not None:
            return self._ids
        before, after = self._before, self._after
        equal: dict[tuple[int, int], bool] = {}
        changed: set[str] = set()
        for decisions in self._looked:
            for cid in decisions:
                a, b = before.get(cid), after.get(cid)
                if a is b:
                    continue
                if a is None or b is None:
                    changed.add(cid)
                    continue
                pair = (id(a), id(b))
                same = equal.get(pair)
                if same is None:
                    same = equal[pair] = a == b
                if not same:
                    changed.add(cid)
        self._ids = changed
        self._looked, self._before, self._after = [], {}, {}  # what it was worked out from: let go
        return changed


def _prefix(a: Mapping[str, object], b: Mapping[str, object]) -> bool:
    """Whether `a`'s keys are the first keys of `b`, in the same order."""
    return len(a) <= len(b) and list(a) == list(islice(b, len(a)))


def _begins_with(new: tuple[PodInfo, ...], old: tuple[PodInfo, ...], n: int) -> bool:
    """Whether `new` begins with the first `n` pods of `old`, the very objects (the last of them
    looked at first: where a change usually is)."""
    if n <= 0:
        return n == 0
    return n <= len(new) and new[n - 1] is old[n - 1] and all(map(is_, islice(old, n - 1), new))


def _fold_start(memo: DecideMemo, pods: tuple[PodInfo, ...], online: CPUSet) -> tuple[int, _Fold | None]:
    """Where this call folds on from the last one's totals: after all its pods, or all but its
    last, when the pods begin with those; (0, None): from nothing."""
    if memo.folds is None or memo.online != online:
        return 0, None
    old = memo.seq
    before_last, final = memo.folds
    if _begins_with(pods, old, len(old)):
        return len(old), final
    if before_last is not None and _begins_with(pods, old, len(old) - 1):
        return len(old) - 1, before_last
    return 0, None


def decide(inputs: NodeInputs, memo: DecideMemo | None = None) -> Plan:
    """Decide every container's cpuset from the node's inputs (see cpuset-rules.md).

    `memo` (optional, the caller's to keep between calls) makes unchanged pods cost almost nothing;
    the plan is the same with or without it."""
    online = inputs.topology.online
    kube = _kubelet_state(inputs)
    pods = inputs.pods
    n = len(pods)
    memo = memo if memo is not None else DecideMemo()
    old = memo.seq
    at, start = _fold_start(memo, pods, online)
    known = memo.parsed if memo.online == online else {}

    extra = memo.extra if memo.online == online else {}

    def part(pod: PodInfo) -> _Entry:
        hit = known.get(id(pod)) or extra.get(id(pod))
        if hit is not None and hit[0] is pod:
            return hit[1]
        return _entry(pod, online, _parse(pod))

    # first pass (what the pools depend on): the pods after `at` folded onto the totals before them
    come = pods[at:]
    entries = [part(pod) for pod in come]
    survey = start[0].copy() if start is not None else _Survey()
    kept = _kept_before_last(memo, at, n)
    survey_before_last = kept[0] if kept is not None else None
    for i, e in enumerate(entries, at):
        if i == n - 1:
            survey_before_last = survey.copy()
        survey.fold(e)

    problems = list(survey.problems)
    if survey.shared:
        problems.extend(_conflicts(survey.claims, CPUSet(survey.shared)))
    pools = compute_pools(
        online,
        inputs.reserved,
        CPUSet(survey.lse),
        CPUSet(survey.lsr),
        kubelet_exclusive(kube, survey.skip_uids, survey.skip_cids),
    )
    holders = _holders(survey, pools, inputs.reserved & online)
    decider = _Decider(inputs.topology, pools, inputs.system, holders)
    context = (inputs.topology, kube, pools, inputs.system, holders)

    # second pass: under the same context, the pods after `at` alone; else every pod, each one's
    # decisions reused while the context is the same and the pod the very object
    same = memo.context == context
    resume = same and start is not None
    if not resume and at:
        entries = [part(pod) for pod in pods[:at]] + entries
        at, come = 0, pods
    before = memo.pods if same else {}
    decided = start[1].copy() if resume and start is not None else _Decided()
    kept = _kept_before_last(memo, at, n)
    decided_before_last = kept[1] if kept is not None else None
    come_done: list[_PodDone] = []
    redone: list[_PodDone] = []
    for i, (pod, e) in enumerate(zip(come, entries, strict=True), at):
        done = before.get(id(pod))
        if done is None or done[0] is not pod:
            done = _decide_pod(e.view, decider, kube)
            redone.append(done)
        if i == n - 1:
            decided_before_last = decided.copy()
        decided.add(done)
        come_done.append(done)

    # what the next call may take: this call's pods only
    kept_parsed = known if start is not None else {}
    kept_pods = memo.pods if resume else {}
    here = {id(pod) for pod in come}
    gone_done: list[_PodDone] = []
    for pod in old[at:]:
        if id(pod) in here:
            continue
        kept_parsed.pop(id(pod), None)
        done = kept_pods.pop(id(pod), None) if resume else memo.pods.get(id(pod))
        if done is not None and done[0] is pod:
            gone_done.append(done)
    for pod, e, done in zip(come, entries, come_done, strict=True):
        kept_parsed[id(pod)] = (pod, e)
        kept_pods[id(pod)] = done
    if resume:
        decisions = _merge(gone_done, come_done, memo.merged, decided.count, pods, kept_pods)
    else:
        decisions = {}
        for done in come_done:
            decisions.update(done[1])
    if same:
        looked = [done[1] for done in redone] + [done[1] for done in gone_done]
        memo.changed = Changed(looked, memo.merged, decisions)
    else:
        memo.changed = None
    memo.context, memo.online, memo.seq = context, online, pods
    memo.reserved, memo.decider, memo.extra, memo.kube = inputs.reserved, decider, {}, kube
    memo.folded = None
    memo.parsed, memo.pods, memo.merged = kept_parsed, kept_pods, decisions
    last = None
    if survey_before_last is not None and decided_before_last is not None:
        last = (survey_before_last, decided_before_last)
    memo.folds = (last, (survey, decided))

    problems.extend(decided.problems)
    problems.sort(key=lambda p: (p.pod or "", p.kind, p.message))
    memo.troubled = frozenset(p.pod for p in problems)
    plan_problems = (*inputs.input_problems, *problems)
    return Plan(pools, MappingProxyType(decisions), plan_problems, frozenset(decided.exclusive))


def _kept_before_last(memo: DecideMemo, at: int, n: int) -> _Fold | None:
    """The last call's totals before its last pod when this call's pods are those very pods
    (nothing folded after `at`): the totals before this call's last pod too. Kept totals are
    never changed (a call folds on from a copy), so they are handed as they are."""
    if at == n and n == len(memo.seq) and memo.folds is not None:
        return memo.folds[0]
    return None


FAST_SPAN = 8
"""Pods changed since the last `decide` that `decide_one` looks over, at most: a burst of creates
between two plans stays cheap, and a longer one is the next plan's to fold."""


def _neutral(e: _Entry) -> bool:
    """A pod no other pod's decision depends on: no class label (so not exclusive, and no kubelet
    entry overridden), no allocation cpuset, nothing wrong with it."""
    return e.view.label is None and e.claim is None and not e.skip and not e.problems


def _again(pod: PodInfo, before: tuple[PodInfo, _Entry] | None, online: CPUSet) -> tuple[PodInfo, _Entry]:
    """The pod's survey part, from `before` (an earlier version of the pod) when only its containers
    changed: the very labels, annotations and cgroup parent parse the same."""
    if before is not None:
        old, e = before
        if old is pod:
            return before
        same = old.labels is pod.labels and old.annotations is pod.annotations
        if same and old.cgroup_parent == pod.cgroup_parent and not e.problems:  # no parse error
            view = e.view
            return pod, _entry(pod, online, (view.label, view.allocation, None, view.cgroup))
    return pod, _entry(pod, online, _parse(pod))


def _kin_changed(made: dict[int, tuple[PodInfo, _Entry]], pod: PodInfo) -> bool:
    """Whether another sandbox of the pod (the same key) is among the pods changed since the last
    call: its containers' problems are the pod's too, and only a plan says them (`memo.troubled`
    knows the last call's only)."""
    name, namespace = pod.name, pod.namespace  # the key's parts: no string made per pod
    return any(
        other is not pod and other.name == name and other.namespace == namespace for other, _ in made.values()
    )


def _holds(pod: PodInfo, container_id: str) -> bool:
    """Whether the pod has the container (most often its newest one)."""
    cs = pod.containers
    return bool(cs) and (cs[-1].id == container_id or any(c.id == container_id for c in cs))


def _folded(inputs: NodeInputs, memo: DecideMemo) -> dict[int, tuple[PodInfo, _Entry]] | None:
    """The survey parts of the pods changed since the last `decide` call (by `id`), when the other
    inputs are that call's and those pods (a few at the end: a new pod, a pod with a new container)
    are `_neutral`, before and after: then the survey, so the pools and everything else a decision
    depends on, is the last call's. None when that is not sure. Kept in `memo.extra` for the next
    fold, and in `memo.folded` for a question about the same pods; the memo's totals are left as
    they are."""
    decider = memo.decider
    online = inputs.topology.online
    if decider is None or memo.folds is None or memo.online != online:
        return None
    topology, kube, _, system, _ = memo.context
    now = _kubelet_state(inputs)
    if (
        (inputs.topology is not topology and inputs.topology != topology)
        or (now is not kube and now != kube)
        or inputs.system != system
        or inputs.reserved != memo.reserved
    ):
        return None
    pods = inputs.pods
    last = memo.folded
    if last is not None and last[0] is pods:  # asked again of the same pods: a read ahead of several
        return last[1]
    made = _fold(memo, pods, online)
    memo.folded = (pods, made)
    return made


def _fold(
    memo: DecideMemo, pods: tuple[PodInfo, ...], online: CPUSet
) -> dict[int, tuple[PodInfo, _Entry]] | None:
    """`_folded`'s part that looks at the pods."""
    at, _ = _fold_start(memo, pods, online)
    if len(pods) - at > FAST_SPAN:
        return None
    replaced: dict[str, tuple[PodInfo, _Entry]] = {}
    for pod in memo.seq[at:]:  # the pod replaced (it may have been the one claiming CPUs)
        hit = memo.parsed.get(id(pod))
        if hit is None or hit[0] is not pod or not _neutral(hit[1]):
            return None
        replaced[pod.uid] = hit
    earlier = {old.uid: (old, e) for old, e in memo.extra.values()} | replaced  # by uid: versions before
    made: dict[int, tuple[PodInfo, _Entry]] = {}
    for pod in pods[at:]:
        hit = memo.parsed.get(id(pod)) or memo.extra.get(id(pod))
        if hit is None or hit[0] is not pod:
            hit = _again(pod, earlier.get(pod.uid), online)
        if not _neutral(hit[1]):
            return None
        made[id(pod)] = hit
    memo.extra = made  # this call's pods only: a pod changed again leaves its older parts behind
    return made


def decide_one(inputs: NodeInputs, memo: DecideMemo, container_id: str) -> ContainerDecision | None:
    """What `decide(inputs, memo)` would decide for `container_id`, without deciding the node.

    Sure only when the pods changed since the last call may be folded over (`_folded`): then
    deciding the container's pod alone under the last call's context is deciding it. None when
    that is not sure, or when the pod's decision carries a problem or is exclusive (the caller then
    asks the whole plan, which says why). The memo's totals are left as they are."""
    made = _folded(inputs, memo)
    if made is None:
        return None
    decider, kube = memo.decider, memo.kube
    assert decider is not None  # `_folded` answers only after a call
    found = next((e for pod, e in reversed(made.values()) if _holds(pod, container_id)), None)
    if found is None or found.view.pod.key in memo.troubled:  # another sandbox of the pod has problems
        return None
    if _kin_changed(made, found.view.pod):
        return None
    view = found.view
    if not _per_container(view, kube):  # the pod's one rule, without deciding its other containers
        rule = _shared_rule(view, decider)
        if rule.notes or _pins_exclusive(rule):
            return None  # `_decide_pod` would give the pod problems, or exclusive containers
        return ContainerDecision(view.pod.key, rule.qos, rule.cpuset, rule.why)
    _, decisions, problems, exclusive = _decide_pod(view, decider, kube)
    if problems or exclusive:
        return None
    return decisions.get(container_id)


def decide_added(
    memo: DecideMemo, pod: PodInfo, container_id: str, inputs: NodeInputs | None = None
) -> ContainerDecision | None:
    """What `decide` would decide for container `container_id` added to `pod` (one of the last
    call's pods, the very object), when the inputs are the last call's but for that container: the
    caller's to know. With `inputs` (those of now, without the container), `pod` may also be one
    of the pods changed since, a new one most often, when `_folded` may fold over them.

    Sure when the new container moves no pool and its pod's containers share one rule: a pod's
    survey part does not depend on its containers, except that the kubelet's entry of a container
    in a pod whose kubelet entries are overridden (`skip`) no longer counts, so such a pod's new
    container must have none; then the pools stay the last call's, and the new container gets the
    pod's rule, which does not look at the containers. None otherwise, and when the rule carries a
    problem or pins CPUs (the caller then folds or plans, which says why). Reads the memo, changes
    nothing but its fold (`memo.extra`, `memo.folded`): a CreateContainer asks this before its
    pending record goes in."""
    decider, kube = memo.decider, memo.kube
    hit = memo.parsed.get(id(pod))
    if inputs is not None and inputs.pods is not memo.seq:
        made = _folded(inputs, memo)
        if made is None:
            return None
        if _kin_changed(made, pod):
            return None
        hit = made.get(id(pod)) or hit  # changed since, or as it was (the survey is the same)
    if decider is None or hit is None or hit[0] is not pod:
        return None
    entry = hit[1]
    if entry.skip and kube is not None and container_id in kube.container_entries:
        return None
    view = entry.view
    if pod.key in memo.troubled or _per_container(view, kube):
        return None
    rule = _shared_rule(view, decider)
    if rule.notes or _pins_exclusive(rule):
        return None
    return ContainerDecision(pod.key, rule.qos, rule.cpuset, rule.why)
