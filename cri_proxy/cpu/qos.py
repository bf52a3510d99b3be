"""QoS classification ("QoS classification" in cpuset-rules.md): label, allocation, cgroup, kubelet."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from cri_proxy.cpu.allocation import Allocation
from cri_proxy.cpu.cgroup import CgroupParent, KubeQoS
from cri_proxy.cpu.cpuset import CPUSet
from cri_proxy.cpu.keys import QOS_LABEL


class QoS(StrEnum):
    """What decides a container's CPUs. KUBELET: follow kubelet's static CPU manager."""

    LSE = "LSE"
    LSR = "LSR"
    LS = "LS"
    BE = "BE"
    SYSTEM = "SYSTEM"
    KUBELET = "KUBELET"


LABEL_CLASSES = frozenset({QoS.LSE, QoS.LSR, QoS.LS, QoS.BE, QoS.SYSTEM})
"""Classes a pod label may name (KUBELET is never a label value)."""

EXCLUSIVE_CLASSES = frozenset({QoS.LSE, QoS.LSR})
"""Classes whose allocation cpuset is carved out of the share pools."""


def label_qos(labels: Mapping[str, str]) -> QoS | None:
    """The Koordinator class a pod's label names; anything else (or no label) is None."""
    value = labels.get(QOS_LABEL)
    if value is None:
        return None
    try:
        qos = QoS(value)
    except ValueError:
        return None
    return qos if qos in LABEL_CLASSES else None


def classify(
    label: QoS | None,
    allocation: Allocation | None,
    cgroup: CgroupParent | None,
    kubelet_cpus: CPUSet | None = None,
) -> QoS | None:
    """A container's class, first match wins; None means not managed (pass unchanged).

    `kubelet_cpus` is the container's entry in a *static* kubelet state (None without one);
    it only matters for Guaranteed pods, which makes the class a per-container answer.
    """
    if label is not None:
        return label
    if allocation is not None and allocation.cpuset:
        return QoS.LSR
    if cgroup is None:
        return None
    if cgroup.qos is KubeQoS.BESTEFFORT:
        return QoS.BE
    if cgroup.qos is KubeQoS.GUARANTEED and kubelet_cpus:
        return QoS.KUBELET
    return QoS.LS
