"""The CPUs a container's cgroup really allows: its `cpuset.cpus`, cgroup v1 or v2.

The runtime's answer is not the cgroup's truth (containerd 1.6 can report a cpuset its cgroup never
got), so drift is judged against this file where the proxy can read it. The container's cgroup is
found from its pod's cgroup parent and its id, for both kubelet cgroup drivers:

- cgroupfs: `<parent>/<id>` (`/kubepods/burstable/pod<uid>/<id>`);
- systemd: the parent slice expanded (`kubepods-burstable-pod<uid>.slice` is
  `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`) and the runtime's
  scope in it (`cri-containerd-<id>.scope`, CRI-O `crio-<id>.scope`).

Under `root` (default `/sys/fs/cgroup`): the v1 cpuset hierarchy at `<root>/cpuset`, else a v2
unified hierarchy at `<root>` (or `<root>/unified`). A container without a cpuset of its own on v2
has an empty `cpuset.cpus`: its `cpuset.cpus.effective` is what it gets.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from cri_proxy.cpu import CPUSet
from cri_proxy.errors import CpuError

MAX_READ = 64 * 1024  # a cpuset list of 8,192 CPUs is far below this
SCOPE_PREFIXES = ("cri-containerd-", "crio-", "docker-")


def expand_slice(name: str) -> str:
    """A systemd slice name as its path: `a-b-c.slice` -> `a.slice/a-b.slice/a-b-c.slice`."""
    stem = name.removesuffix(".slice")
    parts = stem.split("-")
    return "/".join("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)) if parts[i])


def container_dirs(cgroup_parent: str, container_id: str) -> list[str]:
    """Where the container's cgroup may be, relative to a hierarchy's root, most likely first."""
    parent = cgroup_parent.strip("/")
    if not parent or not container_id or "/" in container_id or container_id in (".", ".."):
        return []
    if parent.endswith(".slice"):
        base = parent if "/" in parent else expand_slice(parent)
        return [f"{base}/{prefix}{container_id}.scope" for prefix in SCOPE_PREFIXES] + [
            f"{base}/{container_id}"
        ]
    return [f"{parent}/{container_id}"]


class CgroupReader:
    """Reads containers' cpusets under one cgroup root; finds the hierarchy on first use."""

    def __init__(self, root: str = "/sys/fs/cgroup") -> None:
        self.root = Path(root)
        self._hierarchy: tuple[Path, bool] | None = None  # (path, is v2)

    def hierarchy(self) -> tuple[Path, bool] | None:
        """(the cpuset hierarchy's root, True when cgroup v2); None when there is none."""
        if self._hierarchy is None:
            v1_root = self.root / "cpuset"
            if (v1_root / "cpuset.cpus").is_file():
                self._hierarchy = (v1_root, False)
            else:
                for candidate in (self.root, self.root / "unified"):
                    controllers = candidate / "cgroup.controllers"
                    try:
                        if "cpuset" in _read(controllers).split():
                            self._hierarchy = (candidate, True)
                            break
                    except OSError:
                        continue
        return self._hierarchy

    def read(self, cgroup_parent: str, container_id: str) -> str | None:
        """The container's cpuset from its cgroup, canonical; None when not found or unreadable."""
        found = self.hierarchy()
        if found is None:
            return None
        base, v2 = found
        for relative in container_dirs(cgroup_parent, container_id):
            directory = base / relative
            try:
                text = _read(directory / "cpuset.cpus").strip()
                if not text and v2:
                    text = _read(directory / "cpuset.cpus.effective").strip()
            except OSError:
                continue
            if not text:
                return None  # no CPUs: not a cgroup a task can run in (or not a cgroup file at all)
            try:
                return str(CPUSet.parse(text))
            except CpuError:
                return None
        return None

    def pod_root_cpus(self, cgroup_parents: Iterable[str] = ()) -> dict[str, CPUSet]:
        """cgroup v1: the `cpuset.cpus` of each cgroup above the pods that exists (`pod_roots`).

        A container's cpuset must lie within its parents' there (else EACCES: runc cannot create
        it), and v1 takes a CPU that went offline out of every cpuset for good: back online, it is
        in none of them until something writes it. Empty under v2 (a parent's set only narrows
        what a child gets, it never refuses a write) or where none can be read."""
        found = self.hierarchy()
        if found is None or found[1]:
            return {}
        base = found[0]
        out: dict[str, CPUSet] = {}
        for relative in pod_roots(cgroup_parents):
            try:
                cpus = CPUSet.parse(_read(base / relative / "cpuset.cpus").strip())
            except (OSError, CpuError):
                continue
            if cpus:  # an empty one holds no task: not set up, not a bound
                out[relative] = cpus
        return out


POD_ROOTS = (
    "kubepods",
    "kubepods/burstable",
    "kubepods/besteffort",
    "kubepods.slice",
    "kubepods.slice/kubepods-burstable.slice",
    "kubepods.slice/kubepods-besteffort.slice",
)
"""The kubelet's pod cgroups above the pods (its default `--cgroup-root`, both drivers)."""


def pod_roots(cgroup_parents: Iterable[str]) -> list[str]:
    """The cgroups above the pods: the kubelet's defaults and the first two levels of each pod's
    parent (a `--cgroup-root` of another name), relative to a hierarchy's root."""
    roots = dict.fromkeys(POD_ROOTS)
    for parent in cgroup_parents:
        parent = parent.strip("/")
        if parent.endswith(".slice") and "/" not in parent:
            parent = expand_slice(parent)
        levels = [p for p in parent.split("/") if p not in ("", ".", "..")][:3]
        for depth in (1, 2):
            if len(levels) > depth:  # a level above the pod's own
                roots.setdefault("/".join(levels[:depth]))
    return list(roots)


def _read(path: Path) -> str:
    """A small kernel file, bounded; never blocks on a FIFO (O_NONBLOCK)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return os.read(fd, MAX_READ).decode("ascii", errors="replace")
    finally:
        os.close(fd)
