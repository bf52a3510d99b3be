"""Node topology ("Inputs" in cpuset-rules.md): online CPUs, NUMA nodes, sockets. A pure value.

Reading it from sysfs lives in `cri_proxy.sysfs`; reading it from a snapshot in `snapshot.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from cri_proxy.cpu.cpuset import EMPTY, CPUSet


def _frozen(d: Mapping[int, CPUSet]) -> Mapping[int, CPUSet]:
    return MappingProxyType(dict(sorted(d.items())))


@dataclass(frozen=True)
class Topology:
    """Online CPUs and which of them sit on each NUMA node and socket."""

    online: CPUSet
    numa_nodes: Mapping[int, CPUSet] = field(default_factory=dict)
    sockets: Mapping[int, CPUSet] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        numa_nodes: Mapping[int, CPUSet],
        sockets: Mapping[int, CPUSet] | None = None,
        online: CPUSet | None = None,
    ) -> Topology:
        """Online = union of the nodes unless given; no sockets given = one socket per node."""
        if online is None:
            online = EMPTY.union(*numa_nodes.values())
        if sockets is None:
            sockets = numa_nodes
        return cls(online=online, numa_nodes=_frozen(numa_nodes), sockets=_frozen(sockets))

    @classmethod
    def single_node(cls, online: CPUSet) -> Topology:
        """A machine without NUMA information: node 0 and socket 0 hold every online CPU."""
        return cls.build({0: online}, {0: online}, online)

    def only(self, cpus: CPUSet) -> Topology:
        """The same topology with only `cpus` online (and on their nodes and sockets)."""
        if cpus >= self.online:
            return self
        return Topology(
            online=self.online & cpus,
            numa_nodes=_frozen({n: c & cpus for n, c in self.numa_nodes.items()}),
            sockets=_frozen({s: c & cpus for s, c in self.sockets.items()}),
        )

    def cpus_of(self, nodes: Iterable[int] = (), sockets: Iterable[int] = ()) -> CPUSet:
        """CPUs on any of the given NUMA nodes or sockets; ids the node lacks add nothing."""
        mask = 0
        for n in nodes:
            cpus = self.numa_nodes.get(n)
            if cpus is not None:
                mask |= cpus.mask
        for s in sockets:
            cpus = self.sockets.get(s)
            if cpus is not None:
                mask |= cpus.mask
        return CPUSet(mask)
