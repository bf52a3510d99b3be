"""The node's online CPUs, looked at every few seconds: a CPU taken offline or brought back changes
the decisions, and the running containers follow.

CPUs go offline under a running node: an operator (`echo 0 > .../cpuN/online`), the kernel's
handling of a core that reports machine checks (mcelog, rasdaemon), a VM's vCPU unplugged. A
cpuset that names an offline CPU cannot be written under cgroup v1 (EINVAL: runc cannot create
the container), and a CPU brought back is in no container's cpuset until something writes it
(v1 drops it from every cpuset for good). So when `cpu/online` changes, the whole topology is read
again and handed over (`changed`): every decision is made over it, and the reconciler moves the
containers. An unreadable file leaves the topology in force as it is, said once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from loguru import logger

from cri_proxy.cpu.topology import Topology
from cri_proxy.errors import SysfsError
from cri_proxy.sysfs import read_online, read_topology

EVERY = 5.0  # seconds between looks at cpu/online (one small file)


class TopologyWatch:
    def __init__(
        self,
        root: Path | str,
        current: Callable[[], Topology],
        changed: Callable[[Topology], None],
        every: float = EVERY,
    ) -> None:
        self.root = root
        self.current = current
        self.changed = changed
        self.every = every
        self.trouble: str | None = None  # the last fault said, until the file reads again

    async def look(self) -> bool:
        """Read `cpu/online`; on a change, the topology again, handed to `changed`. True then."""
        before = self.current().online
        try:
            online = await asyncio.to_thread(read_online, self.root)
            if online == before:
                topology = None
            elif not online:
                raise SysfsError(f"{Path(self.root) / 'devices/system/cpu/online'}: no CPU online")
            else:
                topology = await asyncio.to_thread(read_topology, self.root)
        except SysfsError as exc:
            if str(exc) != self.trouble:
                logger.warning("CPU topology not read again (the one in force stays): {}", exc)
                self.trouble = str(exc)
            return False
        if self.trouble is not None:
            logger.info("CPU topology readable again")
            self.trouble = None
        if topology is None:
            return False
        gone, back = before - topology.online, topology.online - before
        if gone:
            logger.warning(
                "CPUs {} went offline (online now {}): decisions made again, containers moved off them",
                gone,
                topology.online,
            )
        if back:
            logger.info(
                "CPUs {} came online (online now {}): decisions made again, the pools take them",
                back,
                topology.online,
            )
        self.changed(topology)
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            await self.look()
