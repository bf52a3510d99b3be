"""`Policy.for_container` and `Policy.as_decided` answer from `decide_one` (or from a create's
decision read before its record went in, `before_create`) when they can, without making the node's
plan: after any sequence of changes to the node state (pods of every kind coming and going,
containers created, renamed, stopped, pinned, API views, plans made or not in between) their
answers must be what a fresh policy's whole plan says. Hypothesis drives the sequences."""

from __future__ import annotations

import json

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cri_proxy.config import Config
from cri_proxy.cpu import CPUSet, QoS, Topology
from cri_proxy.cpu.decide import may_move_pools
from cri_proxy.cpu.keys import QOS_LABEL, RESOURCE_STATUS_ANNOTATION
from cri_proxy.enforce.policy import READ_AHEAD_KEPT, Policy
from cri_proxy.state.model import LIVE_STATES, ContainerRecord, ContainerState, NodeState, PodRecord

TOPOLOGY = Topology.build({0: CPUSet.parse("0-3"), 1: CPUSet.parse("4-7")})
CGROUPS = ["/kubepods/pod{u}", "/kubepods/burstable/pod{u}", "/kubepods/besteffort/pod{u}", "/system/{u}"]
KINDS = ["plain"] * 3 + ["LS", "BE", "LSE", "LSR", "LSE-bare", "bad-annotation", "bad-text", "numa"]


def pod_record(sid: str, kind: str, cgroup: str, name: str | None = None) -> PodRecord:
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if kind in ("LS", "BE", "LSE", "LSR", "LSE-bare"):
        labels[QOS_LABEL] = kind.removesuffix("-bare")
    if kind in ("LSE", "LSR"):
        annotations[RESOURCE_STATUS_ANNOTATION] = json.dumps({"cpuset": "2-3"})
    elif kind == "bad-annotation":
        annotations[RESOURCE_STATUS_ANNOTATION] = "{not json"
    elif kind == "numa":
        annotations[RESOURCE_STATUS_ANNOTATION] = json.dumps({"numaNode": [1]})
    problems = ("label not UTF-8",) if kind == "bad-text" else ()
    name = name or sid
    uid = f"uid-{name}"
    return PodRecord(sid, uid, name, "ns", cgroup.format(u=uid), labels, annotations, problems=problems)


class OneContainer(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = NodeState()
        self.config = Config()
        self.policy = Policy(self.state, TOPOLOGY, lambda: self.config)
        self.n = 0
        self.pods: list[str] = []

    def _container(self, data: st.DataObject) -> ContainerRecord:
        return data.draw(st.sampled_from(sorted(self.state.containers(), key=lambda c: c.id)))

    @rule(kind=st.sampled_from(KINDS), cgroup=st.sampled_from(CGROUPS))
    def new_pod(self, kind: str, cgroup: str, name: str | None = None) -> None:
        self.n += 1
        sid = f"s{self.n}"
        self.pods.append(sid)
        self.state.put_pod(pod_record(sid, kind, cgroup, name))

    @rule(kind=st.sampled_from(KINDS), cgroup=st.sampled_from(CGROUPS))
    def run_pod(self, kind: str, cgroup: str, name: str | None = None) -> None:
        """A new pod as the RunPodSandbox post hook records it: one that may move no pool has its
        first create read ahead without a plan (`Policy.read_ahead`), else a plan reads it. What
        the read ahead keeps (the new pod read, the others carried over it) is what reading them
        all again gives."""
        self.new_pod(kind, cgroup, name)
        sid = self.pods[-1]
        pod = self.state.pod(sid)
        assert pod is not None
        neutral = not may_move_pools(pod.labels, pod.annotations) and not self.state.has_api_view(pod.uid)
        if not (neutral and self.policy.read_ahead(sid)):
            self.plan_and_prepare_now([sid])
            return
        kept = self.policy._prepared
        self.policy.prepare(list(kept[3]))
        again = self.policy._prepared[3]
        assert {k: e.decision for k, e in again.items()} == {k: e.decision for k, e in kept[3].items()}
        self.policy._prepared = kept

    @precondition(lambda self: self.pods)
    @rule(data=st.data(), kind=st.sampled_from(KINDS), cgroup=st.sampled_from(CGROUPS))
    def run_pod_again(self, data: st.DataObject, kind: str, cgroup: str) -> None:
        """`run_pod` for a new sandbox of a pod that has one (its first died, or is still there):
        the same namespace and name, the kind drawn again."""
        sid = data.draw(st.sampled_from(self.pods))
        pod = self.state.pod(sid)
        self.run_pod(kind, cgroup, pod.name if pod is not None else sid)

    @precondition(lambda self: self.pods)
    @rule(data=st.data(), newest=st.booleans())
    def create(self, data: st.DataObject, newest: bool) -> None:
        """A pending record, as the pre hook puts it; most often in the newest pod."""
        sid = self.pods[-1] if newest else data.draw(st.sampled_from(self.pods))
        self.n += 1
        self.state.put_container(ContainerRecord(f"pending/{sid}/c{self.n}/0", sid, f"c{self.n}"))

    @precondition(lambda self: self.pods)
    @rule(data=st.data(), newest=st.booleans(), again=st.booleans())
    def hooked_create(self, data: st.DataObject, newest: bool, again: bool) -> None:
        """As the CreateContainer pre hook: the decision read from the last plan before the pending
        record goes in (`before_create`), then asked with it; `again`: a retry whose record is there."""
        sid = self.pods[-1] if newest else data.draw(st.sampled_from(self.pods))
        if not again:
            self.n += 1
        self.hooked_create_in(sid, f"c{self.n}")

    def hooked_create_in(self, sid: str, name: str) -> None:
        """A create in pod `sid` as the pre hook makes it, checked against a fresh plan."""
        pod = self.state.pod(sid)
        assert pod is not None
        c = ContainerRecord(f"pending/{sid}/{name}/0", sid, name)
        early = self.policy.before_create(pod, c.id)
        self.state.put_container(c)
        if pod.ready:
            decision, problems = self.policy.for_container(pod, c.id, early)
            fresh = Policy(self.state, TOPOLOGY, lambda: self.config).plan()
            assert decision == fresh.containers.get(c.id)
            assert problems == [p for p in fresh.problems if p.pod == pod.key]
            if early is not None:
                assert early.decision == decision

    @precondition(lambda self: self.state.containers())
    @rule(data=st.data())
    def created(self, data: st.DataObject) -> None:
        c = self._container(data)
        self.n += 1
        self.state.rename_container(c.id, f"ctr{self.n}")

    @precondition(lambda self: any(c.id.startswith("pending/") for c in self.state.containers()))
    @rule()
    def created_newest(self) -> None:
        """As the post hook: the newest pending container gets its runtime id, and what was read
        ahead is carried over when that rename is the only change since (`Policy.renamed`)."""
        c = [c for c in self.state.containers() if c.id.startswith("pending/")][-1]
        self.n += 1
        self.state.rename_container(c.id, f"ctr{self.n}")
        self.policy.renamed(c.id)

    @precondition(lambda self: self.pods)
    @rule(data=st.data(), newest=st.booleans())
    def ready_create_went_in(self, data: st.DataObject, newest: bool) -> None:
        """As the relay's usual create (`EnforceHooks.ready_create`) whose call ends before its
        pending record goes in: read ahead for the pod alone, the container goes in under its
        runtime id at once (`EnforceHooks._went_in`), then `took_early`, `as_decided` and
        `went_in` on it. What it was given is what a fresh plan says; what was read ahead, when
        `went_in` carries it, answers the next create as the whole plan would (`hooked_create_in`
        and the invariant check that)."""
        sid = self.pods[-1] if newest else data.draw(st.sampled_from(self.pods))
        pod = self.state.pod(sid)
        if pod is None:
            return
        early = self.policy.before_create(pod, None)
        if early is None or early.decision.cpuset is None or early.decision.qos in (QoS.LSE, QoS.LSR):
            return  # not the ready hook's: the pre hook decides on the path
        self.n += 1
        cid, applied = f"ctr{self.n}", str(early.decision.cpuset)
        self.state.put_container(ContainerRecord(cid, sid, f"c{self.n}", applied=applied))
        fresh = Policy(self.state, TOPOLOGY, lambda: self.config).plan()
        if self.policy.took_early(early, cid):
            assert fresh.containers.get(cid) == early.decision
        decided = fresh.containers.get(cid)
        want = fresh.exclusive == frozenset() and (
            decided is not None and (decided.cpuset is None or str(decided.cpuset) == applied)
        )
        assert self.policy.as_decided(pod, cid, applied) == want
        self.policy.went_in(cid)

    @precondition(lambda self: self.state.containers())
    @rule(data=st.data(), newest=st.booleans())
    def started(self, data: st.DataObject, newest: bool) -> None:
        """As the post hook of StartContainer, most often of the newest container: what was read
        ahead is carried over the start when it is the only change since (`Policy.moved_nothing`)."""
        c = self.state.containers()[-1] if newest else self._container(data)
        before = self.state.rules_generation
        self.state.update_container(c.id, state=ContainerState.RUNNING)
        if c.state in LIVE_STATES:
            self.policy.moved_nothing(before)

    @precondition(lambda self: self.pods)
    @rule(data=st.data(), newest=st.booleans())
    def kubelet_create(self, data: st.DataObject, newest: bool) -> None:
        """A container as a kubelet makes it, each hook as the proxy runs it: the create (checked),
        its rename with what was read ahead carried over, its start."""
        self.kubelet_create_in(self.pods[-1] if newest else data.draw(st.sampled_from(self.pods)))

    def kubelet_create_in(self, sid: str) -> None:
        self.n += 1
        name = f"c{self.n}"
        self.hooked_create_in(sid, name)
        pid, cid = f"pending/{sid}/{name}/0", f"ctr{self.n}"
        self.state.rename_container(pid, cid)
        self.policy.renamed(pid)
        before = self.state.rules_generation
        if self.state.update_container(cid, state=ContainerState.RUNNING) is not None:
            self.policy.moved_nothing(before)

    @precondition(lambda self: self.state.containers())
    @rule(data=st.data(), cpus=st.sampled_from(["0-7", "1", "2-3", ""]))
    def observed(self, data: st.DataObject, cpus: str) -> None:
        """A reading of what a container really has: no decision moves (`rules_generation`)."""
        self.state.observe_container(self._container(data).id, cpus, "cgroup", 1.0)

    @precondition(lambda self: self.state.containers())
    @rule(data=st.data(), state=st.sampled_from([ContainerState.RUNNING, ContainerState.EXITED]))
    def container_state(self, data: st.DataObject, state: ContainerState) -> None:
        self.state.update_container(self._container(data).id, state=state)

    @precondition(lambda self: self.state.containers())
    @rule(data=st.data(), pin=st.sampled_from([None, "1", "2-3"]), newest=st.booleans())
    def pin(self, data: st.DataObject, pin: str | None, newest: bool) -> None:
        """An operator's pin (`ctl update --force`), most often on the newest container."""
        c = self.state.containers()[-1] if newest else self._container(data)
        self.state.update_container(c.id, pin=pin)

    @precondition(lambda self: self.state.containers())
    @rule(data=st.data())
    def removed(self, data: st.DataObject) -> None:
        self.state.remove_container(self._container(data).id)

    @precondition(lambda self: self.pods)
    @rule(data=st.data(), remove=st.booleans())
    def pod_gone(self, data: st.DataObject, remove: bool) -> None:
        sid = data.draw(st.sampled_from(self.pods))
        if remove:
            self.state.remove_pod(sid)
            self.pods.remove(sid)
        else:
            self.state.stop_pod(sid)

    @precondition(lambda self: self.pods)
    @rule(data=st.data(), view=st.sampled_from([None, "LS", "LSE", "numa"]), newest=st.booleans())
    def api_view(self, data: st.DataObject, view: str | None, newest: bool) -> None:
        """The Kubernetes API's labels or allocation for a pod (a NUMA-only allocation changes no pool)."""
        uid = f"uid-{self.pods[-1] if newest else data.draw(st.sampled_from(self.pods))}"
        if view is None:
            self.state.forget_api_view(uid)
        elif view == "numa":
            self.state.set_api_view(uid, {}, {RESOURCE_STATUS_ANNOTATION: json.dumps({"numaNode": [0]})})
        else:
            self.state.set_api_view(uid, {QOS_LABEL: view}, {})

    @rule(reserved=st.sampled_from(["", "0", "6-7", "0-7"]))
    def reload(self, reserved: str) -> None:
        self.config = Config(reserved_cpus=reserved)

    @rule()
    def plan(self) -> None:
        """A plan made in between (a reconcile pass, ctl): what `decide_one` folds on from."""
        self.policy.plan()

    @rule(data=st.data())
    def plan_and_prepare(self, data: st.DataObject) -> None:
        """As the hooks after a call: the plan, and a create's decision read ahead for some pods
        (`prepare`), which `before_create` then answers with while nothing changed."""
        self.plan_and_prepare_now(data.draw(st.lists(st.sampled_from([*self.pods, "gone"]), max_size=3)))

    def plan_and_prepare_now(self, sandbox_ids: list[str]) -> None:
        """As the hooks make a plan (`EnforceHooks._make_plan`): the pods read ahead before too."""
        self.policy.plan()
        self.policy.prepare_after_plan(sandbox_ids)

    @precondition(lambda self: self.state.containers())
    @rule(data=st.data())
    def ask_any(self, data: st.DataObject) -> None:
        """A question about any container (the plan is often made for it: the invariant asks only
        about the newest, so as not to make plans the sequence did not ask for)."""
        self.check(self._container(data))

    @invariant()
    def read_ahead_for_few_pods(self) -> None:
        assert len(self.policy._prepared[3]) <= max(READ_AHEAD_KEPT, 3)  # `plan_and_prepare`: 3 at most

    @invariant()
    def answers_are_the_whole_plans(self) -> None:
        live = [c for c in self.state.containers() if c.state in LIVE_STATES]
        if live:
            self.check(live[-1])  # the newest: where creates happen

    def check(self, c: ContainerRecord) -> None:
        fresh = Policy(self.state, TOPOLOGY, lambda: self.config).plan()
        pod = self.state.pod(c.sandbox_id)
        if pod is not None and pod.ready and c.state in LIVE_STATES:
            decision, problems = self.policy.for_container(pod, c.id)
            assert decision == fresh.containers.get(c.id)
            assert problems == [p for p in fresh.problems if p.pod == pod.key]
            for applied in {"0-7", "1", str(decision.cpuset) if decision and decision.cpuset else ""}:
                want = fresh.exclusive == frozenset() and (
                    decision is not None and (decision.cpuset is None or str(decision.cpuset) == applied)
                )
                assert self.policy.as_decided(pod, c.id, applied) == want


OneContainer.TestCase.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)
test_one_container = OneContainer.TestCase


def fast_answer(machine: OneContainer, kind: str = "plain", cgroup: str = CGROUPS[1]) -> ContainerRecord:
    """A plan, then a new pod with a pending container: answered without making a plan."""
    machine.plan()
    machine.new_pod(kind, cgroup)
    sid = machine.pods[-1]
    c = ContainerRecord(f"pending/{sid}/main/0", sid, "main")
    machine.state.put_container(c)
    before = machine.policy._cached
    machine.check(c)
    assert machine.policy._cached is before  # no plan made: `decide_one` answered
    return c


def read_ahead_pod() -> tuple[OneContainer, str, PodRecord]:
    """A machine with a plain pod whose next create's decision is read ahead (`prepare`)."""
    m = OneContainer()
    m.new_pod("plain", CGROUPS[1])
    sid = m.pods[-1]
    pod = m.state.pod(sid)
    assert pod is not None
    m.plan_and_prepare_now([sid])
    return m, sid, pod


def test_a_pin_since_the_last_plan_is_the_decision() -> None:
    m = OneContainer()
    c = fast_answer(m)
    m.state.update_container(c.id, pin="1")
    m.check(c)
    pod = m.state.pod(c.sandbox_id)
    assert pod is not None
    decision, _ = m.policy.for_container(pod, c.id)
    assert decision is not None and str(decision.cpuset) == "1"


def test_an_allocation_from_the_api_since_the_last_plan_is_said() -> None:
    m = OneContainer()
    c = fast_answer(m)
    numa = {RESOURCE_STATUS_ANNOTATION: json.dumps({"numaNode": [0]})}
    m.state.set_api_view(f"uid-{c.sandbox_id}", {}, numa)  # no pool moves: the pod stays neutral
    m.check(c)
    pod = m.state.pod(c.sandbox_id)
    assert pod is not None
    decision, _ = m.policy.for_container(pod, c.id)
    assert decision is not None and "from the Kubernetes API" in decision.why


def test_a_pin_that_makes_a_container_exclusive_since_the_last_plan_asks_for_a_pass() -> None:
    """An LSE pod with no allocation on a node whose LS pool is empty: its container is left as it is
    (not exclusive) until an operator pins it; then a new container is not "as decided" (a pass
    reports overlaps), though nothing about it changed."""
    m = OneContainer()
    m.config = Config(reserved_cpus="0-7")
    m.new_pod("LSE-bare", CGROUPS[1])
    lse = ContainerRecord("ctr-lse", m.pods[-1], "main")
    m.state.put_container(lse)
    assert not m.policy.plan().exclusive
    c = fast_answer(m, cgroup=CGROUPS[3])  # not a kubepods pod: left as it is, no pool to run out of
    pod = m.state.pod(c.sandbox_id)
    assert pod is not None and m.policy.as_decided(pod, c.id, "0-7")
    m.state.update_container(lse.id, pin="6")
    m.check(c)
    assert not m.policy.as_decided(pod, c.id, "0-7")


def test_a_create_is_not_read_from_a_plan_made_before_the_pods_changed() -> None:
    """An LSE pod put in the state since the last plan (no loop turn to make the next): a create in
    an older plain pod is not read from that plan, whose pools still hold the LSE pod's CPUs."""
    m = OneContainer()
    m.new_pod("plain", CGROUPS[1])
    old = m.state.pod(m.pods[-1])
    assert old is not None
    m.plan()
    assert m.policy.before_create(old, "pending/early") is not None
    m.new_pod("LSE", CGROUPS[1])
    assert m.policy.before_create(old, "pending/late") is None
    m.hooked_create_in(old.sandbox_id, "late")


def test_a_change_between_the_read_and_the_question_is_not_missed() -> None:
    """The read (`before_create`) holds only while the pending record is the one change since: a
    pod that moves the pools, a reload, in between, and the decision is made again."""
    for between in ("pod", "reload"):
        m = OneContainer()
        m.new_pod("plain", CGROUPS[1])
        pod = m.state.pod(m.pods[-1])
        assert pod is not None
        m.plan()
        c = ContainerRecord(f"pending/{pod.sandbox_id}/c/0", pod.sandbox_id, "c")
        early = m.policy.before_create(pod, c.id)
        assert early is not None and early.decision.cpuset == CPUSet.parse("0-7")
        m.state.put_container(c)
        if between == "pod":
            m.new_pod("LSE", CGROUPS[1])
        else:
            m.reload("2-3")
        decision, _ = m.policy.for_container(pod, c.id, early)
        assert decision is not None and decision.cpuset == CPUSet.parse("0-1,4-7")
        m.check(c)


def test_a_create_read_ahead_holds_only_while_nothing_changed() -> None:
    """`prepare` reads a create's decision ahead; `before_create` answers with it while the state,
    the facts and the settings are what they were then, and reads again after any change: a pod
    that carves the pools, a reload, a changed fact. Asked for the pod alone (no container id, as
    the relay's ready hook asks before it reads the container's keys), it answers with what was
    read ahead or nothing: it never reads again itself."""
    for between in ("pod", "reload", "facts", "nothing"):
        m, sid, pod = read_ahead_pod()
        ahead = m.policy.before_create(pod, "pending/x")
        assert ahead is not None and ahead.decision.cpuset == CPUSet.parse("0-7")
        assert m.policy.before_create(pod, None) is ahead
        if between == "pod":
            m.new_pod("LSE", CGROUPS[1])
        elif between == "reload":
            m.reload("2-3")
        elif between == "facts":
            m.policy.facts_changed()
        alone = m.policy.before_create(pod, None)
        now = m.policy.before_create(pod, "pending/y")
        if between == "nothing":
            assert now is ahead and alone is ahead  # looked up, not read again
        else:
            assert now is not ahead and alone is None
        m.hooked_create_in(sid, "y")  # what the create decides is the whole plan's


def test_what_was_read_ahead_is_carried_over_a_create_that_took_it() -> None:
    """A create that took its decision from what was read ahead, then renamed, and nothing else:
    the next create in the pod reads ahead again without a plan in between (`Policy.renamed`), and
    decides what a fresh policy's whole plan decides. Not after any other change, nor for a create
    that did not take it."""
    m, sid, pod = read_ahead_pod()
    for i in range(3):  # creates in a row, each renamed: no plan made
        m.hooked_create_in(sid, f"c{i}")
        m.state.rename_container(f"pending/{sid}/c{i}/0", f"ctr-c{i}")
        assert m.policy.renamed(f"pending/{sid}/c{i}/0")
    before = m.policy._cached
    ahead = m.policy.before_create(pod, "pending/next")
    assert ahead is not None and m.policy._cached is before
    m.hooked_create_in(sid, "next")
    # another change in between (a pod that carves the pools): not carried
    m.new_pod("LSE", CGROUPS[1])
    m.state.rename_container(f"pending/{sid}/next/0", "ctr-next")
    assert not m.policy.renamed(f"pending/{sid}/next/0")
    m.hooked_create_in(sid, "after")
    # a create decided on its path (not from what was read ahead): its rename carries nothing
    m.plan_and_prepare_now([sid])
    m.state.put_container(ContainerRecord(f"pending/{sid}/own/0", sid, "own"))
    m.state.rename_container(f"pending/{sid}/own/0", "ctr-own")
    assert not m.policy.renamed(f"pending/{sid}/own/0")
    m.hooked_create_in(sid, "last")


def test_what_was_read_ahead_is_carried_over_a_start_and_a_reading_only() -> None:
    """A kubelet starts each container before it creates the next: what was read ahead is carried
    over the start (`Policy.moved_nothing`) and over readings of what containers really have
    (`rules_generation`), so the next create reads it without a plan in between; not over a start
    that came after another change (a pod that carves the pools)."""
    m, sid, pod = read_ahead_pod()
    before = m.policy._cached
    for i in range(3):
        m.kubelet_create_in(sid)
        m.state.observe_container(f"ctr{m.n}", f"{i}", "cgroup", 1.0)
        assert m.policy.before_create(pod, "pending/next") is not None
    assert m.policy._cached is before  # no plan made
    m.kubelet_create_in(sid)
    m.new_pod("LSE", CGROUPS[1])  # carves 2-3 out of the pools
    before = m.state.rules_generation
    m.state.update_container(f"ctr{m.n}", state=ContainerState.EXITED)
    m.state.update_container(f"ctr{m.n}", state=ContainerState.RUNNING)  # not live before: not carried
    assert not m.policy.moved_nothing(before + 1)
    m.n += 1
    c = ContainerRecord(f"ctr{m.n}", sid, "late")
    before = m.state.rules_generation
    m.state.put_container(c)
    m.state.update_container(c.id, state=ContainerState.RUNNING)
    assert not m.policy.moved_nothing(before + 1)  # the LSE pod came since the read
    m.hooked_create_in(sid, "after")  # decides what a fresh policy's whole plan decides
    decision, _ = m.policy.for_container(pod, f"pending/{sid}/after/0")
    assert decision is not None and decision.cpuset == CPUSet.parse("0-1,4-7")


def test_new_pods_read_ahead_without_a_plan_the_newest_few() -> None:
    """Plain pods coming one after another (a kubelet starting a deployment's replicas), each
    read ahead without a plan: the newest READ_AHEAD_KEPT pods' next creates read what a fresh
    plan decides, and no more pods are kept read ahead than that. Each new pod is read alone, the
    others carried over it, and a create in the oldest kept takes what was carried."""
    m = OneContainer()
    m.plan()
    before = m.policy._cached
    reads: list[str] = []
    read = m.policy._before_create
    m.policy._before_create = lambda pod, cid: reads.append(pod.sandbox_id) or read(pod, cid)  # type: ignore[method-assign]
    for _ in range(READ_AHEAD_KEPT + 2):
        m.run_pod("plain", CGROUPS[2])
        # the new pod alone, then all again (`run_pod` checks what was carried)
        assert reads[0] == m.pods[-1] and len(reads) == 1 + len(m.policy._prepared[3])
        reads.clear()
    assert m.policy._cached is before  # no plan was made
    newest = m.pods[-READ_AHEAD_KEPT:]
    assert list(m.policy._prepared[3]) == newest[::-1]  # the newest first
    for sid in newest:
        pod = m.state.pod(sid)
        assert pod is not None and m.policy.before_create(pod, f"pending/{sid}/x/0") is not None
    m.hooked_create_in(newest[0], "x")  # checked against a fresh plan
    m.state.rename_container(f"pending/{newest[0]}/x/0", "ctr-x")
    assert m.policy.renamed(f"pending/{newest[0]}/x/0")  # it took what was read ahead and carried


def test_another_sandbox_of_an_exclusive_pod_has_its_overlaps() -> None:
    """A second sandbox of a pod with an exclusive container (the first still there, its labels
    since changed): a create in it is told the pod's overlaps, as the whole plan tells them, both
    when its decision was read ahead and when it is folded from the last plan (`decide_one`)."""
    for read_ahead in (True, False):
        m = OneContainer()
        m.run_pod("LSE", CGROUPS[0])
        first = m.pods[-1]
        m.state.put_container(ContainerRecord(f"pending/{first}/c/0", first, "c"))
        m.run_pod("plain", CGROUPS[0], name=first)
        second = m.pods[-1]
        m.kubelet_create_in(second)
        m.state.observe_container(f"ctr{m.n}", "0-7", "cgroup", 1.0)  # on the exclusive CPUs
        if read_ahead:
            m.plan_and_prepare_now([second])
        m.kubelet_create_in(second)  # checked against a fresh plan: the overlap is the pod's problem
