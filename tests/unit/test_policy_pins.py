"""Policy.pins follows the state's change log (a create costs one look, not the node): after any
sequence of changes it equals a fresh reading of every container."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cri_proxy.config import Config
from cri_proxy.cpu import CPUSet, Topology
from cri_proxy.enforce.policy import Policy
from cri_proxy.state.model import LIVE_STATES, ContainerRecord, ContainerState, NodeState, PodRecord

TOPOLOGY = Topology.build({0: CPUSet.parse("0-7")})
IDS = ["c0", "c1"]
ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "pin", "unpin", "state", "remove", "rename", "pod-gone", "read"]),
        st.sampled_from(IDS),
        st.sampled_from(IDS),
        st.sampled_from(list(ContainerState)),
        st.sampled_from(["1", "2-3", "0,5"]),
    ),
    max_size=40,
)


def every_pin(state: NodeState) -> dict[str, CPUSet]:
    return {
        c.id: CPUSet.parse(c.pin) for c in state.containers() if c.pin is not None and c.state in LIVE_STATES
    }


@given(ops)
def test_pins_read_from_the_change_log_equal_a_full_reading(
    steps: list[tuple[str, str, str, ContainerState, str]],
) -> None:
    state = NodeState()
    state.put_pod(PodRecord("s", "p", "p", "team", "/kubepods/podp"))
    policy = Policy(state, TOPOLOGY, lambda: Config())
    for op, cid, other, new_state, cpus in steps:
        if op == "put":
            state.put_container(ContainerRecord(cid, "s", cid, state=ContainerState.RUNNING))
        elif op == "pin":
            state.update_container(cid, pin=cpus)
        elif op == "unpin":
            state.update_container(cid, pin=None)
        elif op == "state":
            state.update_container(cid, state=new_state)
        elif op == "remove":
            state.remove_container(cid)
        elif op == "rename" and state.container(other) is None:
            state.rename_container(cid, other)
        elif op == "pod-gone":
            state.remove_pod("s")
            state.put_pod(PodRecord("s", "p", "p", "team", "/kubepods/podp"))
        else:
            assert policy.pins == every_pin(state)
    assert policy.pins == every_pin(state)
