"""QoS classification, first match wins: label, allocation cpuset, cgroup, kubelet entry."""

from __future__ import annotations

import pytest

from cri_proxy.cpu import Allocation, CgroupParent, CPUSet, KubeQoS, QoS, classify, label_qos
from cri_proxy.cpu.keys import QOS_LABEL

CPUS = Allocation(CPUSet.parse("1-2"))
EMPTY_CPUS = Allocation(CPUSet())
NUMA = Allocation(numa_nodes=frozenset({0}))
G = CgroupParent(KubeQoS.GUARANTEED, "u")
BU = CgroupParent(KubeQoS.BURSTABLE, "u")
BE = CgroupParent(KubeQoS.BESTEFFORT, "u")
K = CPUSet.parse("4-5")

CASES = {
    "label wins over cpuset": (QoS.LS, CPUS, BU, None, QoS.LS),
    "label wins over cgroup": (QoS.BE, None, G, K, QoS.BE),
    "label wins over unknown cgroup": (QoS.LSE, None, None, None, QoS.LSE),
    "cpuset without label is LSR": (None, CPUS, BE, None, QoS.LSR),
    "cpuset with unknown cgroup is LSR": (None, CPUS, None, None, QoS.LSR),
    "empty cpuset does not make LSR": (None, EMPTY_CPUS, BU, None, QoS.LS),
    "numa only does not make LSR": (None, NUMA, BE, None, QoS.BE),
    "besteffort is BE": (None, None, BE, None, QoS.BE),
    "burstable is LS": (None, None, BU, None, QoS.LS),
    "burstable ignores kubelet entry": (None, None, BU, K, QoS.LS),
    "guaranteed with kubelet entry": (None, None, G, K, QoS.KUBELET),
    "guaranteed with empty entry is LS": (None, None, G, CPUSet(), QoS.LS),
    "guaranteed without entry is LS": (None, None, G, None, QoS.LS),
    "unknown cgroup is not managed": (None, None, None, None, None),
}


@pytest.mark.parametrize(("label", "alloc", "cgroup", "kcpus", "expect"), CASES.values(), ids=CASES.keys())
def test_classify(
    label: QoS | None,
    alloc: Allocation | None,
    cgroup: CgroupParent | None,
    kcpus: CPUSet | None,
    expect: QoS | None,
) -> None:
    assert classify(label, alloc, cgroup, kcpus) == expect


LABELS = {
    "LSE": ("LSE", QoS.LSE),
    "LSR": ("LSR", QoS.LSR),
    "LS": ("LS", QoS.LS),
    "BE": ("BE", QoS.BE),
    "SYSTEM": ("SYSTEM", QoS.SYSTEM),
    "KUBELET is not a label": ("KUBELET", None),
    "lower case": ("ls", None),
    "empty": ("", None),
    "unknown": ("GOLD", None),
}


@pytest.mark.parametrize(("value", "expect"), LABELS.values(), ids=LABELS.keys())
def test_label_qos(value: str, expect: QoS | None) -> None:
    assert label_qos({QOS_LABEL: value}) == expect


def test_no_label() -> None:
    assert label_qos({"app": "x"}) is None
