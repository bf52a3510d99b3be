"""`cri-proxy serve` as operators run it: a real process, a real socket, real signals."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import resource
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cri_api.v1 import api_pb2 as v1
from cri_proxy.client import CriClient
from tests import stalled_disk
from tests.h2raw import never_reading_client
from tests.processes import (
    CLI,
    ctl_json,
    rss_bytes,
    serve_command,
    start,
    start_fake_runtime,
    start_proxy,
    stop,
    wait_for_socket,
    wait_until,
)
from tests.unit.kube_api_server import KubeApiServer


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Path]:
    proc, sock = start_fake_runtime(tmp_path, "--latency-ms", "0")
    yield sock
    stop(proc)


def _serve(tmp_path: Path, runtime: Path, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
    return start_proxy(tmp_path, runtime, *extra, listen=tmp_path / "run" / "cri-proxy" / "proxy.sock")


def test_socket_is_0660_in_a_created_directory_and_removed_on_sigterm(tmp_path: Path, fake: Path) -> None:
    proc, sock = _serve(tmp_path, fake)
    assert stat.S_IMODE(sock.stat().st_mode) == 0o660
    assert stat.S_ISSOCK(sock.stat().st_mode)
    with CriClient(f"unix://{sock}") as client:
        assert client.runtime.Version(v1.VersionRequest()).runtime_name == "cri-proxy-fake-runtime"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    assert not sock.exists()


@pytest.mark.parametrize("hup", [False, True], ids=["sigterm", "then-sighup"])
def test_in_flight_calls_finish_on_sigterm(tmp_path: Path, hup: bool) -> None:
    """`hup`: a SIGHUP (a reload sent by hand) comes during the shutdown grace too. It is ignored
    (the stop used to remove its handler, so it ended the process and the call with it)."""
    slow, runtime = start_fake_runtime(tmp_path, "--latency-ms", "1500", name="slow")
    try:
        proc, sock = _serve(tmp_path, runtime, "--shutdown-grace", "10")
        result: list[object] = []

        def call() -> None:
            with CriClient(f"unix://{sock}") as client:
                try:
                    result.append(client.runtime.Version(v1.VersionRequest()).runtime_name)
                except grpc.RpcError as exc:
                    result.append(exc)

        worker = threading.Thread(target=call)
        worker.start()
        time.sleep(0.5)  # the call is now waiting on the slow runtime
        proc.send_signal(signal.SIGTERM)
        if hup:
            log = tmp_path / "proxy.log"
            wait_until(lambda: "signal received: stopping" in log.read_text(), 10, "the stop to begin")
            proc.send_signal(signal.SIGHUP)
        worker.join(15)
        assert result == ["cri-proxy-fake-runtime"]
        assert proc.wait(15) == 0
        assert not sock.exists()
        if hup:
            assert "SIGHUP while stopping: ignored" in log.read_text()
    finally:
        stop(slow)


def test_a_stale_socket_file_is_replaced(tmp_path: Path, fake: Path) -> None:
    sock = tmp_path / "run" / "cri-proxy" / "proxy.sock"
    sock.parent.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as s:  # bound, then closed: a dead server's leftover
        s.bind(str(sock))
    assert sock.exists()
    proc, sock = _serve(tmp_path, fake)
    with CriClient(f"unix://{sock}") as client:
        assert client.runtime.Version(v1.VersionRequest()).version
    proc.terminate()
    assert proc.wait(15) == 0


def test_refuses_to_start_when_a_live_server_owns_the_socket(tmp_path: Path, fake: Path) -> None:
    first, sock = _serve(tmp_path, fake)
    try:
        # another state directory: the socket check refuses
        args = serve_command(tmp_path, fake, listen=sock, state_dir=tmp_path / "state2")
        second = subprocess.run(args, capture_output=True, text=True, timeout=30)
        assert second.returncode != 0
        assert "already listening" in second.stderr and str(sock) in second.stderr
        # the same state directory: its lock refuses (one proxy per checkpoint)
        args = serve_command(tmp_path, fake, listen=sock, state_dir=tmp_path / "state")
        third = subprocess.run(args, capture_output=True, text=True, timeout=30)
        assert third.returncode != 0
        assert "another cri-proxy holds" in third.stderr
        with CriClient(f"unix://{sock}") as client:  # the first one is untouched
            assert client.runtime.Version(v1.VersionRequest()).version
    finally:
        stop(first, 15)


@pytest.mark.parametrize("kind", ["symlink", "regular-file"])
def test_refuses_a_socket_path_that_is_not_a_socket(tmp_path: Path, fake: Path, kind: str) -> None:
    sock = tmp_path / "proxy.sock"
    if kind == "symlink":
        os.symlink(tmp_path / "elsewhere", sock)
    else:
        sock.write_text("precious")
    out = subprocess.run(
        serve_command(tmp_path, fake, listen=sock), capture_output=True, text=True, timeout=30
    )
    assert out.returncode != 0
    assert "refusing to listen" in out.stderr
    assert sock.is_symlink() if kind == "symlink" else sock.read_text() == "precious"


def test_a_socket_directory_that_cannot_be_made_is_named_without_a_traceback(
    tmp_path: Path, fake: Path
) -> None:
    (tmp_path / "run").write_text("a file where the directory should be")
    out = subprocess.run(
        serve_command(tmp_path, fake, listen=tmp_path / "run" / "proxy.sock"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1, out.stderr
    expected = (
        f"cri-proxy serve: cannot make the socket's directory {tmp_path / 'run'}:"
        " a part of it is not a directory"
    )
    assert out.stderr.splitlines()[-1] == expected
    assert "Traceback" not in out.stderr


def test_a_metrics_port_taken_ends_the_start_before_the_cri_socket_is_taken(
    tmp_path: Path, fake: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        sock = tmp_path / "proxy.sock"
        out = subprocess.run(
            serve_command(tmp_path, fake, "--metrics-address", address, listen=sock),
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert out.returncode == 1, out.stderr
    assert out.stderr.splitlines()[-1] == (
        f"cri-proxy serve: metrics_address {address}: cannot listen: Address already in use"
    )
    assert not sock.exists()


def test_config_file_sets_endpoints_and_flags_override(tmp_path: Path, fake: Path) -> None:
    sock = tmp_path / "from-file.sock"
    config = tmp_path / "config.toml"
    config.write_text(f'listen = "unix://{sock}"\nruntime_endpoint = "unix:///nonexistent.sock"\n')
    proc = start(
        [
            CLI,
            "serve",
            "--config",
            str(config),
            "--runtime-endpoint",
            f"unix://{fake}",
            "--state-dir",
            str(tmp_path / "state"),
            "--kubelet-state-file",
            str(tmp_path / "cpu_manager_state"),
        ],
        tmp_path / "proxy.log",
    )
    try:
        wait_for_socket(sock, proc)
        with CriClient(f"unix://{sock}") as client:
            assert client.runtime.Version(v1.VersionRequest()).runtime_name == "cri-proxy-fake-runtime"
    finally:
        stop(proc, 15)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('listn = "unix:///x.sock"\n', "'listn'"),
        ('max_recv_message_bytes = "big"\n', "max_recv_message_bytes"),
        ('fail_policy = "sometimes"\n', "fail_policy"),
        ("listen = [\n", "not valid TOML"),
        (
            'listen = "unix:relative.sock"\n',
            "listen: unix endpoint 'unix:relative.sock' must name an absolute",
        ),
        # a Unix socket's path holds 107 bytes: bind and connect fail past it, and grpcio's words
        # for it were vague (the admin socket's start failed after the runtime's recovery)
        (f'listen = "unix:///{"d" * 120}.sock"\n', "listen: unix endpoint 'unix:///dddd"),
        (f'runtime_endpoint = "/{"d" * 120}.sock"\n', "runtime_endpoint: unix endpoint '/ddd"),
        (f'admin_listen = "unix:///{"d" * 120}.sock"\n', "admin_listen: unix endpoint 'unix:///dddd"),
        (f'listen = "unix:///{"d" * 99}/c.sock"\n', "admin_listen (unset: beside listen): unix endpoint"),
    ],
)
def test_bad_config_refuses_to_start_naming_the_key(tmp_path: Path, text: str, names: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text)
    out = subprocess.run([CLI, "serve", "--config", str(config)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert names in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    if "dddd" in text:
        assert "bytes, over the 107 a socket's holds" in out.stderr


def test_missing_explicit_config_file_is_an_error(tmp_path: Path) -> None:
    args = [CLI, "serve", "--config", str(tmp_path / "nope.toml")]
    out = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "does not exist" in out.stderr


def test_enforcement_flags_take_effect(tmp_path: Path, fake: Path) -> None:
    """The flags checks outside the project start the proxy with, each visible in the live plan."""
    import json

    from tests.unit.enforce_support import fake_sysfs

    sysfs = fake_sysfs(tmp_path / "sys", {0: "0-7", 1: "8-15"})
    state = {"policyName": "static", "defaultCpuSet": "0-11", "entries": {"uid-g": {"main": "12-13"}}}
    (tmp_path / "cms").write_text(json.dumps(state))
    proc, sock = start_proxy(
        tmp_path,
        fake,
        "--sysfs-root",
        str(sysfs),
        "--reserved-cpus",
        "0-1",
        "--system-cpus",
        "14-15",
        "--fail-policy",
        "fail",
        "--exclusive-wait",
        "0.5",
        kubelet_state_file=tmp_path / "cms",
    )
    try:
        with CriClient(f"unix://{sock}") as client:
            pb = client.pb
            config = pb.PodSandboxConfig(
                metadata=pb.PodSandboxMetadata(name="sys", uid="uid-s", namespace="kube-system"),
                labels={"koordinator.sh/qosClass": "SYSTEM"},
                linux=pb.LinuxPodSandboxConfig(cgroup_parent="/kubepods/burstable/poduid-s"),
            )
            sandbox = client.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config)).pod_sandbox_id
            cid = client.runtime.CreateContainer(
                pb.CreateContainerRequest(
                    pod_sandbox_id=sandbox,
                    config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name="main")),
                    sandbox_config=config,
                )
            ).container_id
            # --fail-policy fail: a bad annotation is refused
            bad = pb.PodSandboxConfig(
                metadata=pb.PodSandboxMetadata(name="bad", uid="uid-b", namespace="default"),
                annotations={"scheduling.koordinator.sh/resource-status": "nope"},
                linux=pb.LinuxPodSandboxConfig(cgroup_parent="/kubepods/burstable/poduid-b"),
            )
            bad_id = client.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=bad)).pod_sandbox_id
            with pytest.raises(grpc.RpcError) as err:
                client.runtime.CreateContainer(
                    pb.CreateContainerRequest(
                        pod_sandbox_id=bad_id,
                        config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name="main")),
                        sandbox_config=bad,
                    )
                )
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            status = client.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id=cid)).status
            assert status.resources.linux.cpuset_cpus == "14-15"  # --system-cpus, injected
        plan = ctl_json(f"unix://{sock}", "plan")
        assert plan["pools"] == {"ls": "2-11,14-15", "be": "2-11,14-15"}  # reserved and kubelet's CPUs out
        assert plan["containers"][cid]["cpuset_cpus"] == "14-15"  # --system-cpus
    finally:
        stop(proc, 15)


@pytest.mark.parametrize("relay_mode", ["frames", "grpc"])
def test_a_client_that_never_reads_leaves_nothing_behind(tmp_path: Path, fake: Path, relay_mode: str) -> None:
    """In front of the bundled runtime (which stops reading while its answers cannot be written),
    such a client made the proxy keep, in "frames" mode, its runtime connection and ~20 MiB for
    good, and in "grpc" mode ~20 MiB of heap. Once it has gone the proxy's sockets are back at once
    and its RSS within 10 MiB of before (in "grpc" mode at the next look at the heap, every 10 s):
    the interpreter's arenas that a few live objects pin stay (`relay/heap.py`), more of them when
    the machine is busy (the tests run in parallel)."""
    proc, sock = _serve(tmp_path, fake, "--relay-mode", relay_mode)
    try:
        never_reading_client(sock, 0.5)  # the one-off growth of a first such client
        fds = lambda: len(os.listdir(f"/proc/{proc.pid}/fd"))  # noqa: E731
        wait_until(lambda: fds() <= 30, timeout=5, what="the first client's sockets closed")
        time.sleep(1.5)
        before, rss = fds(), rss_bytes(proc.pid)
        calls = never_reading_client(sock, 3.0)
        assert calls > 10000, calls
        wait_until(lambda: fds() <= before, timeout=5, what=f"the proxy's {before} open files back")
        wait_until(
            lambda: rss_bytes(proc.pid) - rss < 10 << 20,
            timeout=25,
            what=f"the proxy's RSS back within 10 MiB of {rss / 2**20:.1f} MiB after {calls} calls",
        )
    finally:
        stop(proc)


def test_a_stderr_no_one_reads_never_freezes_the_proxy(tmp_path: Path, fake: Path) -> None:
    """A journald that stalls: the proxy's stderr is a pipe (one page) that no one reads. Every
    call still gets its answer while the log lines pile up (they used to freeze the proxy at
    the first line the pipe could not take: `Version` timed out); the lines dropped are counted
    in /metrics, and named in a warning once stderr is read again."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sock = tmp_path / "proxy.sock"
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
    argv = serve_command(tmp_path, fake, "--log-level", "DEBUG", "--metrics-address", f"127.0.0.1:{port}")
    proc = subprocess.Popen(argv, stdout=w, stderr=w)
    os.close(w)
    out = bytearray()
    try:
        wait_for_socket(sock, proc)
        with CriClient(f"unix://{sock}") as client:
            dropped = 0.0
            for n in range(400):  # each create writes DEBUG lines of 8 KiB (the request, cut there)
                pod = client.runtime.RunPodSandbox(
                    v1.RunPodSandboxRequest(
                        config=v1.PodSandboxConfig(
                            metadata=v1.PodSandboxMetadata(name=f"p{n}", uid=f"u{n}", namespace="ns"),
                            annotations={"big": "x" * 10_000},
                        )
                    ),
                    timeout=5,
                )
                client.runtime.CreateContainer(
                    v1.CreateContainerRequest(
                        pod_sandbox_id=pod.pod_sandbox_id,
                        config=v1.ContainerConfig(
                            metadata=v1.ContainerMetadata(name="c"),
                            image=v1.ImageSpec(image="busybox"),
                            annotations={"big": "x" * 10_000},
                        ),
                    ),
                    timeout=5,
                )
                assert client.runtime.Version(v1.VersionRequest(), timeout=5).runtime_name
                if n % 20 == 19:
                    dropped = _lines_dropped(port)
                    if dropped:
                        break
            assert dropped > 0  # the proxy held what it may, then dropped; every call was answered
            reader = threading.Thread(target=_read_to_end, args=(r, out), daemon=True)
            reader.start()  # journald reads again
            wait_until(lambda: b"log lines dropped" in out, 20, "the warning about the lines dropped")
            assert client.runtime.Version(v1.VersionRequest(), timeout=5).runtime_name
        assert stop(proc) == 0  # its last lines taken at exit
        reader.join(10)
        assert b"Traceback" not in out
    finally:
        stop(proc)
        os.close(r)


def _read_to_end(fd: int, out: bytearray) -> None:
    while chunk := os.read(fd, 1 << 16):
        out += chunk


def _lines_dropped(port: int) -> float:
    return _metric(port, "cri_proxy_log_lines_dropped_total")


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        for text in reply.read().decode().splitlines():
            if text.startswith(name + " "):
                return float(text.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def test_sigusr1_writes_every_stack_to_the_log_and_sigusr2_ends_nothing(tmp_path: Path, fake: Path) -> None:
    """As containerd: `kill -USR1` writes what each thread and task is doing to the log (it used
    to end the proxy: the signal's default action); SIGUSR2 does nothing but say so. The proxy
    serves on."""
    proc, sock = _serve(tmp_path, fake)
    log = tmp_path / "proxy.log"
    try:
        proc.send_signal(signal.SIGUSR1)
        wait_until(lambda: "=== end of stacks ===" in log.read_text(), 10, "the stacks")
        text = log.read_text()
        assert "--- thread MainThread" in text
        assert "--- thread log-writer" in text  # the log's own thread, waiting for lines
        assert "Reconciler.run" in text  # a task, by its coroutine
        proc.send_signal(signal.SIGUSR2)
        wait_until(lambda: "SIGUSR2: no action" in log.read_text(), 10, "the SIGUSR2 line")
        with CriClient(f"unix://{sock}") as client:
            assert client.runtime.Version(v1.VersionRequest(), timeout=5).runtime_name
        assert stop(proc) == 0
    finally:
        stop(proc)


def test_a_sighup_during_the_start_is_applied_once_started(tmp_path: Path) -> None:
    """The start waits up to 3 s for a runtime that is not there yet; a SIGHUP then (a reload
    sent by hand) used to end the process. Now the configuration is read again once started."""
    sock = tmp_path / "proxy.sock"
    runtime = tmp_path / "later.sock"  # no runtime: the start's recovery waits its 3 s
    log = tmp_path / "proxy.log"
    proc = start(serve_command(tmp_path, runtime, listen=sock), log)
    try:
        wait_until((tmp_path / "state" / "lock").exists, 10, "the start to begin")  # handlers in
        assert not sock.exists()  # still starting
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "SIGHUP during the start" in log.read_text(), 10, "the SIGHUP noted")
        wait_for_socket(sock, proc, log=log)
        wait_until(lambda: "configuration reloaded" in log.read_text(), 10, "the reload after the start")
        assert stop(proc) == 0
    finally:
        stop(proc)


def test_out_of_file_descriptors_is_said_and_outlived(tmp_path: Path, fake: Path) -> None:
    """A client that leaves connections open until the proxy is at its descriptor limit (each
    connection costs it two: the client's and its own to the runtime). The proxy says so once,
    naming the limit and the connections. A new call fails at once with UNAVAILABLE (or is
    served, where a connection whose runtime could not be dialled was let go meanwhile), and
    never hangs. Once the client lets go, the proxy says so and answers as before. Nothing was
    said before: uvloop closes what it cannot accept unseen. The start first raises a soft limit
    below the hard one, as every Go daemon does (here 64 -> 96)."""
    sock = tmp_path / "proxy.sock"
    log = tmp_path / "proxy.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            serve_command(tmp_path, fake),
            stdout=out,
            stderr=out,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 96)),
        )
    held: list[socket.socket] = []
    try:
        wait_for_socket(sock, proc, log=log)
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        assert re.search(r"Max open files\s+96\s+96\s", limits), limits
        for _ in range(60):
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(sock))
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))  # + SETTINGS
            held.append(s)
        said = re.compile(r"WARNING +file descriptors: \d+ of the limit 96 in use \(\d+ client connections\)")
        wait_until(lambda: said.search(log.read_text()), 20, "the warning about the descriptors")
        with CriClient(f"unix://{sock}") as client:  # refused, or served where a stand-in has let go
            try:
                client.runtime.Version(v1.VersionRequest(), timeout=10)
            except grpc.RpcError as refused:
                assert refused.code() is grpc.StatusCode.UNAVAILABLE, refused
        for s in held:
            s.close()
        held.clear()
        wait_until(lambda: "of the limit 96 in use again" in log.read_text(), 20, "the all-clear")
        with CriClient(f"unix://{sock}") as client:
            assert client.runtime.Version(v1.VersionRequest(), timeout=5).runtime_name
        text = log.read_text()
        assert text.count("file descriptors:") == 2 and "Traceback" not in text
    finally:
        for s in held:
            s.close()
        stop(proc)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare: mounts a tmpfs"
)
@pytest.mark.parametrize("which", ["admin socket", "CRI socket, frames mode", "CRI socket, grpc mode"])
def test_a_socket_that_cannot_be_bound_is_named_with_its_cause(
    tmp_path: Path, fake: Path, which: str
) -> None:
    """A socket's directory on a file system with no inode left: the start ends (exit 1) with one
    line naming the socket and the cause. grpcio, which binds the admin socket and, in grpc mode,
    the CRI socket, says only "Failed to bind"; the cause was in its own log line alone."""
    full = tmp_path / "full"
    full.mkdir()
    fill = (
        f"mount -t tmpfs -o nr_inodes=4,mode=0755 none {full} && for i in 1 2 3 4 5; do true >{full}/$i; done"
    )
    where = {
        "admin socket": ["--admin-listen", f"unix://{full}/admin.sock"],
        "CRI socket, frames mode": ["--listen", f"unix://{full}/cri.sock"],
        "CRI socket, grpc mode": ["--relay-mode", "grpc", "--listen", f"unix://{full}/cri.sock"],
    }[which]
    argv = serve_command(tmp_path, fake, "--admin-listen", f"unix://{tmp_path}/admin.sock", *where)
    out = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'{fill} 2>/dev/null; exec "$@"',
            "-",
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1, out.stderr
    last = out.stderr.splitlines()[-1]
    assert last.startswith("cri-proxy serve: cannot listen on ") and str(full) in last, last
    assert last.endswith(": No space left on device"), last
    assert "Traceback" not in out.stderr


def test_a_socket_file_removed_under_the_proxy_is_bound_again(tmp_path: Path, fake: Path) -> None:
    """A cleanup script removes the proxy's socket files while it runs. Nothing said so, and no
    client could ever connect again (ENOENT) while the proxy looked healthy. Now each is bound
    again within seconds, and said once. One another server has bound there meanwhile is its own:
    said, /healthz says it, and this proxy's stop leaves it there (it used to remove it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc, sock = start_proxy(tmp_path, fake, "--metrics-address", f"127.0.0.1:{port}")
    log, admin = tmp_path / "proxy.log", tmp_path / "admin.sock"
    other, other_admin = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    try:
        sock.unlink()
        admin.unlink()
        for what, path in (("CRI", sock), ("admin", admin)):
            said = f"{what} socket {path} was removed while serving (no client could connect): bound again"
            wait_until(lambda s=said: s in log.read_text(), 20, f"the {what} socket bound again")
        with CriClient(f"unix://{sock}") as client:
            assert client.runtime.Version(v1.VersionRequest(), timeout=5).runtime_name
        assert "pools" in ctl_json(f"unix://{sock}", "plan")  # over the admin socket
        assert stat.S_IMODE(sock.stat().st_mode) == 0o660 and stat.S_IMODE(admin.stat().st_mode) == 0o600

        sock.unlink()
        other.bind(str(sock))
        other.listen()
        admin.unlink()
        other_admin.bind(str(admin))
        other_admin.listen()
        theirs = sock.lstat().st_ino, admin.lstat().st_ino
        wait_until(lambda: log.read_text().count("was replaced while serving") == 2, 20, "both said")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
            raise AssertionError("/healthz answered 200 with the CRI socket another server's")
        except urllib.error.HTTPError as err:
            assert err.code == 503 and "was replaced while serving" in err.read().decode()
        assert stop(proc) == 0
        # left to their owner (grpcio, which serves the admin socket, unlinks its path as it stops)
        assert (sock.lstat().st_ino, admin.lstat().st_ino) == theirs
        assert log.read_text().count("was replaced while serving") == 2 and "Traceback" not in log.read_text()
    finally:
        stop(proc)
        other.close()
        other_admin.close()


def test_in_grpc_mode_a_removed_cri_socket_is_said_as_it_cannot_be_bound_again(
    tmp_path: Path, fake: Path
) -> None:
    """grpcio binds its paths only at its start: the proxy says what to do instead. A socket
    another server binds there then is left to it at the stop, though grpcio unlinks its path."""
    proc, sock = start_proxy(tmp_path, fake, "--relay-mode", "grpc")
    log = tmp_path / "proxy.log"
    other = socket.socket(socket.AF_UNIX)
    try:
        sock.unlink()
        said = "cannot be bound again while running (grpc mode); restart the proxy"
        wait_until(lambda: said in log.read_text(), 20, "the removed socket said")
        other.bind(str(sock))
        other.listen()
        theirs = sock.lstat().st_ino
        assert stop(proc) == 0
        assert sock.lstat().st_ino == theirs
        assert log.read_text().count(said) == 1 and "Traceback" not in log.read_text()
    finally:
        stop(proc)
        other.close()


def test_what_the_libraries_log_comes_out_as_the_proxys_own_lines(tmp_path: Path, fake: Path) -> None:
    """The kubernetes client logs an exec credential plugin that cannot run through `logging`
    (asyncio and grpcio do the same with their errors): without a handler it went to stderr as bare
    text past the writer that never blocks (grpcio's and urllib3's were dropped). It must come out
    as the proxy's own lines, and urllib3's warning of each retry must not (the proxy says the API
    is down once, then at DEBUG)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once the probe is closed
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        '{"apiVersion": "v1", "kind": "Config", "current-context": "c",'
        f' "clusters": [{{"name": "k", "cluster": {{"server": "http://127.0.0.1:{port}"}}}}],'
        ' "users": [{"name": "u", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1",'
        ' "command": "/nonexistent/credential-plugin", "interactiveMode": "Never"}}}],'
        ' "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}'
    )
    config = tmp_path / "config.toml"
    config.write_text(f'[kubernetes]\nenabled = true\nnode_name = "n1"\nkubeconfig = "{kubeconfig}"\n')
    log = tmp_path / "proxy.log"
    proc, _ = start_proxy(tmp_path, fake, "--log-level", "DEBUG", config=config, log=log)
    try:
        wait_until(
            lambda: log.read_text().count("Kubernetes API still unreachable") >= 2, 20, "two tries more"
        )
    finally:
        assert stop(proc) == 0
    lines = log.read_text().splitlines()
    layout = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO|WARNING|ERROR) ")
    assert [line for line in lines if not layout.match(line)] == []
    plugin = [line for line in lines if "/nonexistent/credential-plugin" in line]
    assert len(plugin) >= 3  # one a try
    assert "ERROR   kube_config: [Errno 2] No such file or directory" in plugin[0]
    assert all(" DEBUG " in line for line in plugin[1:])  # said once: the same words at DEBUG after
    assert any(f"Kubernetes API http://127.0.0.1:{port}: " in line for line in lines)
    assert not any("Retrying (Retry(" in line for line in lines)


@pytest.mark.skipif(bool(stalled_disk.available()), reason=stalled_disk.available() or "-")
def test_a_stalled_disk_is_said_and_does_not_hold_the_stop(tmp_path: Path, fake: Path) -> None:
    """The state directory's disk stops answering (a real one: writes throttled to 1 byte/s, so the
    checkpoint's fsync waits in the kernel). Calls are answered as ever; the stalled write is said
    once and counted in /metrics; SIGTERM ends the serving within the stop's bound, saying the
    checkpoint was left, instead of waiting on the fsync until systemd's kill (the lock and the
    last lines with it). Once the disk answers the process is gone, exit 0."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with stalled_disk.StalledDisk(tmp_path) as disk:
        log = tmp_path / "proxy.log"
        proc, sock = start_proxy(
            tmp_path, fake, "--metrics-address", f"127.0.0.1:{port}", state_dir=disk.mount / "state", log=log
        )
        try:
            wait_until(
                lambda: (disk.mount / "state" / "checkpoint.json").exists(), 20, "the first checkpoint"
            )
            disk.enter(proc.pid)
            disk.stall()
            with CriClient(f"unix://{sock}") as client:
                client.runtime.RunPodSandbox(
                    v1.RunPodSandboxRequest(
                        config=v1.PodSandboxConfig(
                            metadata=v1.PodSandboxMetadata(name="p", uid="u", namespace="ns")
                        )
                    ),
                    timeout=5,
                )
                wait_until(lambda: "is the disk stalled?" in log.read_text(), 30, "the stalled write said")
                began = time.monotonic()
                assert client.runtime.Version(v1.VersionRequest(), timeout=5).runtime_name
                assert time.monotonic() - began < 2
            assert _metric(port, "cri_proxy_checkpoint_unsaved_seconds") >= 10
            status = ctl_json(f"unix://{sock}", "status", "-o", "json")
            assert "s behind: a write under way for" in status["checkpoint"]
            proc.send_signal(signal.SIGTERM)
            wait_until(lambda: "stopping without it" in log.read_text(), 20, "the stop not waiting for it")
            assert not sock.exists()
        finally:
            disk.release()
            code = stop(proc, 30)
        assert code == 0, log.read_text()[-2000:]


@pytest.mark.skipif(bool(stalled_disk.available()), reason=stalled_disk.available() or "-")
def test_a_read_that_never_returns_does_not_hold_the_exit(tmp_path: Path, fake: Path) -> None:
    """The config file's disk stops answering reads, and a SIGHUP asks for it (the kubelet's state
    file, read every second, is the same case): the read waits in the kernel. SIGTERM must still
    end the process, the read abandoned. A read in the event loop's default executor held the
    exit, which joins those threads, until the disk answered or systemd's kill."""
    with stalled_disk.StalledDisk(tmp_path) as disk:
        config = disk.mount / "config.toml"
        config.write_text("log_level = 'INFO'\n")
        log = tmp_path / "proxy.log"
        proc, _ = start_proxy(tmp_path, fake, config=config, log=log)
        try:
            disk.enter(proc.pid)
            disk.stall(reads=True)
            disk.drop_caches()
            proc.send_signal(signal.SIGHUP)
            wait_until(lambda: _has_a_thread_waiting_on_io(proc.pid), 20, "the reload's read waiting")
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(15)
            except subprocess.TimeoutExpired:
                code = None
        finally:
            disk.release()
            stop(proc, 30)
        assert code == 0, log.read_text()[-2000:]


def _has_a_thread_waiting_on_io(pid: int) -> bool:
    """A thread of `pid` asleep in the kernel waiting for a disk (state D), and still 0.3 s later
    (not a passing page fault)."""

    def waiting() -> set[str]:
        found = set()
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                if (task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "D":
                    found.add(task.name)
        return found

    first = waiting()
    if not first:
        return False
    time.sleep(0.3)
    return bool(first & waiting())


def test_a_stop_met_by_an_api_answer_exits_0(tmp_path: Path, fake: Path) -> None:
    """SIGTERM just as the Kubernetes API answers (here the watch opened after the first list,
    answered 410 Gone at once): the daemon thread that waited for the answer wakes while the
    interpreter finalizes. Python 3.11 ended it with `pthread_exit`, whose unwinding aborted: the
    stop exited by SIGABRT, with a core dump (systemd: failed), in 40 stops of 40 here."""
    with KubeApiServer(node="n1") as api:
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        config = tmp_path / "config.toml"
        config.write_text(f'[kubernetes]\nenabled = true\nnode_name = "n1"\nkubeconfig = "{kubeconfig}"\n')
        for n in range(5):
            api.gone_http_next()
            log = tmp_path / f"proxy{n}.log"
            proc, _ = start_proxy(tmp_path, fake, config=config, log=log)
            try:
                # the stop as soon as the list is said (polled tightly: the answer comes within ms)
                listed = functools.partial(_says, log, "Kubernetes API: ")
                wait_until(listed, 20, "the first list", every=0.001)
                proc.send_signal(signal.SIGTERM)
                code = proc.wait(15)
            finally:
                stop(proc)
            assert code == 0, f"stop {n}: exit {code}\n{log.read_text()[-1500:]}"


def _says(log: Path, words: str) -> bool:
    return words in log.read_text()
