"""Exclusivity holds or is reported: who else is on an LSE/LSR container's CPUs. Pure.

An exclusive container's CPUs are its decided cpuset; another container is on them when what it
really has (its cgroup as last read, else what was applied; none set means every online CPU)
meets them. The rules allow one such sharing: BE containers on LSR CPUs. Anything else — an LS
container the pool could not move (pool empty, the exclusive wait timed out), a container of
another pod claiming the same CPUs, one the proxy does not manage — is named, never silent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cri_proxy.cpu import CPUSet, Plan, Problem, ProblemKind, QoS
from cri_proxy.errors import CpuError
from cri_proxy.state.model import LIVE_STATES, UPDATABLE_STATES, ContainerRecord, PodRecord

EXCLUSIVE = frozenset({QoS.LSE, QoS.LSR})


@dataclass(frozen=True, slots=True)
class Overlap:
    """Container `pod`/`container` (exclusive, CPUs `cpus`) shares `shared` with `others`."""

    pod: str
    container: str
    cpus: CPUSet
    others: tuple[tuple[str, str, CPUSet], ...]  # (pod, container, CPUs of `cpus` it is on)

    def message(self) -> str:
        named = ", ".join(f"{pod} {name} (on {cpus})" for pod, name, cpus in self.others)
        return f"container {self.container} has CPUs {self.cpus} but shares them with {named}"


def real_cpus(c: ContainerRecord, online: CPUSet) -> CPUSet | None:
    """The CPUs `c` really runs on, as far as known; None when nothing is known."""
    text = c.actual_cpuset if c.actual_cpuset is not None else c.applied
    if text is None:
        return None
    if not text:
        return online
    try:
        return CPUSet.parse(text)
    except CpuError:
        return None


def overlaps(
    plan: Plan, pods: Mapping[str, PodRecord], containers: Iterable[ContainerRecord], online: CPUSet
) -> list[Overlap]:
    """Every live exclusive container whose CPUs others are still on, with those others named.
    (`Policy` asks only when the plan has exclusive containers: the common node has none.)"""
    items = list(containers)
    exclusive = []
    for c in items:
        d = plan.containers.get(c.id)
        pod = pods.get(c.sandbox_id)
        live = c.state in LIVE_STATES and pod is not None and pod.ready
        if live and pod is not None and d is not None and d.cpuset and d.qos in EXCLUSIVE:
            exclusive.append((c, pod, d.qos, d.cpuset))
    if not exclusive:
        return []
    running = []
    for c in items:
        pod = pods.get(c.sandbox_id)
        cpus = real_cpus(c, online) if c.state in UPDATABLE_STATES else None
        if pod is not None and pod.ready and cpus:
            d = plan.containers.get(c.id)
            running.append((c, pod, d.qos if d is not None else None, cpus))
    found = []
    for c, pod, qos, cpus in exclusive:
        others = []
        for o, opod, oqos, ocpus in running:
            shared = cpus & ocpus
            if o.id == c.id or not shared or o.sandbox_id == c.sandbox_id:
                continue
            if qos is QoS.LSR and oqos is QoS.BE:
                continue  # BE may run on LSR CPUs (cpuset-rules.md, Pools)
            others.append((opod.key, o.name, shared))
        if others:
            found.append(Overlap(pod.key, c.name, cpus, tuple(sorted(others, key=lambda t: (t[0], t[1])))))
    return sorted(found, key=lambda o: (o.pod, o.container))


def overlap_problems(found: Iterable[Overlap]) -> tuple[Problem, ...]:
    return tuple(Problem(o.pod, ProblemKind.EXCLUSIVE_OVERLAP, o.message()) for o in found)
