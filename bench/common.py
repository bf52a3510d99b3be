"""What the bench scripts share: the fake runtime and `cri-proxy serve` as processes, and /proc figures.

Every process writes its output to the terminal; the proxy's state dir and kubelet state file are
in the bench's temp directory (`tests.processes.serve_command`), never the node's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cri_proxy.endpoints import socket_answers  # noqa: E402
from tests.processes import CLI, serve_command  # noqa: E402

__all__ = [
    "CLI",
    "ROOT",
    "add_proxy_cli",
    "idle_setting",
    "proc_figures",
    "rss_kib",
    "runtime",
    "start_fake_runtime",
    "start_proxy",
    "stop_all",
    "wait_socket",
]


def add_proxy_cli(parser: argparse.ArgumentParser) -> None:
    """`--proxy-cli`: the bench's proxy run from another install (`start_proxy`'s `cli`)."""
    parser.add_argument(
        "--proxy-cli",
        default=None,
        help="another venv's `cri-proxy` script to run the proxy from (say one on another Python)",
    )


def idle_setting() -> str:
    """How this machine's idle CPUs wake, for the bench's header: the wake-up cost of a halted vCPU
    is in every relay row (a proxy adds wakes), and a VM guest can poll before it halts.
    """
    cpuidle = Path("/sys/devices/system/cpu/cpuidle/current_driver")
    poll = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
    try:
        driver = cpuidle.read_text().strip()
    except OSError:
        return "cpuidle driver unknown"
    if driver != "haltpoll":
        return f"cpuidle driver {driver}"
    try:
        return f"cpuidle driver haltpoll, guest_halt_poll_ns {poll.read_text().strip()}"
    except OSError:
        return "cpuidle driver haltpoll"


def wait_socket(path: Path, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Until a server answers on `path`; exit the bench if `proc` exits first or it never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[1]} exited {proc.returncode}")  # type: ignore[index]
        if path.exists() and socket_answers(path):
            return
        time.sleep(0.05)
    raise SystemExit(f"{path} never answered")


def start_fake_runtime(work: Path, *args: str, name: str = "fake") -> tuple[subprocess.Popen[bytes], str]:
    """`cri-proxy fake-runtime ARGS` on work/NAME.sock, answering: (process, its endpoint)."""
    sock = work / f"{name}.sock"
    proc = subprocess.Popen([CLI, "fake-runtime", "--listen", f"unix://{sock}", *args])
    wait_socket(sock, proc)
    return proc, f"unix://{sock}"


def start_proxy(
    work: Path,
    runtime_endpoint: str,
    *extra: str,
    listen: Path | None = None,
    state_dir: Path | None = None,
    log: Path | None = None,
    cli: str | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """`cri-proxy serve` in front of `runtime_endpoint` (state in `work`), answering: (process, endpoint).
    `log`: its output goes to that file instead of the bench's terminal. `cli`: another install's
    `cri-proxy` script (another venv, another Python) instead of this one's."""
    sock = listen or work / "proxy.sock"
    argv = serve_command(work, runtime_endpoint, *extra, listen=sock, state_dir=state_dir)
    if cli:
        argv[0] = cli
    if log is None:
        proc = subprocess.Popen(argv)
    else:
        with log.open("ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=out)
    wait_socket(sock, proc)
    return proc, f"unix://{sock}"


def stop_all(procs: Iterable[subprocess.Popen[bytes]], timeout: float = 30.0) -> None:
    """SIGTERM each (the last started first); SIGKILL one that does not exit within `timeout`."""
    for proc in reversed(list(procs)):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextlib.contextmanager
def runtime(kind: str, work: Path, root: str | None = None) -> Iterator[str]:
    """The runtime a bench measures against, its endpoint: a private real containerd ("containerd";
    root; Debian's containerd and runc installed when missing) or the fake runtime in `work`.
    Stopped at the end, containerd's pods removed first (nothing left behind for the next run).
    `root`: the directory containerd's own (its database, snapshots, state) is made in, /tmp by
    default; on a tmpfs (/dev/shm) its creates no longer wait for the disk's fsyncs, whose spread
    is most of how a create's time moves from run to run."""
    if kind != "containerd":
        fake, address = start_fake_runtime(work, "--log-level", "WARNING")
        try:
            yield address
        finally:
            stop_all([fake])
        return
    sys.path.insert(0, str(ROOT / "tests" / "e2e"))
    from containerd import PrivateContainerd, missing_tools, run_setup_script

    if missing_tools():
        run_setup_script()
    containerd = PrivateContainerd(tmp_root=root).start()
    try:
        yield containerd.address
    finally:
        containerd.stop()  # removes every pod first (and kills what CRI did not know), then cleans up


def free_port() -> int:
    """A loopback TCP port free now (for a listener the bench starts next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def rss_kib(pid: int | str = "self") -> int:
    """Resident set size of a process (this one by default), KiB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def proc_figures(pid: int) -> dict[str, float]:
    """RSS (MiB), open fds, CPU seconds (user + system) of a process, from /proc."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return {"rss_mib": rss_kib(pid) / 1024, "fds": fds, "cpu_s": ticks / os.sysconf("SC_CLK_TCK")}
