"""Kubernetes QoS from a pod's cgroup parent ("QoS classification", step 3, in cpuset-rules.md).

cgroupfs: `[/root]/kubepods[/besteffort|/burstable]/pod<uid>`.
systemd:  `/kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid_>.slice`, or just the
last slice name; a cgroup root `custom` becomes a `custom-` prefix on every slice name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class KubeQoS(StrEnum):
    """The Kubernetes QoS class of a pod, as its cgroup placement shows it."""

    GUARANTEED = "Guaranteed"
    BURSTABLE = "Burstable"
    BESTEFFORT = "BestEffort"


@dataclass(frozen=True, slots=True)
class CgroupParent:
    """What a pod cgroup path says: the Kubernetes QoS and the pod uid (dashes restored)."""

    qos: KubeQoS
    pod_uid: str


_TIER = {"besteffort": KubeQoS.BESTEFFORT, "burstable": KubeQoS.BURSTABLE}
_SYSTEMD_POD = re.compile(r"(?:.+-)?kubepods(?:-(besteffort|burstable))?-pod([^/]+)\.slice")


def parse_cgroup_parent(path: str) -> CgroupParent | None:
    """Parse a pod's cgroup parent; None when it is not a kubepods pod cgroup (not managed)."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        return None
    last = parts[-1]
    if last.endswith(".slice"):
        m = _SYSTEMD_POD.fullmatch(last)
        if m is None:
            return None
        qos = _TIER[m.group(1)] if m.group(1) else KubeQoS.GUARANTEED
        return CgroupParent(qos, m.group(2).replace("_", "-"))
    if not last.startswith("pod") or len(last) == 3 or len(parts) < 2:
        return None
    uid = last[3:]
    if parts[-2] == "kubepods":
        return CgroupParent(KubeQoS.GUARANTEED, uid)
    tier = _TIER.get(parts[-2])
    if tier is not None and len(parts) >= 3 and parts[-3] == "kubepods":
        return CgroupParent(tier, uid)
    return None
