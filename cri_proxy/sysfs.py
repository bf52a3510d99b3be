"""Read the node's CPU topology from sysfs (the I/O half; `cri_proxy.cpu.topology` is the value).

The root is configurable so tests can build a fake tree. Files read:
`<root>/devices/system/cpu/online` (and `present`), `<root>/devices/system/node/node<N>/cpulist`,
`<root>/devices/system/cpu/cpu<N>/topology/physical_package_id`.
"""

from __future__ import annotations

import re
from pathlib import Path

from cri_proxy.cpu.cpuset import CPUSet
from cri_proxy.cpu.topology import Topology
from cri_proxy.errors import CpuError, SysfsError
from cri_proxy.files import read_small, text_of

DEFAULT_ROOT = Path("/sys")
_NODE_DIR = re.compile(r"node(\d+)", re.ASCII)


MAX_BYTES = 64 * 1024
"""A CPU list of a 4,096-CPU machine is far shorter; a tree built by hand may hold anything."""


def _read(path: Path) -> str:
    """Bounded and never blocking (a test's tree may hold a FIFO or /dev/zero in its place)."""
    try:
        return text_of(read_small(path, MAX_BYTES), path)
    except OSError as e:
        raise SysfsError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise SysfsError(f"cannot read {e}") from None


def _cpulist(path: Path) -> CPUSet:
    try:
        return CPUSet.parse(_read(path).strip())
    except CpuError as e:
        raise SysfsError(f"{path}: {e}") from None


def read_online(root: Path | str = DEFAULT_ROOT) -> CPUSet:
    """The online CPUs alone: what `TopologyWatch` looks at every few seconds."""
    return _cpulist(Path(root) / "devices" / "system" / "cpu" / "online")


def read_present(root: Path | str = DEFAULT_ROOT) -> CPUSet | None:
    """The CPUs this node has, online or not (`cpu/present`); None where the tree has no such file."""
    path = Path(root) / "devices" / "system" / "cpu" / "present"
    return _cpulist(path) if path.exists() else None


def read_topology(root: Path | str = DEFAULT_ROOT) -> Topology:
    """Online CPUs, NUMA nodes (one node 0 when sysfs has none) and sockets.

    Node lists are cut to the online CPUs. A CPU without a readable `physical_package_id`
    (offline, or a restricted container) belongs to no socket; when no CPU has one, the
    sockets mirror the NUMA nodes, as in a snapshot without `sockets`.
    """
    base = Path(root) / "devices" / "system"
    online = read_online(root)
    nodes: dict[int, CPUSet] = {}
    node_root = base / "node"
    if node_root.is_dir():
        for entry in node_root.iterdir():
            m = _NODE_DIR.fullmatch(entry.name)
            if m is not None and (entry / "cpulist").is_file():
                nodes[int(m.group(1))] = _cpulist(entry / "cpulist") & online
    if not nodes:
        nodes = {0: online}
    socket_masks: dict[int, int] = {}
    for cpu in online:
        path = base / "cpu" / f"cpu{cpu}" / "topology" / "physical_package_id"
        try:
            text = _read(path).strip()
        except SysfsError:
            continue
        try:
            package = int(text)
        except ValueError:
            raise SysfsError(f"{path}: not an integer: {text!r}") from None
        socket_masks[package] = socket_masks.get(package, 0) | 1 << cpu
    sockets = {s: CPUSet(m) for s, m in socket_masks.items()} if socket_masks else None
    return Topology.build(nodes, sockets, online)
