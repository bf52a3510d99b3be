"""The rules' view the node state keeps (`NodeState.pod_infos`, `pod_problems`, `api_sourced`):
patched in place as pods and containers change, it must always equal what a fresh reading of the
records gives. Hypothesis drives random sequences of every kind of change."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cri_proxy.cpu import ContainerInfo
from cri_proxy.cpu.keys import QOS_LABEL
from cri_proxy.state.model import LIVE_STATES, ContainerRecord, ContainerState, NodeState, PodRecord

STATES = [ContainerState.PENDING, ContainerState.CREATED, ContainerState.RUNNING, ContainerState.EXITED]


def pod(sid: str, ready: bool = True, label: str | None = None, problems: tuple[str, ...] = ()) -> PodRecord:
    labels = {QOS_LABEL: label} if label else {}
    return PodRecord(
        sid, f"uid-{sid}", sid, "ns", f"/kubepods/pod{sid}", labels, ready=ready, problems=problems
    )


class RulesView(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = NodeState()
        self.n = 0
        self.ever: list[str] = []  # sandbox ids ever used (a removed one may come back)

    def _sid(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(self.ever))

    @rule(ready=st.booleans(), bad=st.booleans())
    def new_pod(self, ready: bool, bad: bool) -> None:
        self.n += 1
        sid = f"s{self.n}"
        self.ever.append(sid)
        self.state.put_pod(pod(sid, ready, problems=("label not UTF-8",) if bad else ()))

    @precondition(lambda self: self.ever)
    @rule(data=st.data(), ready=st.booleans(), label=st.sampled_from([None, "LS", "BE"]), bad=st.booleans())
    def pod_put_again(self, data: st.DataObject, ready: bool, label: str | None, bad: bool) -> None:
        """The same sandbox again: relabelled, ready again, stopped, or back after its removal."""
        self.state.put_pod(pod(self._sid(data), ready, label, ("bad",) if bad else ()))

    @precondition(lambda self: self.ever)
    @rule(data=st.data(), remove=st.booleans())
    def stop_or_remove(self, data: st.DataObject, remove: bool) -> None:
        sid = self._sid(data)
        if remove:
            self.state.remove_pod(sid)
        else:
            self.state.stop_pod(sid)

    @precondition(lambda self: self.ever)
    @rule(data=st.data(), state=st.sampled_from(STATES))
    def container(self, data: st.DataObject, state: ContainerState) -> None:
        self.n += 1
        self.state.put_container(ContainerRecord(f"c{self.n}", self._sid(data), f"n{self.n}", state=state))

    @precondition(lambda self: self.state.containers())
    @rule(data=st.data(), state=st.sampled_from(STATES), rename=st.booleans())
    def container_changes(self, data: st.DataObject, state: ContainerState, rename: bool) -> None:
        c = data.draw(st.sampled_from(sorted(self.state.containers(), key=lambda c: c.id)))
        if rename:
            self.n += 1
            self.state.rename_container(c.id, f"c{self.n}", state)
        else:
            self.state.update_container(c.id, state=state)

    @precondition(lambda self: self.state.containers())
    @rule(data=st.data())
    def container_removed(self, data: st.DataObject) -> None:
        self.state.remove_container(data.draw(st.sampled_from(sorted(c.id for c in self.state.containers()))))

    @precondition(lambda self: self.ever)
    @rule(data=st.data(), label=st.sampled_from([None, "LS", "LSE"]))
    def api_view(self, data: st.DataObject, label: str | None) -> None:
        uid = f"uid-{self._sid(data)}"
        if label is None:
            self.state.forget_api_view(uid)
        else:
            self.state.set_api_view(uid, {QOS_LABEL: label}, {})

    @rule()
    def reloaded(self) -> None:
        """A checkpoint loaded: the same records, every view built again."""
        self.state.replace_all(self.state.pods(), self.state.containers())

    @invariant()
    def the_view_is_what_the_records_say(self) -> None:
        pods, containers = self.state.pods(), self.state.containers()
        views = self.state.api_views()
        fresh = []
        for p in pods:
            if not p.ready:
                continue
            live = tuple(
                ContainerInfo(c.id, c.name)
                for c in containers
                if c.sandbox_id == p.sandbox_id and c.state in LIVE_STATES
            )
            view = views.get(p.uid)
            fresh.append((p.uid, p.name, p.cgroup_parent, view, live))
        kept = self.state.pod_infos()
        assert [(i.uid, i.name, i.cgroup_parent, views.get(i.uid), i.containers) for i in kept] == fresh
        assert kept is self.state.pod_infos()  # nothing changed: the very same tuple
        assert self.state.pod_problems() == sorted((p.key, m) for p in pods if p.ready for m in p.problems)


RulesView.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_rules_view = RulesView.TestCase
