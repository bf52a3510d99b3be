"""A disk that stops answering, for real: an ext4 file system on a loop device, and a cgroup whose
processes' writes to that device are throttled to one byte a second once `stall()` is called. An
fsync there then waits in the kernel, uninterruptibly (no signal ends it), until `release()` lifts
the limit: what a volume that stopped answering does to a daemon writing its state.

cgroup v1 (`blkio.throttle.write_bps_device`) or v2 (`io.max`). Root only; `available()` says why
not when it cannot be made here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from pathlib import Path

V1 = Path("/sys/fs/cgroup/blkio")
V2 = Path("/sys/fs/cgroup")


def available() -> str:
    """ "" when a stalled disk can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root: mounts a loop device and throttles a cgroup"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not (V1 / "blkio.throttle.write_bps_device").exists() and "io" not in _v2_controllers():
        return "needs the blkio (cgroup v1) or io (cgroup v2) controller"
    if not Path("/dev/loop-control").exists():
        return "needs loop devices"
    return ""


def _v2_controllers() -> list[str]:
    try:
        return (V2 / "cgroup.controllers").read_text().split()
    except OSError:
        return []


class StalledDisk:
    """`mount` (a directory holding the file system) and `enter(pid)`; `stall()` / `release()`."""

    def __init__(self, where: Path, size_mib: int = 64) -> None:
        self.image = where / "disk.img"
        self.mount = where / "disk"
        self.device = ""
        self.v1 = (V1 / "blkio.throttle.write_bps_device").exists()
        self.cgroup = (V1 if self.v1 else V2) / f"cri-proxy-test-{uuid.uuid4().hex[:8]}"
        self.size_mib = size_mib

    def __enter__(self) -> StalledDisk:
        with self.image.open("wb") as f:
            f.truncate(self.size_mib << 20)
        self.device = _run("losetup", "--find", "--show", str(self.image)).strip()
        try:
            _run("mkfs.ext4", "-q", self.device)
            self.mount.mkdir()
            _run("mount", self.device, str(self.mount))
            if not self.v1:
                (V2 / "cgroup.subtree_control").write_text("+io")
            self.cgroup.mkdir()
        except BaseException:
            self.__exit__()
            raise
        return self

    def enter(self, pid: int) -> None:
        """Put process `pid` (all its threads) in the throttled cgroup."""
        (self.cgroup / "cgroup.procs").write_text(str(pid))

    def _limit(self, writes: bool, reads: bool) -> None:
        rdev = os.stat(self.device).st_rdev
        device = f"{os.major(rdev)}:{os.minor(rdev)}"
        if self.v1:
            for name, on in (("write", writes), ("read", reads)):
                (self.cgroup / f"blkio.throttle.{name}_bps_device").write_text(f"{device} {1 if on else 0}")
        else:
            limits = f"wbps={1 if writes else 'max'} rbps={1 if reads else 'max'}"
            (self.cgroup / "io.max").write_text(f"{device} {limits}")

    def stall(self, reads: bool = False) -> None:
        """Writes (and with `reads`, reads that miss the page cache: call `drop_caches()`) wait."""
        self._limit(True, reads)

    def release(self) -> None:
        self._limit(False, False)

    def drop_caches(self) -> None:
        """Written out and dropped from memory: the next read of any file here goes to the disk."""
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3")

    def __exit__(self, *exc: object) -> None:
        if self.cgroup.exists():
            with contextlib.suppress(OSError):
                self.release()
            for pid in (self.cgroup / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):  # gone meanwhile
                    (self.cgroup.parent / "cgroup.procs").write_text(pid)
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()
        subprocess.run(["umount", "-l", str(self.mount)], capture_output=True)
        if self.device:
            subprocess.run(["losetup", "-d", self.device], capture_output=True)
        self.image.unlink(missing_ok=True)


def _run(*argv: str) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {out.returncode}: {out.stderr.strip()}")
    return out.stdout
