"""The CPUs pods can be given, looked at every few seconds: a CPU taken offline or brought back
changes the decisions, and the running containers follow.

CPUs go offline under a running node: an operator (`echo 0 > .../cpuN/online`), the kernel's
handling of a core that reports machine checks (mcelog, rasdaemon), a VM's vCPU unplugged. Under
cgroup v1 a cpuset naming an offline CPU cannot be written (EINVAL: runc cannot create the
container), and the kernel takes the CPU out of every cpuset for good: back online, it is in no
pod cgroup until something writes it there, and a cpuset naming it cannot be written below them
(EACCES). So the CPUs decisions are made over are the online ones that the cgroups above the
pods hold (`CgroupReader.pod_root_cpus`; every online one under v2). When they change, the
topology is read again and handed over (`changed`): every decision is made over it, and the
reconciler moves the containers. An unreadable `cpu/online` leaves the topology in force as it
is, said once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from cri_proxy.cpu import CPUSet, Problem, ProblemKind
from cri_proxy.cpu.topology import Topology
from cri_proxy.errors import SysfsError
from cri_proxy.sysfs import read_online, read_topology

EVERY = 5.0  # seconds between looks (cpu/online and a few cgroup files)


@dataclass(frozen=True)
class Seen:
    """What one look found: the online CPUs and what the pod cgroups hold (by cgroup)."""

    online: CPUSet
    held: Mapping[str, CPUSet]

    @property
    def usable(self) -> CPUSet:
        cpus = self.online
        for held in self.held.values():
            cpus = cpus & held
        return cpus

    def left_out(self) -> str | None:
        """The online CPUs pods cannot be given, and which cgroups lack them; None when none."""
        out = self.online - self.usable
        if not out:
            return None
        short = ", ".join(f"{path} has {cpus}" for path, cpus in self.held.items() if out - cpus)
        return (
            f"CPUs {out} are online but not in the pod cgroups' cpuset.cpus ({short}): under cgroup v1"
            " a container cannot be put on CPUs its parents lack (and v1 takes a CPU that goes offline"
            " out of every cpuset for good); pods are given the others until those cgroups hold them"
        )


def _problem(left_out: str | None) -> Problem | None:
    return Problem(None, ProblemKind.CPUS_LEFT_OUT, left_out) if left_out is not None else None


def usable_topology(root: Path | str, seen: Seen) -> Topology:
    """The sysfs topology cut to the CPUs pods can be given."""
    return read_topology(root).only(seen.usable)


class TopologyWatch:
    """`look()` every `every` seconds; `changed(topology)` when what it sees changed (the CPUs pods
    can be given, or only which are left out: `problem` then changes); `problem` is a node-wide
    `cpus-left-out` while online CPUs are left out."""

    def __init__(
        self,
        root: Path | str,
        seen: Seen,
        topology: Topology,
        held: Callable[[list[str]], Mapping[str, CPUSet]],
        changed: Callable[[Topology], None],
        parents: Callable[[], list[str]] = list,
        every: float = EVERY,
    ) -> None:
        self.root = root
        self.seen = seen  # as of the topology in force
        self.topology = topology  # the one in force: the sysfs topology cut to `seen.usable`
        self.held = held  # the pod cgroups' sets, given the pods' cgroup parents (read in a thread)
        self.parents = parents  # the pods' cgroup parents, read on the loop
        self.changed = changed
        self.every = every
        self.trouble: str | None = None  # the last fault said, until the file reads again
        # read by every decision (`Policy.inputs`): made when what was seen changes, not there
        self.problem = _problem(seen.left_out())

    async def look(self) -> bool:
        """Read `cpu/online` and the pod cgroups' sets; when the CPUs pods can be given changed,
        the topology again. `changed` is told whenever what was seen changed; True then."""
        before = self.seen
        try:
            online = await asyncio.to_thread(read_online, self.root)
            if not online:
                raise SysfsError(f"{Path(self.root) / 'devices/system/cpu/online'}: no CPU online")
            seen = Seen(online, await asyncio.to_thread(self.held, self.parents()))
            topology = None
            if seen.usable != before.usable:
                topology = await asyncio.to_thread(usable_topology, self.root, seen)
        except SysfsError as exc:
            if str(exc) != self.trouble:
                logger.warning("CPU topology not read again (the one in force stays): {}", exc)
                self.trouble = str(exc)
            return False
        if self.trouble is not None:
            logger.info("CPU topology readable again")
            self.trouble = None
        if seen == before:
            return False
        self.seen = seen
        gone, back = before.online - seen.online, seen.online - before.online
        if gone:
            logger.warning("CPUs {} went offline (online now {})", gone, seen.online)
        if back:
            logger.info("CPUs {} came online (online now {})", back, seen.online)
        left_out, was = seen.left_out(), self.problem
        if left_out is not None and (was is None or left_out != was.message):
            logger.warning("{}", left_out)
        elif left_out is None and was is not None:
            logger.info("the pod cgroups hold every online CPU again")
        self.problem = _problem(left_out)
        if topology is not None:
            logger.info(
                "pods are given CPUs {} now (were {}): decisions made again, containers updated",
                seen.usable,
                before.usable,
            )
            self.topology = topology
        self.changed(self.topology)
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            await self.look()
