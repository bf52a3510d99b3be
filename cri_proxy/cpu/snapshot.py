"""The `cri-proxy plan` snapshot (plan-snapshot.md): JSON in -> `NodeInputs`, `Plan` -> JSON out.

Shape errors raise `SnapshotError` naming the key (`pods[2].containers[0].id: ...`). The contents of
`kubelet_cpu_manager_state` are not a shape error: a bad one is a `bad-kubelet-state` problem,
as it is for the live proxy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cri_proxy.cpu.cpuset import EMPTY, CPUSet
from cri_proxy.cpu.decide import Plan
from cri_proxy.cpu.inputs import ContainerInfo, NodeInputs, PodInfo
from cri_proxy.cpu.kubelet import parse_kubelet_state
from cri_proxy.cpu.problems import Problem, ProblemKind
from cri_proxy.cpu.topology import Topology
from cri_proxy.errors import CpuError, KubeletStateError, SnapshotError


def _obj(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SnapshotError(f"{where}: expected an object, not {_kind(value)}")
    return value


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _str(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        problem = "missing" if key not in obj else f"expected a string, not {_kind(value)}"
        raise SnapshotError(f"{where}{key}: {problem}")
    return value


def _cpus(value: object, where: str) -> CPUSet:
    if value is None:
        return EMPTY
    if not isinstance(value, str):
        raise SnapshotError(f"{where}: expected a CPU list string, not {_kind(value)}")
    try:
        return CPUSet.parse(value)
    except CpuError as e:
        raise SnapshotError(f"{where}: {e}") from None


def _str_map(value: object, where: str) -> dict[str, str]:
    if value is None:
        return {}
    d = _obj(value, where)
    for k, v in d.items():
        if not isinstance(v, str):
            raise SnapshotError(f"{where}[{k!r}]: expected a string, not {_kind(v)}")
    return d


def _cpu_map(value: object, where: str) -> dict[int, CPUSet]:
    d = _obj(value, where)
    out: dict[int, CPUSet] = {}
    for k, v in d.items():
        if not (k.isascii() and k.isdigit()):
            raise SnapshotError(f"{where}[{k!r}]: key must be a non-negative integer")
        out[int(k)] = _cpus(v, f"{where}[{k!r}]")
    return out


def _topology(value: object) -> Topology:
    topo = _obj(value, "topology")
    if "numa_nodes" not in topo:
        raise SnapshotError("topology.numa_nodes: missing")
    nodes = _cpu_map(topo["numa_nodes"], "topology.numa_nodes")
    raw_sockets = topo.get("sockets")
    sockets = None if raw_sockets is None else _cpu_map(raw_sockets, "topology.sockets")
    return Topology.build(nodes, sockets)


def _pod(value: object, where: str, seen_ids: set[str]) -> PodInfo:
    pod = _obj(value, where)
    prefix = where + "."
    raw_containers = pod.get("containers")
    if raw_containers is None:
        raw_containers = []
    if not isinstance(raw_containers, list):
        raise SnapshotError(f"{prefix}containers: expected a list, not {_kind(raw_containers)}")
    containers = []
    for j, raw in enumerate(raw_containers):
        cwhere = f"{prefix}containers[{j}]"
        c = _obj(raw, cwhere)
        cid = _str(c, "id", cwhere + ".")
        if cid in seen_ids:
            raise SnapshotError(f"{cwhere}.id: {cid!r} is not unique in the snapshot")
        seen_ids.add(cid)
        containers.append(ContainerInfo(cid, _str(c, "name", cwhere + ".")))
    return PodInfo(
        uid=_str(pod, "uid", prefix),
        name=_str(pod, "name", prefix),
        namespace=_str(pod, "namespace", prefix),
        cgroup_parent=_str(pod, "cgroup_parent", prefix),
        labels=_str_map(pod.get("labels"), prefix + "labels"),
        annotations=_str_map(pod.get("annotations"), prefix + "annotations"),
        containers=tuple(containers),
    )


def inputs_from_snapshot(data: object) -> NodeInputs:
    """Validate a decoded snapshot and build the rules' inputs; `SnapshotError` names the bad key."""
    snap = _obj(data, "snapshot")
    if "topology" not in snap:
        raise SnapshotError("topology: missing")
    topology = _topology(snap["topology"])
    raw_pods = snap.get("pods")
    if raw_pods is None:
        raw_pods = []
    if not isinstance(raw_pods, list):
        raise SnapshotError(f"pods: expected a list, not {_kind(raw_pods)}")
    seen: set[str] = set()
    pods = tuple(_pod(p, f"pods[{i}]", seen) for i, p in enumerate(raw_pods))
    problems: tuple[Problem, ...] = ()
    kubelet = None
    raw_state = snap.get("kubelet_cpu_manager_state")
    if raw_state is not None:
        try:
            kubelet = parse_kubelet_state(raw_state)
        except KubeletStateError as e:
            problems = (
                Problem(
                    None, ProblemKind.BAD_KUBELET_STATE, f"kubelet_cpu_manager_state: {e}; treated as absent"
                ),
            )
    return NodeInputs(
        topology=topology,
        pods=pods,
        reserved=_cpus(snap.get("reserved_cpus"), "reserved_cpus"),
        system=_cpus(snap.get("system_cpus"), "system_cpus"),
        kubelet=kubelet,
        input_problems=problems,
    )


def load_snapshot(text: str | bytes) -> NodeInputs:
    """Parse snapshot text; not JSON or not of the shape is `SnapshotError` (one line)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise SnapshotError(f"not valid JSON: {e}") from None
    return inputs_from_snapshot(data)


def _opt(cpus: CPUSet | None) -> str | None:
    return None if cpus is None else str(cpus)


def _problem_json(p: Problem) -> dict[str, Any]:
    out: dict[str, Any] = {"pod": p.pod, "kind": str(p.kind), "message": p.message}
    if p.holders:  # an addition to the documented keys, only where there is something to say
        out["holders"] = list(p.holders)
    return out


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The documented output: pools, containers by id, problems (key names are an interface)."""
    return {
        "pools": {"ls": str(plan.pools.ls), "be": str(plan.pools.be)},
        "containers": {
            cid: {
                "pod": d.pod,
                "qos": None if d.qos is None else str(d.qos),
                "cpuset_cpus": _opt(d.cpuset),
                "why": d.why,
            }
            for cid, d in plan.containers.items()
        },
        "problems": [_problem_json(p) for p in plan.problems],
    }


def inputs_to_snapshot(inputs: NodeInputs) -> dict[str, Any]:
    """The snapshot of some inputs (what `ctl snapshot` will write); `load` of it gives them back."""
    topo = inputs.topology
    state: dict[str, Any] | None = None
    k = inputs.kubelet
    if k is not None:
        entries: dict[str, Any] = {cid: str(c) for cid, c in k.container_entries.items()}
        entries.update({uid: {n: str(c) for n, c in per.items()} for uid, per in k.pod_entries.items()})
        state = {"policyName": k.policy_name, "defaultCpuSet": str(k.default_cpuset), "entries": entries}
    return {
        "topology": {
            "numa_nodes": {str(n): str(c) for n, c in topo.numa_nodes.items()},
            "sockets": {str(s): str(c) for s, c in topo.sockets.items()},
        },
        "reserved_cpus": str(inputs.reserved),
        "system_cpus": str(inputs.system),
        "kubelet_cpu_manager_state": state,
        "pods": [
            {
                "uid": p.uid,
                "name": p.name,
                "namespace": p.namespace,
                "labels": dict(p.labels),
                "annotations": dict(p.annotations),
                "cgroup_parent": p.cgroup_parent,
                "containers": [{"id": c.id, "name": c.name} for c in p.containers],
            }
            for p in inputs.pods
        ],
    }
