"""The merge of the runtime's listing into the node state: cases by name, then any interleaving.

The property: whatever order runtime listings, CRI events (create, start, stop, remove, pod
sandboxes), changes behind the proxy's back and proxy restarts (from a checkpoint of any age) come
in, a container created through the proxy is never lost while the runtime has it, one removed
through it never comes back, and once the calls are answered one more listing leaves the state
holding exactly the runtime's pods and containers, in the runtime's states, nothing pending.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cri_proxy.config import Config
from cri_proxy.cpu import ContainerInfo, CPUSet, NodeInputs, Topology, decide
from cri_proxy.cpu.decide import DecideMemo
from cri_proxy.cpu.keys import QOS_LABEL, RESOURCE_STATUS_ANNOTATION
from cri_proxy.enforce.policy import Policy
from cri_proxy.enforce.reconciler import Reconciler
from cri_proxy.state.merge import Known, Listing, merge
from cri_proxy.state.model import LIVE_STATES, ContainerRecord, ContainerState, NodeState, PodRecord

TOPOLOGY = Topology.single_node(CPUSet.parse("0-7"))
R, C, X, P = ContainerState.RUNNING, ContainerState.CREATED, ContainerState.EXITED, ContainerState.PENDING


def pod(sid: str, *, ready: bool = True, parent: str = "/kubepods/pod1", **kw: object) -> PodRecord:
    return PodRecord(sid, f"uid-{sid}", sid, "default", parent, ready=ready, **kw)  # type: ignore[arg-type]


def ctr(
    cid: str, sid: str = "s1", name: str = "", state: ContainerState = R, **kw: object
) -> ContainerRecord:
    return ContainerRecord(cid, sid, name or cid, state=state, **kw)  # type: ignore[arg-type]


def listing(pods: list[PodRecord], containers: list[ContainerRecord], started: int = 0) -> Listing:
    return Listing({p.sandbox_id: p for p in pods}, {c.id: c for c in containers}, started)


def known(pods: list[PodRecord], containers: list[ContainerRecord], **kw: object) -> Known:
    return Known({p.sandbox_id: p for p in pods}, {c.id: c for c in containers}, **kw)  # type: ignore[arg-type]


def test_known_and_listed_is_refreshed_keeping_what_the_listing_does_not_say() -> None:
    old = ctr("a", resources=b"\x10\x01", applied="0-3", actual_cpuset="0-3", actual_source="cgroup")
    out = merge(
        known([pod("s1", api_version="v1alpha2")], [old]),
        listing([pod("s1", parent="", labels={"k": "v"})], [ctr("a", state=X)]),
    )
    assert out.pods["s1"].cgroup_parent == "/kubepods/pod1" and out.pods["s1"].labels == {"k": "v"}
    assert out.pods["s1"].api_version == "v1alpha2"
    a = out.containers["a"]
    assert (a.state, a.resources, a.applied, a.actual_cpuset) == (X, b"\x10\x01", "0-3", "0-3")
    assert out.exited == ["a"] and out.changed


def test_unknown_is_adopted_unlisted_is_dropped_orphans_go_with_their_pod() -> None:
    out = merge(
        known([pod("s1"), pod("gone")], [ctr("a"), ctr("b", sid="gone"), ctr("c")]),
        listing([pod("s1"), pod("new")], [ctr("a"), ctr("d", sid="new"), ctr("e", sid="nowhere")]),
    )
    assert set(out.pods) == {"s1", "new"} and set(out.containers) == {"a", "d"}
    assert (out.adopted_pods, out.dropped_pods) == (["new"], ["gone"])
    assert (out.adopted, out.dropped) == (["d"], ["b", "c"])


def test_a_pending_record_is_resolved_into_the_listed_container_or_dropped() -> None:
    pending = ctr("pending/s1/app/0", name="app", state=P, resources=b"\x10\x02", api_version="v1alpha2")
    stale = ctr("pending/s1/gone/0", name="gone", state=P)
    out = merge(known([pod("s1")], [pending, stale]), listing([pod("s1")], [ctr("real", name="app")]))
    assert out.resolved == {"pending/s1/app/0": "real", "pending/s1/gone/0": None}
    assert set(out.containers) == {"real"}
    assert (out.containers["real"].resources, out.containers["real"].api_version) == (b"\x10\x02", "v1alpha2")


def test_a_pending_record_of_an_open_call_stays_until_answered() -> None:
    pending = ctr("pending/s1/app/0", name="app", state=P)
    out = merge(known([pod("s1")], [pending], in_flight=frozenset({pending.id})), listing([pod("s1")], []))
    assert set(out.containers) == {pending.id} and out.resolved == {}


def test_events_newer_than_the_listing_win() -> None:
    # created while listing ("new"), removed while listing ("old" listed, tombstone newer)
    out = merge(
        known([pod("s1")], [ctr("new")], touched={"new": 5, "old": 6, "s1": 1}),
        listing([pod("s1")], [ctr("old")], started=4),
    )
    assert set(out.containers) == {"new"} and out.adopted == [] and out.dropped == []


def test_merging_the_same_listing_twice_changes_nothing() -> None:
    state = NodeState()
    seen = listing([pod("s1")], [ctr("a"), ctr("b", state=X)])
    assert state.merge_listing(seen).changed
    generation = state.generation
    assert not state.merge_listing(seen).changed and state.generation == generation


# -- any interleaving ---------------------------------------------------------------------------


@dataclass
class Runtime:
    """The runtime's truth: sandboxes (ready or not) and containers."""

    pods: dict[str, bool] = field(default_factory=dict)
    containers: dict[str, tuple[str, str, int, ContainerState]] = field(default_factory=dict)

    def listing(self, started: int) -> Listing:
        return listing(
            [pod(sid, ready=ready) for sid, ready in self.pods.items()],
            [ctr(cid, sid, name, state, attempt=a) for cid, (sid, name, a, state) in self.containers.items()],
            started,
        )


@dataclass
class Call:
    """A CreateContainer through the proxy: pending put, maybe done at the runtime, not answered."""

    sid: str
    name: str
    created: str | None = None  # the container id once the runtime made it

    @property
    def pending_id(self) -> str:
        return f"pending/{self.sid}/{self.name}/0"


class Interleavings(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.runtime = Runtime()
        self.state = NodeState()
        self.ids = itertools.count()
        self.calls: list[Call] = []
        self.open_listing: Listing | None = None
        self.checkpoint: tuple[list[PodRecord], list[ContainerRecord]] = ([], [])
        self.answered: set[str] = set()  # created through this proxy process (its answer relayed)
        self.removed: set[str] = set()  # removed through the proxy
        self.memo = DecideMemo()
        self.reconciler = self._reconciler()

    def _reconciler(self) -> Reconciler:
        async def send(c: ContainerRecord, linux: bytes) -> None:
            raise AssertionError("nothing is sent here")

        return Reconciler(self.state, Policy(self.state, TOPOLOGY, Config), send, Config)

    def _new(self, prefix: str) -> str:
        return f"{prefix}{next(self.ids)}"

    def _ready_pods(self) -> list[str]:
        return sorted(sid for sid, ready in self.runtime.pods.items() if ready)

    # -- sandboxes ------------------------------------------------------------------------------
    @rule(through_proxy=st.booleans())
    def run_pod(self, through_proxy: bool) -> None:
        sid = self._new("s")
        self.runtime.pods[sid] = True
        if through_proxy:
            self.state.put_pod(pod(sid))

    @precondition(lambda self: self.runtime.pods)
    @rule(data=st.data(), through_proxy=st.booleans(), remove=st.booleans())
    def stop_or_remove_pod(self, data: st.DataObject, through_proxy: bool, remove: bool) -> None:
        sid = data.draw(st.sampled_from(sorted(self.runtime.pods)))
        if remove:
            del self.runtime.pods[sid]
            for cid in [cid for cid, c in self.runtime.containers.items() if c[0] == sid]:
                del self.runtime.containers[cid]
                if through_proxy:
                    self.removed.add(cid)
            if through_proxy:
                self.state.remove_pod(sid)
        else:
            self.runtime.pods[sid] = False
            for cid, (s, name, a, _) in list(self.runtime.containers.items()):
                if s == sid:
                    self.runtime.containers[cid] = (s, name, a, X)
            if through_proxy:
                self.state.stop_pod(sid)

    # -- containers -----------------------------------------------------------------------------
    @precondition(lambda self: self._ready_pods())
    @rule(data=st.data())
    def create_begins(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self._ready_pods()))
        call = Call(sid, self._new("app"))
        if self.state.pod(sid) is None:  # kubelet sends the sandbox config along: learnt from it
            self.state.put_pod(pod(sid))
        self.state.put_container(ctr(call.pending_id, sid, call.name, P))
        self.calls.append(call)

    @precondition(lambda self: any(c.created is None for c in self.calls))
    @rule(data=st.data())
    def runtime_creates(self, data: st.DataObject) -> None:
        call = data.draw(st.sampled_from([c for c in self.calls if c.created is None]))
        if call.sid in self.runtime.pods:
            call.created = self._new("c")
            self.runtime.containers[call.created] = (call.sid, call.name, 0, C)

    @precondition(lambda self: self.calls)
    @rule(data=st.data())
    def create_answered(self, data: st.DataObject) -> None:
        call = data.draw(st.sampled_from(self.calls))
        self.calls.remove(call)
        if call.created is None:  # the runtime refused: the hook's failure path
            self.state.remove_container(call.pending_id)
            return
        cid = call.created
        renamed = self.state.rename_container(call.pending_id, cid)
        if not renamed and self.state.container(cid) is None and self.state.pod(call.sid) is not None:
            self.state.put_container(ctr(cid, call.sid, call.name, C))  # as the hook does
        if cid in self.runtime.containers:
            self.answered.add(cid)

    @precondition(lambda self: self._ready_pods())
    @rule(data=st.data())
    def created_behind_the_proxys_back(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self._ready_pods()))
        self.runtime.containers[self._new("d")] = (sid, self._new("direct"), 0, R)

    @precondition(lambda self: self.runtime.containers)
    @rule(data=st.data(), action=st.sampled_from(["start", "stop", "exit", "remove", "remove-behind"]))
    def container_changes(self, data: st.DataObject, action: str) -> None:
        cid = data.draw(st.sampled_from(sorted(self.runtime.containers)))
        sid, name, attempt, now = self.runtime.containers[cid]
        if action in ("start", "stop", "remove") and any(c.created == cid for c in self.calls):
            return  # kubelet learns the id from CreateContainer's answer: nothing to call yet
        if action == "start" and now is C:
            self.runtime.containers[cid] = (sid, name, attempt, R)
            self.state.update_container(cid, state=R)
        elif action == "stop":
            self.runtime.containers[cid] = (sid, name, attempt, X)
            self.state.update_container(cid, state=X)
        elif action == "exit":
            self.runtime.containers[cid] = (sid, name, attempt, X)
        elif action == "remove":
            del self.runtime.containers[cid]
            self.state.remove_container(cid)
            self.removed.add(cid)
            self.answered.discard(cid)
        elif action == "remove-behind":
            del self.runtime.containers[cid]
            self.answered.discard(cid)

    # -- listings, checkpoints, restarts -------------------------------------------------------
    @precondition(lambda self: self.open_listing is None)
    @rule()
    def listing_begins(self) -> None:
        self.open_listing = self.runtime.listing(self.state.begin_listing())

    @precondition(lambda self: self.open_listing is not None)
    @rule()
    def listing_merged(self) -> None:
        assert self.open_listing is not None
        self.state.merge_listing(self.open_listing)
        self.open_listing = None

    @rule()
    def checkpoint_written(self) -> None:
        _, pods, containers = self.state.snapshot()
        self.checkpoint = (pods, containers)

    @rule()
    def proxy_killed_and_restarted(self) -> None:
        self.state = NodeState()
        self.state.replace_all(*self.checkpoint)
        self.reconciler = self._reconciler()
        self.calls.clear()  # kubelet's open calls died with the proxy (the runtime may have acted)
        self.open_listing = None
        self.answered.clear()
        self.removed.clear()

    @precondition(lambda self: self.runtime.pods)
    @rule(data=st.data(), qos=st.sampled_from(["LSE", "LSR", "LS", None]))
    def api_view_changes(self, data: st.DataObject, qos: str | None) -> None:
        uid = f"uid-{data.draw(st.sampled_from(sorted(self.runtime.pods)))}"
        if qos is None:
            self.state.forget_api_view(uid)
        else:
            # an LSE/LSR pod carves 0-3 out of the LS pool (LSR: not out of the BE pool)
            allocation = {RESOURCE_STATUS_ANNOTATION: '{"cpuset": "0-3"}'} if qos in ("LSE", "LSR") else {}
            self.state.set_api_view(uid, {QOS_LABEL: qos}, allocation)

    @precondition(lambda self: self.state.pods())
    @rule(data=st.data(), qos=st.sampled_from(["BE", "LS", "SYSTEM"]))
    def pod_relabelled(self, data: st.DataObject, qos: str) -> None:
        sid = data.draw(st.sampled_from(sorted(p.sandbox_id for p in self.state.pods())))
        self.state.put_pod(replace(self.state.pod(sid), labels={QOS_LABEL: qos}))  # type: ignore[type-var]

    @precondition(lambda self: self.state.containers())
    @rule(data=st.data(), applied=st.sampled_from(["0-7", "0-3", "", None]))
    def cpuset_applied(self, data: st.DataObject, applied: str | None) -> None:
        cid = data.draw(st.sampled_from(sorted(c.id for c in self.state.containers())))
        self.state.update_container(cid, applied=applied)

    # -- what must hold ------------------------------------------------------------------------
    @invariant()
    def a_pass_looks_at_what_changed_and_finds_all(self) -> None:
        """The reconciler's pass, looking only at what changed since its last one, finds what a
        pass over every container finds."""
        found = {(c.id, want) for c, want in self.reconciler.pending()}
        everything = {(c.id, want) for c, want in self._reconciler().pending(everything=True)}
        assert found == everything

    @invariant()
    def the_rules_view_follows_every_change(self) -> None:
        """The PodInfos the state keeps per pod are what its records say now, and a plan decided
        with the memo of the earlier ones is the plan decided afresh."""
        containers = self.state.containers()
        views, sourced = self.state.api_views(), self.state.api_sourced()
        fresh = []
        for p in self.state.pods():
            if not p.ready:
                continue
            labels = dict(p.labels)
            if "QoS label" in sourced.get(p.key, ""):  # the API view's label won
                labels = {k: v for k, v in labels.items() if k != QOS_LABEL} | dict(views[p.uid].labels)
            live = [
                ContainerInfo(c.id, c.name)
                for c in containers
                if c.sandbox_id == p.sandbox_id and c.state in LIVE_STATES
            ]
            fresh.append((p.uid, p.name, p.cgroup_parent, labels, tuple(live)))
        kept = self.state.pod_infos()
        assert [(i.uid, i.name, i.cgroup_parent, dict(i.labels), i.containers) for i in kept] == fresh
        inputs = NodeInputs(TOPOLOGY, pods=kept)
        assert decide(inputs, self.memo) == decide(inputs)

    @invariant()
    def never_lost_never_back(self) -> None:
        have = {c.id for c in self.state.containers()}
        lost = {cid for cid in self.answered if cid in self.runtime.containers} - have
        assert not lost, f"containers created through the proxy lost: {lost}"
        back = self.removed & have
        assert not back, f"containers removed through the proxy came back: {back}"

    @invariant()
    def open_calls_keep_their_place(self) -> None:
        """A CreateContainer not answered yet keeps its pending record (its CPUs count) until the
        container it made is known (while its sandbox exists, and while the runtime still has that
        container: one removed at the runtime behind the proxy's back is rightly forgotten by the
        next listing, call answered or not)."""
        for call in self.calls:
            if call.sid not in self.runtime.pods:
                continue
            if call.created is not None and call.created not in self.runtime.containers:
                continue
            assert self.state.container(call.pending_id) is not None or (
                call.created is not None and self.state.container(call.created) is not None
            ), f"pending record of an open call dropped: {call}"

    def teardown(self) -> None:
        """Every call answered, any listing in progress merged, then one more: the runtime's set."""
        for call in list(self.calls):
            self.calls.remove(call)
            if call.created is None:
                self.state.remove_container(call.pending_id)
            elif (
                not self.state.rename_container(call.pending_id, call.created)
                and self.state.container(call.created) is None
                and self.state.pod(call.sid) is not None
            ):
                self.state.put_container(ctr(call.created, call.sid, call.name, C))
        if self.open_listing is not None:
            self.state.merge_listing(self.open_listing)
        self.state.merge_listing(self.runtime.listing(self.state.begin_listing()))
        assert {p.sandbox_id: p.ready for p in self.state.pods()} == self.runtime.pods
        assert {c.id: c.state for c in self.state.containers()} == {
            cid: state for cid, (_, _, _, state) in self.runtime.containers.items()
        }
        assert not any(c.state is P for c in self.state.containers())


Interleavings.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_any_interleaving_ends_in_the_runtimes_set = Interleavings.TestCase


def test_a_pending_record_whose_answer_never_comes_goes_after_the_grace() -> None:
    state = NodeState()
    state.put_pod(pod("s1"))
    state.put_container(ctr("pending/s1/app/0", name="app", state=P))
    empty = listing([pod("s1")], [], started=state.generation)
    assert state.container("pending/s1/app/0") is not None
    state.merge_listing(empty, pending_grace=3600)
    assert state.container("pending/s1/app/0") is not None  # still an open call
    out = state.merge_listing(empty, pending_grace=0)
    assert out.resolved == {"pending/s1/app/0": None} and state.containers() == []


def test_nothing_is_remembered_between_listings() -> None:
    """Stamps and tombstones are kept only while a listing is open: no growth without listings."""
    state = NodeState()
    for i in range(100):
        state.put_pod(pod(f"s{i}"))
        state.remove_pod(f"s{i}")
    assert state.stamps() == {}
    started = state.begin_listing()
    state.remove_container("gone")
    assert state.stamps() == {"gone": state.generation}
    state.merge_listing(listing([], [ctr("gone")], started))
    assert state.containers() == [] and state.stamps() == {}
