"""Share pools ("Pools" in cpuset-rules.md): what is left after the exclusive claims.

LS pool = online - reserved - lse - lsr - kubelet; BE pool = online - reserved - lse - kubelet
(BE may run on LSR CPUs, as in Koordinator).
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from cri_proxy.cpu.cpuset import CPUSet
from cri_proxy.cpu.kubelet import KubeletState


@dataclass(frozen=True, slots=True)
class Pools:
    """The two share pools, and the exclusive sets they were carved by (for explanations)."""

    ls: CPUSet
    be: CPUSet
    lse: CPUSet
    lsr: CPUSet
    kubelet: CPUSet


def kubelet_exclusive(
    state: KubeletState | None, skip_pod_uids: Set[str], skip_container_ids: Set[str]
) -> CPUSet:
    """Union of a static state's entries, minus pods whose CPUs the scheduler (or a label) decides.

    Entries of pods the node does not know (yet) count: kubelet has pinned those CPUs already.
    """
    if state is None or not state.static:
        return CPUSet()
    mask = 0
    for uid, per_pod in state.pod_entries.items():
        if uid not in skip_pod_uids:
            for cpus in per_pod.values():
                mask |= cpus.mask
    for cid, cpus in state.container_entries.items():
        if cid not in skip_container_ids:
            mask |= cpus.mask
    return CPUSet(mask)


def compute_pools(online: CPUSet, reserved: CPUSet, lse: CPUSet, lsr: CPUSet, kubelet: CPUSet) -> Pools:
    """Carve the share pools out of the online CPUs."""
    be = CPUSet(online.mask & ~(reserved.mask | lse.mask | kubelet.mask))
    ls = CPUSet(be.mask & ~lsr.mask)
    return Pools(ls=ls, be=be, lse=lse, lsr=lsr, kubelet=kubelet)
