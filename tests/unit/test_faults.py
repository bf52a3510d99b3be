"""Faults with real processes: the proxy killed mid-pass, a state directory that cannot be written."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from cri_api.v1 import api_pb2 as v1
from cri_proxy.client import CriClient
from tests.processes import serve_command, start_fake_runtime, start_proxy, stop
from tests.processes import wait_until as _wait
from tests.unit.enforce_support import fake_sysfs

ALLOC = "scheduling.koordinator.sh/resource-status"


def _serve(tmp: Path, runtime: Path, state_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], Path]:
    sysfs = fake_sysfs(tmp / "sys", {0: "0-7", 1: "8-15"})
    proxy = start_proxy(
        tmp, runtime, "--sysfs-root", str(sysfs), state_dir=state_dir, kubelet_state_file=tmp / "cms", log=log
    )
    time.sleep(0.2)
    return proxy


def _pod(client: CriClient, name: str, labels: dict[str, str], annotations: dict[str, str]) -> str:
    pb = client.pb
    config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=f"uid-{name}", namespace="default"),
        labels=labels,
        annotations=annotations,
        linux=pb.LinuxPodSandboxConfig(cgroup_parent=f"/kubepods/burstable/poduid-{name}"),
    )
    sandbox = client.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config)).pod_sandbox_id
    resources = pb.LinuxContainerResources(cpu_shares=256, memory_limit_in_bytes=1 << 28)
    cid = client.runtime.CreateContainer(
        pb.CreateContainerRequest(
            pod_sandbox_id=sandbox,
            sandbox_config=config,
            config=pb.ContainerConfig(
                metadata=pb.ContainerMetadata(name="main"), linux=pb.LinuxContainerConfig(resources=resources)
            ),
        )
    ).container_id
    client.runtime.StartContainer(pb.StartContainerRequest(container_id=cid))
    return str(cid)


def test_proxy_killed_in_the_middle_of_a_reconcile_pass_converges_after_restart(tmp_path: Path) -> None:
    fake, runtime = start_fake_runtime(tmp_path, "--update-latency-ms", "300")
    log = tmp_path / "proxy.log"
    try:
        proxy, sock = _serve(tmp_path, runtime, tmp_path / "state", log)
        with CriClient(f"unix://{sock}") as client:
            ls = [_pod(client, f"ls{i}", {}, {}) for i in range(12)]
            # the LSR pod's sandbox starts a pass: 12 updates of 300 ms, 8 at a time
            pb = client.pb
            lsr = pb.PodSandboxConfig(
                metadata=pb.PodSandboxMetadata(name="lsr", uid="uid-lsr", namespace="default"),
                labels={"koordinator.sh/qosClass": "LSR"},
                annotations={ALLOC: json.dumps({"cpuset": "0-3"})},
                linux=pb.LinuxPodSandboxConfig(cgroup_parent="/kubepods/poduid-lsr"),
            )
            client.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=lsr))
        time.sleep(0.15)
        proxy.send_signal(signal.SIGKILL)  # mid-pass: some updates sent, most not
        proxy.wait(10)
        with CriClient(f"unix://{runtime}") as direct:
            moved = [
                direct.runtime.ContainerStatus(
                    v1.ContainerStatusRequest(container_id=c)
                ).status.resources.linux.cpuset_cpus
                for c in ls
            ]
        assert moved.count("4-15") < len(ls), "the pass finished before the kill: the test proves nothing"
        proxy, sock = _serve(tmp_path, runtime, tmp_path / "state", log)
        with CriClient(f"unix://{runtime}") as direct:

            def converged() -> bool:
                return all(
                    direct.runtime.ContainerStatus(
                        v1.ContainerStatusRequest(container_id=c)
                    ).status.resources.linux.cpuset_cpus
                    == "4-15"
                    for c in ls
                )

            _wait(converged, what="every LS container off the LSR CPUs after the restart")
            # full resources were sent, not a bare cpuset
            status = direct.runtime.ContainerStatus(v1.ContainerStatusRequest(container_id=ls[0])).status
            assert status.resources.linux.memory_limit_in_bytes == 1 << 28
        proxy.send_signal(signal.SIGTERM)
        assert proxy.wait(20) == 0
    finally:
        stop(fake)


def test_a_state_directory_that_cannot_be_written_costs_the_checkpoint_only(tmp_path: Path) -> None:
    fake, runtime = start_fake_runtime(tmp_path)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state directory's parent should be")
    log = tmp_path / "proxy.log"
    try:
        proxy, sock = _serve(tmp_path, runtime, blocker / "state", log)
        with CriClient(f"unix://{sock}") as client:
            _pod(client, "ls", {}, {})
            cid = _pod(
                client, "lsr", {"koordinator.sh/qosClass": "LSR"}, {ALLOC: json.dumps({"cpuset": "2"})}
            )
            status = client.runtime.ContainerStatus(v1.ContainerStatusRequest(container_id=cid)).status
            assert status.resources.linux.cpuset_cpus == "2"  # enforcement works in memory
        _wait(lambda: "checkpoint not written (working in memory)" in log.read_text(), what="the report")
        assert log.read_text().count("checkpoint not written") == 1  # reported once, not every half second
        proxy.send_signal(signal.SIGTERM)
        assert proxy.wait(20) == 0
    finally:
        stop(fake)


def test_the_socket_directory_must_not_be_world_writable(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    argv = serve_command(tmp_path, None, listen=shared / "proxy.sock")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert "world-writable" in out.stderr and str(shared) in out.stderr
    assert not (shared / "proxy.sock").exists()


def test_debug_logs_never_show_environment_values(tmp_path: Path) -> None:
    fake, runtime = start_fake_runtime(tmp_path)
    log = tmp_path / "proxy.log"
    try:
        proxy, sock = start_proxy(tmp_path, runtime, "--log-level", "DEBUG", log=log)
        with CriClient(f"unix://{sock}") as client:
            pb = client.pb
            config = pb.PodSandboxConfig(
                metadata=pb.PodSandboxMetadata(name="p", uid="u", namespace="d"),
                linux=pb.LinuxPodSandboxConfig(cgroup_parent="/kubepods/burstable/podu"),
            )
            sandbox = client.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config)).pod_sandbox_id
            client.runtime.CreateContainer(
                pb.CreateContainerRequest(
                    pod_sandbox_id=sandbox,
                    sandbox_config=config,
                    config=pb.ContainerConfig(
                        metadata=pb.ContainerMetadata(name="c"),
                        envs=[pb.KeyValue(key="DB_PASSWORD", value="hunter2-s3cret")],
                    ),
                )
            )
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(20)
    finally:
        stop(fake)
    text = log.read_text()
    assert "DB_PASSWORD" in text and "<redacted>" in text  # the dump is there...
    assert "hunter2-s3cret" not in text  # ...without the value
