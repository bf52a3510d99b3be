"""`cri-proxy serve` as a node daemon: systemd notify, SIGHUP reload, metrics, health, log format."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import stat
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cri_api.v1 import api_pb2 as v1
from cri_proxy.client import CriClient
from tests.processes import ctl_json, start_fake_runtime, start_proxy, stop
from tests.processes import wait_until as _wait
from tests.unit.enforce_support import fake_sysfs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daemon:
    """A fake runtime and `cri-proxy serve` with a config file, as systemd would run it."""

    def __init__(self, tmp: Path, config: str = "", env: dict[str, str] | None = None, *extra: str) -> None:
        self.tmp = tmp
        self.config = tmp / "config.toml"
        self.config.write_text(config)
        self.fake, self.runtime_sock = start_fake_runtime(tmp)
        self.log = tmp / "proxy.log"
        sysfs = fake_sysfs(tmp / "sys", {0: "0-7", 1: "8-15"})
        try:
            self.proc, self.sock = start_proxy(
                tmp,
                self.runtime_sock,
                "--sysfs-root",
                str(sysfs),
                *extra,
                config=self.config,
                log=self.log,
                env=env,
            )
        except BaseException:
            stop(self.fake)
            raise

    def logs(self) -> str:
        return self.log.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(20)
        stop(self.fake)
        return code

    def plan(self) -> dict[str, object]:
        result: dict[str, object] = ctl_json(f"unix://{self.sock}", "plan")
        return result


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.settimeout(15)
    yield sock
    sock.close()


def _messages(sock: socket.socket, until: str) -> list[str]:
    seen = []
    while True:
        msg = sock.recv(4096).decode()
        seen.append(msg)
        if until in msg:
            return seen


def test_notify_ready_watchdog_reloading_and_stopping(tmp_path: Path, notify_socket: socket.socket) -> None:
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "200000"}
    daemon = Daemon(tmp_path, "", env)
    try:
        seen = _messages(notify_socket, "READY=1")
        assert any(m.startswith("READY=1\nSTATUS=serving") for m in seen)
        pings = [m for m in _messages(notify_socket, "WATCHDOG=1") if m == "WATCHDOG=1"]
        pings += [m for m in _messages(notify_socket, "WATCHDOG=1") if m == "WATCHDOG=1"]
        assert len(pings) >= 2  # every WatchdogSec/2
        began = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        daemon.proc.send_signal(signal.SIGHUP)
        after = _messages(notify_socket, "READY=1")
        (reload,) = [m for m in after if m.startswith("RELOADING=1")]
        # systemd 253+ takes a reload under Type=notify-reload only with the time it began
        fields = dict(line.split("=", 1) for line in reload.split("\n"))
        assert began <= int(fields["MONOTONIC_USEC"]) <= time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        assert after.index(reload) < len(after) - 1 and after[-1].startswith("READY=1")
    finally:
        code = daemon.stop()
    assert "STOPPING=1" in _messages(notify_socket, "STOPPING=1")
    assert code == 0


def test_the_start_up_heap_is_set_aside_from_the_garbage_collector(tmp_path: Path) -> None:
    """Once serving, what start-up made is frozen: a full collection later does not walk the
    tens of thousands of objects of modules, descriptors and clients again (a ~30 ms stall of
    every call)."""
    import re

    daemon = Daemon(tmp_path, "", None, "--log-level", "DEBUG")
    try:
        pattern = re.compile(r"start-up heap set aside from the garbage collector: (\d+) objects")
        _wait(lambda: pattern.search(daemon.logs()), what="the start-up heap set aside")
        found = pattern.search(daemon.logs())
        assert found is not None and int(found.group(1)) > 10_000
        assert daemon.proc.poll() is None
    finally:
        assert daemon.stop() == 0


def test_sighup_applies_what_can_change_and_names_what_cannot(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, 'reserved_cpus = ""\n')
    try:
        assert daemon.plan()["pools"] == {"ls": "0-15", "be": "0-15"}
        daemon.config.write_text('reserved_cpus = "0-1"\nmax_recv_message_bytes = 1048576\n')
        daemon.proc.send_signal(signal.SIGHUP)
        _wait(lambda: daemon.plan()["pools"] == {"ls": "2-15", "be": "2-15"}, what="reserved CPUs to apply")
        assert "cannot change at run time, restart to apply: max_recv_message_bytes" in daemon.logs()
        daemon.config.write_text('reserved_cpus = "zero"\n')  # a bad file: refused, the running one stays
        daemon.proc.send_signal(signal.SIGHUP)
        _wait(lambda: "reload refused" in daemon.logs(), what="the refusal in the log")
        assert "reserved_cpus" in daemon.logs().split("reload refused")[1]
        assert daemon.plan()["pools"] == {"ls": "2-15", "be": "2-15"}
        assert daemon.proc.poll() is None
    finally:
        assert daemon.stop() == 0


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except urllib.error.URLError as err:  # not listening yet: the socket comes up before the endpoint
        return 0, str(err.reason)


def test_metrics_and_health_endpoints(tmp_path: Path) -> None:
    port = _free_port()
    daemon = Daemon(tmp_path, f'metrics_address = "127.0.0.1:{port}"\n')
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: _get(base + "/healthz")[0] == 200, what="/healthz")
        _wait(lambda: _get(base + "/readyz")[0] == 200, what="/readyz")
        with CriClient(f"unix://{daemon.sock}") as client:
            client.runtime.Version(v1.VersionRequest())
            with pytest.raises(grpc.RpcError):
                client.runtime.ContainerStatus(v1.ContainerStatusRequest(container_id="nope"))
            pod = v1.PodSandboxConfig(
                metadata=v1.PodSandboxMetadata(name="p", uid="u", namespace="d"),
                labels={"koordinator.sh/qosClass": "BE"},
                linux=v1.LinuxPodSandboxConfig(cgroup_parent="/kubepods/besteffort/podu"),
            )
            sandbox = client.runtime.RunPodSandbox(v1.RunPodSandboxRequest(config=pod)).pod_sandbox_id
            client.runtime.CreateContainer(
                v1.CreateContainerRequest(
                    pod_sandbox_id=sandbox, config=v1.ContainerConfig(metadata=v1.ContainerMetadata(name="c"))
                )
            )
        status, text = _get(base + "/metrics")
        assert status == 200
        assert 'cri_proxy_calls_total{code="OK",method="RuntimeService/Version"} 1.0' in text
        assert 'cri_proxy_calls_total{code="NOT_FOUND",method="RuntimeService/ContainerStatus"} 1.0' in text
        assert 'cri_proxy_overhead_seconds_count{method="RuntimeService/Version"} 1.0' in text
        assert 'cri_proxy_runtime_duration_seconds_count{method="RuntimeService/Version"} 1.0' in text
        assert 'cri_proxy_injections_total{qos="BE"} 1.0' in text
        # the usual create goes on with its hooks' answer ready (`EnforceHooks.ready_create`)
        assert 'cri_proxy_hook_runs_total{hook="pre",method="CreateContainer",outcome="ready"} 1.0' in text
        assert 'cri_proxy_hook_seconds_total{hook="pre",method="CreateContainer"}' in text
        assert "cri_proxy_pods_tracked 1.0" in text and "cri_proxy_containers_tracked 1.0" in text
        assert "cri_proxy_runtime_up 1.0" in text and "cri_proxy_reconcile_passes_total" in text
        assert "cri_proxy_reconcile_repaired_total 0.0" in text
        assert 'cri_proxy_build_info{python="' in text and 'version="' in text
        assert "cri_proxy_dry_run 0.0" in text and "cri_proxy_cpuset_updates_replaced_total 0.0" in text
        assert "_created" not in text  # no creation-time series for any counter or histogram
        limits = Path(f"/proc/{daemon.proc.pid}/limits").read_text()
        soft = re.search(r"Max open files\s+(\d+)", limits)
        exported = re.search(r"^process_max_fds (\S+)$", text, re.M)
        assert soft is not None and exported is not None and float(exported[1]) == int(soft[1])
        assert re.search(r"^process_open_fds [1-9]", text, re.M)  # the standard process series
        assert re.search(r"^process_resident_memory_bytes [1-9]", text, re.M)
        assert _get(base + "/nothing")[0] == 404
        daemon.fake.terminate()  # the runtime goes away
        daemon.fake.wait(10)
        _wait(lambda: _get(base + "/healthz")[0] == 503, what="/healthz to fail")
        assert "not answering" in _get(base + "/healthz")[1]
        assert "cri_proxy_runtime_up 0.0" in _get(base + "/metrics")[1]
    finally:
        daemon.stop()


def test_metrics_listener_is_off_by_default(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, "")
    try:
        assert "metrics and health on" not in daemon.logs()
        listening = Path("/proc/net/tcp").read_text()
        own = {line.split()[9] for line in listening.splitlines()[1:]}  # socket inodes
        fds = set()
        for fd in os.listdir(f"/proc/{daemon.proc.pid}/fd"):
            with contextlib.suppress(FileNotFoundError):  # closed since the listing (a checkpoint's)
                fds.add(os.readlink(f"/proc/{daemon.proc.pid}/fd/{fd}"))
        assert not any(f"socket:[{inode}]" in fds for inode in own)
    finally:
        daemon.stop()


def test_grpc_health_service_on_the_admin_socket(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, "")
    try:
        admin = daemon.sock.parent / "admin.sock"
        assert stat.S_IMODE(admin.stat().st_mode) == 0o600
        with grpc.insecure_channel(f"unix://{daemon.sock}") as cri:  # the CRI socket: CRI alone
            with pytest.raises(grpc.RpcError) as err:
                cri.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=5)
            assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED  # the runtime's answer
        with grpc.insecure_channel(f"unix://{admin}") as channel:
            check = channel.unary_unary("/grpc.health.v1.Health/Check")
            _wait(lambda: check(b"", timeout=5) == b"\x08\x01", what="SERVING")

            def request(service: bytes) -> bytes:  # HealthCheckRequest {service = 1}
                return bytes([0x0A, len(service)]) + service

            assert check(request(b"runtime.v1.RuntimeService"), timeout=5) == b"\x08\x01"
            with pytest.raises(grpc.RpcError) as err:
                check(request(b"nothing"), timeout=5)
            assert err.value.code() is grpc.StatusCode.NOT_FOUND
            watch = channel.unary_stream("/grpc.health.v1.Health/Watch")(b"", timeout=5)
            assert next(iter(watch)) == b"\x08\x01"
            watch.cancel()
    finally:
        daemon.stop()


def test_json_log_format_is_one_object_a_line(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, 'log_format = "json"\n')
    try:
        with CriClient(f"unix://{daemon.sock}") as client:
            pod = v1.PodSandboxConfig(
                metadata=v1.PodSandboxMetadata(name="p", uid="u", namespace="d"),
                linux=v1.LinuxPodSandboxConfig(cgroup_parent="/kubepods/burstable/podu"),
            )
            sandbox = client.runtime.RunPodSandbox(v1.RunPodSandboxRequest(config=pod)).pod_sandbox_id
            client.runtime.CreateContainer(
                v1.CreateContainerRequest(
                    pod_sandbox_id=sandbox, config=v1.ContainerConfig(metadata=v1.ContainerMetadata(name="c"))
                )
            )
    finally:
        daemon.stop()
    lines = [json.loads(line) for line in daemon.logs().splitlines() if line.strip()]
    assert lines and all({"time", "level", "msg"} <= set(line) for line in lines)
    assert any("d/p c: LS -> cpuset 0-15" in line["msg"] for line in lines)  # the decision, once, at info
    decision = next(line for line in lines if "d/p c: LS -> cpuset 0-15" in line["msg"])
    assert (decision["namespace"], decision["pod"], decision["container"]) == ("d", "p", "c")  # as fields
