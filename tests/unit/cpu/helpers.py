"""Small builders so each rule test reads like the spec's table rows."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from cri_proxy.cpu import (
    ContainerInfo,
    CPUSet,
    KubeletState,
    NodeInputs,
    PodInfo,
    Topology,
    parse_kubelet_state,
)
from cri_proxy.cpu.keys import QOS_LABEL, RESOURCE_STATUS_ANNOTATION

CGROUPS = {
    "burstable": "/kubepods/burstable/pod{uid}",
    "besteffort": "/kubepods/besteffort/pod{uid}",
    "guaranteed": "/kubepods/pod{uid}",
}


def pod(
    name: str,
    cgroup: str = "burstable",
    qos: str | None = None,
    alloc: Mapping[str, Any] | str | None = None,
    containers: Sequence[str] = ("main",),
    annotation: str = RESOURCE_STATUS_ANNOTATION,
) -> PodInfo:
    """A pod `default/<name>` with uid <name> and containers `<name>-<container>`."""
    annotations = {}
    if alloc is not None:
        annotations[annotation] = alloc if isinstance(alloc, str) else json.dumps(alloc)
    return PodInfo(
        uid=name,
        name=name,
        namespace="default",
        cgroup_parent=CGROUPS.get(cgroup, cgroup).format(uid=name),
        labels={QOS_LABEL: qos} if qos else {},
        annotations=annotations,
        containers=tuple(ContainerInfo(f"{name}-{c}", c) for c in containers),
    )


def topo(nodes: Mapping[int, str] | None = None, sockets: Mapping[int, str] | None = None) -> Topology:
    nodes = {0: "0-7", 1: "8-15"} if nodes is None else nodes
    return Topology.build(
        {n: CPUSet.parse(c) for n, c in nodes.items()},
        None if sockets is None else {s: CPUSet.parse(c) for s, c in sockets.items()},
    )


def node(
    *pods: PodInfo,
    nodes: Mapping[int, str] | None = None,
    sockets: Mapping[int, str] | None = None,
    reserved: str = "",
    system: str = "",
    kubelet: Mapping[str, Any] | KubeletState | None = None,
) -> NodeInputs:
    state = parse_kubelet_state(kubelet) if isinstance(kubelet, Mapping) else kubelet
    return NodeInputs(
        topology=topo(nodes, sockets),
        pods=pods,
        reserved=CPUSet.parse(reserved),
        system=CPUSet.parse(system),
        kubelet=state,
    )
