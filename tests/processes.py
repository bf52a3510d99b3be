"""Running `cri-proxy` as a real process in tests: start it, wait for its socket, wait for a state."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CLI = str(Path(sys.executable).parent / "cri-proxy")


def wait_until(
    predicate: Callable[[], object], timeout: float = 20.0, what: str = "condition", every: float = 0.05
) -> None:
    """Poll `predicate` every `every` seconds; fail the test naming `what` when it stays false."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def rss_bytes(pid: int) -> int:
    """The resident set of process `pid`."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def socket_answers(path: Path) -> bool:
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def wait_for_socket(
    path: Path, proc: subprocess.Popen[Any], timeout: float = 15, log: Path | None = None
) -> None:
    """Until a server answers on `path`; fail at once if `proc` exits first (with `log`'s tail, if given)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            output = log.read_text()[-2000:] if log is not None and log.exists() else proc.communicate()
            raise AssertionError(f"process exited early: {output}")
        if socket_answers(path):
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never answered")


def serve_command(
    tmp: Path,
    runtime: Path | str | None,
    *extra: str,
    listen: Path | None = None,
    config: Path | str = "/dev/null",
    state_dir: Path | None = None,
    kubelet_state_file: Path | None = None,
) -> list[str]:
    """`cri-proxy serve` with everything it writes or reads in `tmp`, never the /var/lib defaults.

    Listens on `listen` (default tmp/proxy.sock), relays to `runtime`: a socket path, an endpoint
    ("unix://..."), or None for no --runtime-endpoint (a proxy that must refuse before it gets that
    far). State dir tmp/state and kubelet state file tmp/cpu_manager_state unless given; `extra`
    flags come last (the last of a repeated flag wins). A fake sysfs (`--sysfs-root` in `extra`)
    goes with a cgroup root of its own, tmp/cgroup, unless `--cgroup-root` is given too: the
    host's pod cgroups would bound the fake CPUs (`CgroupReader.pod_root_cpus`).
    """
    endpoint = runtime if isinstance(runtime, str) else f"unix://{runtime}"
    if "--sysfs-root" in extra and "--cgroup-root" not in extra:
        extra = ("--cgroup-root", str(tmp / "cgroup"), *extra)
    return [
        CLI,
        "serve",
        "--config",
        str(config),
        "--listen",
        f"unix://{listen or tmp / 'proxy.sock'}",
        *(["--runtime-endpoint", endpoint] if runtime is not None else []),
        "--state-dir",
        str(state_dir or tmp / "state"),
        "--kubelet-state-file",
        str(kubelet_state_file or tmp / "cpu_manager_state"),
        *extra,
    ]


def start(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`argv` as a process, its stdout and stderr appended to `log`, `env` added to ours."""
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=out, env={**os.environ, **env} if env else None)


def stop(proc: subprocess.Popen[Any], timeout: float = 10) -> int:
    """SIGTERM, then SIGKILL if it has not exited within `timeout`; its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(5)


def start_fake_runtime(tmp: Path, *args: str, name: str = "runtime") -> tuple[subprocess.Popen[bytes], Path]:
    """`cri-proxy fake-runtime ARGS` on tmp/NAME.sock (log tmp/NAME.log), answering: (process, socket)."""
    sock, log = tmp / f"{name}.sock", tmp / f"{name}.log"
    proc = start([CLI, "fake-runtime", "--listen", f"unix://{sock}", *args], log)
    return _answering(proc, sock, log), sock


def start_proxy(
    tmp: Path,
    runtime: Path | str | None,
    *extra: str,
    log: Path | None = None,
    env: dict[str, str] | None = None,
    **where: Any,
) -> tuple[subprocess.Popen[bytes], Path]:
    """`serve_command(tmp, runtime, *extra, **where)` started, logging to `log` (default tmp/proxy.log),
    and answering: (process, socket)."""
    sock = where.get("listen") or tmp / "proxy.sock"
    log = log or tmp / "proxy.log"
    proc = start(serve_command(tmp, runtime, *extra, **where), log, env)
    return _answering(proc, sock, log), sock


def _answering(proc: subprocess.Popen[bytes], sock: Path, log: Path) -> subprocess.Popen[bytes]:
    """`proc` once it answers on `sock`; stopped, and the test failed, when it does not."""
    try:
        wait_for_socket(sock, proc, log=log)
    except BaseException:
        stop(proc)
        raise
    return proc


def ctl_json(endpoint: str, *args: str) -> Any:
    """`cri-proxy ctl -r ENDPOINT ARGS`, which must succeed; its output read as JSON."""
    argv = [CLI, "ctl", "-r", endpoint, *args]
    return json.loads(subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout)
