"""Node facts + node state -> the rules' inputs -> a Plan, cached until something changes."""

from __future__ import annotations

import functools
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Protocol

from cri_proxy.config import Config
from cri_proxy.cpu import CPUSet, NodeInputs, Plan, Problem, ProblemKind, Topology, decide
from cri_proxy.cpu.decide import Changed, ContainerDecision, DecideMemo, decide_added, decide_one
from cri_proxy.enforce.exclusivity import EXCLUSIVE, Overlap, overlap_problems, overlaps
from cri_proxy.sources.kube_api import KubeApiWatcher
from cri_proxy.sources.kubelet_file import KubeletStateFile
from cri_proxy.state.model import LIVE_STATES, NodeState, PodRecord


class HasProblem(Protocol):
    """A source of facts whose trouble, if any, is a node-wide problem of the plan."""

    @property
    def problem(self) -> Problem | None: ...


@functools.lru_cache(maxsize=16)
def _cpus(text: str) -> CPUSet:
    """A configured CPU list (validated at load), parsed once per text, not on every plan."""
    return CPUSet.parse(text)


READ_AHEAD_KEPT = 4
"""Pods whose next create `Policy.read_ahead` reads ahead, at most: the new pod and the newest before."""
TAKEN_KEPT = 1024
"""Pending containers given a decision read ahead that are remembered at most (`Policy.renamed`)."""


@dataclass(frozen=True, slots=True)
class Early:
    """A create's decision, read from the last plan before its pending record went in."""

    plan: Plan  # the plan it was read from
    at: int  # the state's change-log position then
    decision: ContainerDecision


class Policy:
    """Holds what the decision depends on besides the state; `plan()` is the current decision."""

    def __init__(
        self,
        state: NodeState,
        topology: Topology,
        settings: Callable[[], Config],
        kubelet: KubeletStateFile | None = None,
        api: KubeApiWatcher | None = None,
        others: Sequence[HasProblem] = (),
    ) -> None:
        self.state = state
        self.topology = topology
        self.settings = settings  # reserved and system CPUs; a reload swaps the object, see plan()
        self.kubelet = kubelet
        self.api = api
        self.others = others  # more node-wide sources of problems (the CPU topology watch)
        self._facts_version = 0
        self._cached: tuple[int, int, Config, Plan] | None = None
        self._rules: Plan | None = None  # the rules' plan before pins and explanations
        self._memo = DecideMemo()  # unchanged pods are not decided again
        # (the plan before, ids whose decision may differ from it) of the last plans computed; weak:
        # a plan nobody holds any more is never asked about
        self._history: deque[tuple[weakref.ref[Plan] | None, Changed | None]] = deque(maxlen=64)
        self._was_plain = False  # the last plan was the rules' own (no pin, no API explanation)
        self._pins: dict[str, CPUSet] = {}  # as of the state's change-log position `_pins_at`
        self._pins_at = -1  # before any position: the first `pins` reads every container
        # what `before_create` says for the pods `prepare` was asked about, as of (rules generation,
        # facts version, settings): sandbox id -> its answer
        self._prepared: tuple[int, int, Config | None, dict[str, Early]] = (-1, -1, None, {})
        self._taken: set[str] = set()  # pending containers given a decision read ahead (`renamed`)
        # the last `decide_one` answer: (state generation, container id, decision)
        self._one_asked: tuple[int, str, ContainerDecision | None] = (-1, "", None)

    @property
    def pins(self) -> dict[str, CPUSet]:
        """Live containers' operator pins (`ctl update --force`): container id -> cpuset. They are
        kept on the container's record, so they are checkpointed and go with the container."""
        return dict(self._pins_now())

    def _pins_now(self) -> dict[str, CPUSet]:
        """`pins`, kept (not a copy): brought up to date from the state's change log."""
        changed, self._pins_at = self.state.changes(self._pins_at)
        if changed is None:  # not known what changed (the first call, a wholesale change): read all
            self._pins = {
                c.id: CPUSet.parse(c.pin)
                for c in self.state.containers()
                if c.pin is not None and c.state in LIVE_STATES
            }
        else:  # only the records changed since the last call (a create costs one look, not the node)
            for cid in changed:
                c = self.state.container(cid)
                if c is not None and c.pin is not None and c.state in LIVE_STATES:
                    self._pins[cid] = CPUSet.parse(c.pin)
                else:
                    self._pins.pop(cid, None)
        return self._pins

    def pin(self, container_id: str, cpus: CPUSet) -> bool:
        """An operator's explicit override: this container keeps `cpus` until it is gone or unpinned.
        False when the proxy does not know the container."""
        return self.state.update_container(container_id, pin=str(cpus)) is not None

    def unpin(self, container_id: str) -> bool:
        """Back to the rules' cpuset; False when the container had no pin."""
        c = self.state.container(container_id)
        if c is None or c.pin is None:
            return False
        self.state.update_container(container_id, pin=None)
        return True

    def ids_matter(self) -> bool:
        """Whether a container's id may change a decision (so a rename may): only through a v1
        kubelet state file, whose entries are by container id; v2's are by pod uid and name."""
        kubelet = self.kubelet.state if self.kubelet is not None else None
        return kubelet is not None and bool(kubelet.container_entries)

    def facts_changed(self) -> None:
        """Call after changing the topology, the kubelet state or a source's problem. Not for
        settings: a reload swaps the settings object, which `plan()` notices by itself."""
        self._facts_version += 1

    @property
    def reserved(self) -> CPUSet:
        return _cpus(self.settings().reserved_cpus)

    @property
    def system(self) -> CPUSet:
        return _cpus(self.settings().system_cpus)

    def inputs(self) -> NodeInputs:
        kubelet = self.kubelet
        problems = tuple(
            source.problem
            for source in (kubelet, self.api, *self.others)
            if source is not None and source.problem is not None
        )
        return NodeInputs(
            topology=self.topology,
            pods=self.state.pod_infos(),
            reserved=self.reserved,
            system=self.system,
            kubelet=kubelet.state if kubelet is not None else None,
            input_problems=problems,
        )

    def plan(self) -> Plan:
        generation, facts, settings = self.state.generation, self._facts_version, self.settings()
        cached = self._cached
        if cached is None or cached[:2] != (generation, facts) or cached[2] is not settings:
            rules = self._rules = decide(self.inputs(), self._memo)
            explained = self._explain(rules)
            plan = self._live_problems(explained)
            previous = cached[3] if cached is not None else None
            plain = explained is rules  # else pins or the API view changed decisions: any may differ
            changed = self._memo.changed if plain and self._was_plain else None
            self._was_plain = plain
            self._history.append((weakref.ref(previous) if previous is not None else None, changed))
            cached = self._cached = (generation, facts, settings, plan)
        return cached[3]

    def prepare(self, sandbox_ids: Iterable[str]) -> None:
        """Read ahead, between calls, what `before_create` says for a create in each of these pods
        (those whose calls just changed the node): while nothing changes, a create's path only
        looks it up. Not when container ids matter (`ids_matter`): then the answer is the
        container's own."""
        state = self.state
        ready: dict[str, Early] = {}
        if not self.ids_matter():
            for sandbox_id in sandbox_ids:
                pod = state.pod(sandbox_id)
                early = self._before_create(pod, "") if pod is not None else None
                if early is not None:
                    ready[sandbox_id] = early
        self._prepared = (state.rules_generation, self._facts_version, self.settings(), ready)

    def prepare_after_plan(self, sandbox_ids: Iterable[str]) -> None:
        """`prepare` after a plan: these pods (the newest first: those the calls since changed),
        then the newest of those read ahead before, READ_AHEAD_KEPT in all at least: a pod whose
        next create was awaited still is (a kubelet starts pods side by side)."""
        ids = list(sandbox_ids)
        before = [sid for sid in self._prepared[3] if sid not in ids]  # the newest first
        self.prepare([*ids, *before[: max(0, READ_AHEAD_KEPT - len(ids))]])

    def read_ahead(self, sandbox_id: str) -> bool:
        """`prepare` a new pod's first create (and again the newest read ahead before: a kubelet
        starts pods side by side) without making the plan first: the last plan folded over the
        pods changed since (`decide_added`), which holds when they move no pool. True when the
        pod's was read; else the plan is the caller's to make."""
        before = [sid for sid in self._prepared[3] if sid != sandbox_id]  # the newest first
        before = before[: READ_AHEAD_KEPT - 1]
        if not self._read_new(sandbox_id, before):
            self.prepare([sandbox_id, *before])
        return sandbox_id in self._prepared[3]

    def _read_new(self, sandbox_id: str, before: list[str]) -> bool:
        """`read_ahead` reading the new pod alone and carrying the others over it, when the pod
        going in is the one change since they were read and no sandbox of their pods: its own
        read folded over it (`decide_added`), so the pools are as they were, and they would read
        what they read. False when that is not sure (the caller reads them all again)."""
        generation, facts, settings, ready = self._prepared
        state = self.state
        pod = state.pod(sandbox_id)
        if pod is None or state.rules_generation != generation + 1 or not self._same_facts(self._prepared):
            return False
        others = [state.pod(sid) for sid in before]
        if any(p is None or p.key == pod.key for p in others) or self.ids_matter():
            return False
        early = self._before_create(pod, "")
        if early is None or any(ready[sid].plan is not early.plan for sid in before):
            return False
        carried = {sid: Early(early.plan, early.at, ready[sid].decision) for sid in before}
        self._prepared = (generation + 1, facts, settings, {sandbox_id: early, **carried})
        return True

    def renamed(self, old_id: str) -> bool:
        """A pending container that took a decision read ahead (`prepare`) got its runtime id, and
        nothing else changed since the read but its two changes (it went in, it was renamed): what
        was read ahead still holds (the container took its pod's one rule and moved no pool,
        `decide_added`; a rename changes no decision when ids do not matter), so the next create
        reads it without a plan in between. True when it holds. (Taken, the container went in as
        the one change since the read: `took_early`.)"""
        taken = old_id in self._taken
        self._taken.discard(old_id)
        return taken and self._carry(2)

    def went_in(self, container_id: str) -> bool:
        """As `renamed`, for a container that took a decision read ahead and went in under its
        runtime id at once, its pending record skipped (`EnforceHooks._went_in`): one change since
        the read, not two. True when what was read ahead still holds."""
        taken = container_id in self._taken
        self._taken.discard(container_id)
        return taken and self._carry(1)

    def moved_nothing(self, before: int) -> bool:
        """The state changed from rules generation `before` by one change that the caller knows
        moves no decision (a container started: live before and after, its pod's containers the
        same): what was read ahead as of `before` still holds. True when it does."""
        return self._prepared[0] == before and self._carry(1)

    def _carry(self, count: int) -> bool:
        """What was read ahead, carried over the state's last `count` changes, which the caller
        vouches for, when they are all there were since the read. The facts, the settings and the
        plan it was read from are checked when it is used (`before_create`, `took_early`)."""
        generation, facts, settings, ready = self._prepared
        if not ready or self.state.rules_generation != generation + count:
            return False
        at = self.state.position
        carried = {sid: Early(e.plan, at, e.decision) for sid, e in ready.items()}
        self._prepared = (generation + count, facts, settings, carried)
        self._taken = set()
        return True

    def before_create(self, pod: PodRecord, container_id: str | None) -> Early | None:
        """What the plan will decide for container `container_id` about to be added to `pod`
        (before its pending record goes in), read from the last plan when its rules saw the very
        pods there are now (`decide_added`): nothing is decided on the call's path. The hooks make
        the plan between calls for this, and read it ahead (`prepare`). None when not sure:
        `for_container` then decides. `container_id` None: the container is not known yet (its
        request not read, `EnforceHooks.ready_create`); only what was read ahead for the pod,
        which holds for any container of it, answers."""
        prepared = self._prepared
        if prepared[0] == self.state.rules_generation and self._same_facts(prepared):
            early = prepared[3].get(pod.sandbox_id)  # nothing changed since it was read ahead
            if early is not None:
                return early
        return self._before_create(pod, container_id) if container_id is not None else None

    def _before_create(self, pod: PodRecord, container_id: str) -> Early | None:
        cached = self._cached
        state = self.state
        if cached is None or not self._same_facts(cached):
            return None
        pods = state.pod_infos()
        info = state.ready_info(pod.sandbox_id)
        if info is None or self._text_troubled(pod) or self._exclusive_kin(pod, cached[3]):
            return None
        if state.is_api_sourced(pod.key):  # the plan says where the API's values came from
            return None
        # the pods changed since the last plan (a new pod, most often): folded over, when they may be
        inputs = self.inputs() if pods is not self._memo.seq else None
        decision = decide_added(self._memo, info, container_id, inputs)
        return Early(cached[3], state.position, decision) if decision is not None else None

    def for_container(
        self, pod: PodRecord, container_id: str, early: Early | None = None
    ) -> tuple[ContainerDecision | None, list[Problem]]:
        """The current plan's decision for a container of `pod`, and the pod's problems. Without
        making the plan when the pods changed since the last one only in ways that cannot change
        the pools: `early` (from `before_create`) when the container's pending record is the only
        change since, else `decide_one`: a CreateContainer then costs its pod, not the node."""
        if early is not None and self.took_early(early, container_id):
            return early.decision, []
        fast = self._one(pod, container_id)
        if fast is not None:
            return fast, []  # sure only for a pod with no problem
        plan = self.plan()
        return plan.containers.get(container_id), [p for p in plan.problems if p.pod == pod.key]

    def took_early(self, early: Early, container_id: str) -> bool:
        """Whether `early` still holds now that the container's pending record went in (`_early_holds`);
        then the post hook's question about the container (`as_decided`) gets its answer without
        deciding again."""
        if not self._early_holds(early, container_id):
            return False
        self._one_asked = (self.state.generation, container_id, early.decision)
        if any(early is e for e in self._prepared[3].values()):
            if len(self._taken) >= TAKEN_KEPT:  # creates that never ended: forget them (none carries)
                self._taken.clear()
            self._taken.add(container_id)
        return True

    def _early_holds(self, early: Early, container_id: str) -> bool:
        """Whether `early` still says what the plan would: the same plan, facts and settings, and
        the container's record is the one change since it was read."""
        cached = self._cached
        if cached is None or cached[3] is not early.plan:
            return False
        if not self._same_facts(cached):
            return False
        changed, _ = self.state.changes(early.at)
        return changed == {container_id} and self.state.container(container_id) is not None

    def as_decided(self, pod: PodRecord, container_id: str, applied: str) -> bool:
        """Whether a container has cpuset `applied` as the plan decides now, on a node without
        exclusive containers (whose overlaps a reconcile pass reports): then no pass has anything
        to do for it."""
        decision = self._one(pod, container_id)
        if decision is not None:
            last = self._cached[3] if self._cached is not None else None
            # the changes since the last plan are not exclusive ones (`decide_one`), nor pins
            plan_free = last is not None and last.exclusive is not None and not last.exclusive
            if not (plan_free and not self._pins_now()):
                decision = None
        if decision is None:
            plan = self.plan()
            if plan.exclusive is None or plan.exclusive:
                return False
            decision = plan.containers.get(container_id)
        return decision is not None and (decision.cpuset is None or str(decision.cpuset) == applied)

    def _same_facts(self, cached: tuple[int, int, Config | None, object]) -> bool:
        """Whether the cached plan (or what was read ahead, `_prepared`) was made with the facts and
        settings there are now."""
        return cached[1] == self._facts_version and cached[2] is self.settings()

    def _text_troubled(self, pod: PodRecord) -> bool:
        """Whether this sandbox or another of the same pod has labels not readable as text."""
        return self.state.key_troubled(pod.key)

    @staticmethod
    def _exclusive_kin(pod: PodRecord, plan: Plan) -> bool:
        """Whether `plan` has exclusive containers under the pod's key (another sandbox of the
        same pod): their overlaps are the pod's problems too, which only the plan reports. When
        the plan may be folded on from, the pods changed since it have none (`_folded`)."""
        return any(plan.containers[cid].pod == pod.key for cid in plan.exclusive or ())

    def _one(self, pod: PodRecord, container_id: str) -> ContainerDecision | None:
        """`decide_one` when the last plan is not current but may be folded on from, and nothing
        but the rules decides the container (no pin, no API explanation, no problem of its pod's)."""
        cached = self._cached
        if cached is None or cached[0] == self.state.generation:
            return None  # no plan to fold on from, or the plan is current: read it
        if not self._same_facts(cached) or self._text_troubled(pod) or self._exclusive_kin(pod, cached[3]):
            return None
        generation = self.state.generation
        if self._one_asked[:2] == (generation, container_id):  # the post hook asks what the pre hook did
            return self._one_asked[2]
        record = self.state.container(container_id)
        if record is None or record.pin is not None or self.state.is_api_sourced(pod.key):
            return None
        decision = decide_one(self.inputs(), self._memo, container_id)
        self._one_asked = (generation, container_id, decision)
        return decision

    def changed_since(self, old: Plan) -> set[str] | None:
        """Ids of the containers whose decision may differ between `old` and the current plan;
        None when that is not known (then any may)."""
        current = self.plan()
        ids: set[str] = set()
        if old is current:
            return ids
        for previous, changed in reversed(self._history):
            if changed is None:
                return None
            ids |= changed.ids()
            if previous is not None and previous() is old:
                return ids
        return None

    def overlaps(self) -> list[Overlap]:
        """Live exclusive containers whose CPUs others are still on (see `exclusivity`)."""
        return self._overlaps(self.plan())

    def _overlaps(self, plan: Plan) -> list[Overlap]:
        if plan.exclusive is not None and not plan.exclusive:
            return []  # the common node: no exclusive container, nothing to compare, no records to read
        _, pods, containers = self.state.snapshot()
        return overlaps(plan, {p.sandbox_id: p for p in pods}, containers, self.topology.online)

    def _live_problems(self, plan: Plan) -> Plan:
        """What only the live node shows: labels not readable as text, exclusivity not held."""
        text = tuple(
            Problem(key, ProblemKind.BAD_TEXT, message) for key, message in self.state.pod_problems()
        )
        found = overlap_problems(self._overlaps(plan))
        if not text and not found:
            return plan
        return replace(plan, problems=(*plan.problems, *text, *found))

    def rules_cpuset(self, container_id: str) -> CPUSet | None:
        """The cpuset the rules alone give a container (an operator's pin aside)."""
        self.plan()
        d = self._rules.containers.get(container_id) if self._rules is not None else None
        return d.cpuset if d is not None else None

    def _explain(self, plan: Plan) -> Plan:
        """Say in `why` when a pod's QoS label or allocation came from the Kubernetes API, not CRI;
        an operator's pin replaces the rules' cpuset (and says so)."""
        sourced = self.state.api_sourced()
        pins = {cid: cpus for cid, cpus in self._pins_now().items() if cid in plan.containers}
        if not sourced and not pins:
            return plan
        containers = {}
        for cid, d in plan.containers.items():
            if d.pod in sourced:
                d = replace(d, why=f"{d.why} ({sourced[d.pod]} from the Kubernetes API)")
            if cid in pins:
                rule = "left unchanged" if d.cpuset is None else str(d.cpuset)
                d = replace(
                    d, cpuset=pins[cid], why=f"pinned by an operator (ctl update --force); rules: {rule}"
                )
            containers[cid] = d
        exclusive = None
        if plan.exclusive is not None:  # a pin may give an exclusive container its cpuset, or take it
            pinned = {cid for cid in pins if containers[cid].qos in EXCLUSIVE and containers[cid].cpuset}
            exclusive = (plan.exclusive - pins.keys()) | pinned
        return Plan(plan.pools, MappingProxyType(containers), plan.problems, exclusive)
