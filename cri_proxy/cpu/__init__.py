"""The CPU rules of cpuset-rules.md: pure values and functions, no I/O, shared by proxy and `plan`.

One module per section of the spec: `cpuset` (CPU lists), `topology`, `keys`, `allocation`,
`cgroup`, `kubelet`, `qos` (classification), `pools`, `decide` (decision per container),
`problems`, plus `inputs` (the normalised inputs) and `snapshot` (the `plan` JSON format).
"""

from __future__ import annotations

from cri_proxy.cpu.allocation import Allocation, allocation_from_annotations, parse_allocation
from cri_proxy.cpu.cgroup import CgroupParent, KubeQoS, parse_cgroup_parent
from cri_proxy.cpu.cpuset import EMPTY, MAX_CPU, CPUSet
from cri_proxy.cpu.decide import ContainerDecision, Plan, decide
from cri_proxy.cpu.inputs import ContainerInfo, NodeInputs, PodInfo
from cri_proxy.cpu.kubelet import KubeletState, parse_kubelet_state, parse_kubelet_state_text
from cri_proxy.cpu.pools import Pools
from cri_proxy.cpu.problems import Problem, ProblemKind
from cri_proxy.cpu.qos import QoS, classify, label_qos
from cri_proxy.cpu.snapshot import inputs_from_snapshot, inputs_to_snapshot, load_snapshot, plan_to_json
from cri_proxy.cpu.topology import Topology

__all__ = [
    "EMPTY",
    "MAX_CPU",
    "Allocation",
    "CPUSet",
    "CgroupParent",
    "ContainerDecision",
    "ContainerInfo",
    "KubeQoS",
    "KubeletState",
    "NodeInputs",
    "Plan",
    "PodInfo",
    "Pools",
    "Problem",
    "ProblemKind",
    "QoS",
    "Topology",
    "allocation_from_annotations",
    "classify",
    "decide",
    "inputs_from_snapshot",
    "inputs_to_snapshot",
    "label_qos",
    "load_snapshot",
    "parse_allocation",
    "parse_cgroup_parent",
    "parse_kubelet_state",
    "parse_kubelet_state_text",
    "plan_to_json",
]
