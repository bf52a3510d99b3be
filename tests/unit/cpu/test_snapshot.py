"""The snapshot format: shape errors name the key; a bad kubelet state is a problem, not an error."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from cri_proxy.cpu import decide, inputs_from_snapshot, inputs_to_snapshot, load_snapshot, plan_to_json
from cri_proxy.errors import SnapshotError

BASE: dict[str, Any] = {
    "topology": {"numa_nodes": {"0": "0-3", "1": "4-7"}, "sockets": {"0": "0-7"}},
    "reserved_cpus": "0",
    "system_cpus": "1",
    "kubelet_cpu_manager_state": {
        "policyName": "static",
        "defaultCpuSet": "0-5",
        "entries": {"g": {"c": "6-7"}},
    },
    "pods": [
        {
            "uid": "g",
            "name": "web",
            "namespace": "ns",
            "labels": {"a": "b"},
            "annotations": {"scheduling.koordinator.sh/resource-status": "{}"},
            "cgroup_parent": "/kubepods/podg",
            "containers": [{"id": "c1", "name": "c"}, {"id": "c2", "name": "d"}],
        }
    ],
}


def _with(path: str, value: Any) -> dict[str, Any]:
    """BASE with the value at a dotted path replaced (`...=DELETE` removes the key)."""
    snap = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    target: Any = snap
    for p in parents:
        target = target[int(p)] if isinstance(target, list) else target[p]
    if value is DELETE:
        del target[last]
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return snap


DELETE = object()

BAD: dict[str, tuple[str, Any, str]] = {
    "no topology": ("topology", DELETE, "topology: missing"),
    "topology not an object": ("topology", [], "topology: expected an object"),
    "no numa_nodes": ("topology.numa_nodes", DELETE, "topology.numa_nodes: missing"),
    "numa key not a number": ("topology.numa_nodes", {"a": "0"}, "topology.numa_nodes['a']"),
    "numa cpus bad": ("topology.numa_nodes", {"0": "0-"}, "topology.numa_nodes['0']"),
    "numa cpus not a string": ("topology.numa_nodes", {"0": [0]}, "topology.numa_nodes['0']"),
    "sockets not an object": ("topology.sockets", "0-7", "topology.sockets"),
    "reserved not a list": ("reserved_cpus", 3, "reserved_cpus"),
    "system bad": ("system_cpus", "x", "system_cpus"),
    "pods not a list": ("pods", {}, "pods: expected a list"),
    "pod not an object": ("pods.0", "web", "pods[0]: expected an object"),
    "pod without cgroup_parent": ("pods.0.cgroup_parent", DELETE, "pods[0].cgroup_parent: missing"),
    "pod cgroup_parent not a string": ("pods.0.cgroup_parent", 1, "pods[0].cgroup_parent: expected a string"),
    "pod without name": ("pods.0.name", DELETE, "pods[0].name: missing"),
    "pod without uid": ("pods.0.uid", DELETE, "pods[0].uid: missing"),
    "labels not strings": ("pods.0.labels", {"a": 1}, "pods[0].labels['a']"),
    "annotations not an object": ("pods.0.annotations", [], "pods[0].annotations"),
    "containers not a list": ("pods.0.containers", {}, "pods[0].containers"),
    "container without id": ("pods.0.containers.1", {"name": "d"}, "pods[0].containers[1].id: missing"),
    "container without name": ("pods.0.containers.0", {"id": "x"}, "pods[0].containers[0].name: missing"),
    "duplicate container id": ("pods.0.containers.1", {"id": "c1", "name": "d"}, "not unique"),
}


@pytest.mark.parametrize(("path", "value", "message"), BAD.values(), ids=BAD.keys())
def test_shape_errors_name_the_key(path: str, value: Any, message: str) -> None:
    with pytest.raises(SnapshotError) as info:
        inputs_from_snapshot(_with(path, value))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "text", ["", "{", "[]", "null", "1"], ids=["empty", "truncated", "list", "null", "number"]
)
def test_not_a_snapshot(text: str) -> None:
    with pytest.raises(SnapshotError):
        load_snapshot(text)


def test_optional_keys_have_defaults() -> None:
    inputs = load_snapshot('{"topology": {"numa_nodes": {"0": "0-3", "1": "4-7"}}}')
    assert inputs.pods == () and not inputs.reserved and not inputs.system and inputs.kubelet is None
    assert {s: str(c) for s, c in inputs.topology.sockets.items()} == {0: "0-3", 1: "4-7"}
    snap = _with("pods.0", {"uid": "u", "name": "n", "namespace": "d", "cgroup_parent": "/kubepods/podu"})
    assert load_snapshot(json.dumps(snap)).pods[0].containers == ()
    nulls = _with("reserved_cpus", None) | {"system_cpus": None, "kubelet_cpu_manager_state": None}
    assert not inputs_from_snapshot(nulls).reserved


def test_unknown_keys_are_ignored() -> None:
    inputs_from_snapshot(_with("future", {"x": 1}))


@pytest.mark.parametrize(
    "state",
    [[1], {"entries": {}}, {"policyName": "static", "entries": {"a": 1}}],
    ids=["list", "no policyName", "bad entry"],
)
def test_bad_kubelet_state_is_a_problem(state: Any) -> None:
    inputs = inputs_from_snapshot(_with("kubelet_cpu_manager_state", state))
    assert inputs.kubelet is None
    plan = decide(inputs)
    assert [(p.pod, str(p.kind)) for p in plan.problems] == [(None, "bad-kubelet-state")]
    assert plan.containers["c1"].qos == "LS"


def test_output_keys_are_the_interface() -> None:
    out = plan_to_json(decide(inputs_from_snapshot(BASE)))
    assert set(out) == {"pools", "containers", "problems"}
    assert out["pools"] == {"ls": "1-5", "be": "1-5"}  # system_cpus are not carved out, reserved is
    assert out["containers"]["c1"] == {
        "pod": "ns/web",
        "qos": "KUBELET",
        "cpuset_cpus": "6-7",
        "why": "kubelet static CPU manager entry",
    }
    assert set(out["containers"]["c2"]) == {"pod", "qos", "cpuset_cpus", "why"}
    json.dumps(out)


def test_snapshot_round_trip() -> None:
    inputs = inputs_from_snapshot(BASE)
    again = inputs_from_snapshot(json.loads(json.dumps(inputs_to_snapshot(inputs))))
    assert again == inputs
    assert plan_to_json(decide(again)) == plan_to_json(decide(inputs))
