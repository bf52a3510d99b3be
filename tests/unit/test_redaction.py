"""Secrets never reach the proxy's log, at any level: a real CreateContainer through `cri-proxy serve`."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from cri_api.v1 import api_pb2 as v1
from cri_proxy.client import CriClient
from cri_proxy.redact import REDACTED, dump
from tests.processes import start_fake_runtime, start_proxy, stop

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
SECRETS = ("arg-s3cret", "cmd-s3cret", "env-s3cret", "applied-pod-s3cret", "applied-ctr-s3cret")


def _create_request(sandbox: str, config: v1.PodSandboxConfig) -> v1.CreateContainerRequest:
    return v1.CreateContainerRequest(
        pod_sandbox_id=sandbox,
        sandbox_config=config,
        config=v1.ContainerConfig(
            metadata=v1.ContainerMetadata(name="c"),
            command=["sh", "-c", "echo cmd-s3cret"],
            args=["--password=arg-s3cret"],
            envs=[v1.KeyValue(key="DB_PASSWORD", value="env-s3cret")],
            annotations={LAST_APPLIED: json.dumps({"spec": {"token": "applied-ctr-s3cret"}})},
        ),
    )


@pytest.mark.parametrize(("mode", "level"), [("frames", "DEBUG"), ("grpc", "DEBUG"), ("frames", "TRACE")])
def test_a_real_create_container_at_debug_logs_no_secret(tmp_path: Path, mode: str, level: str) -> None:
    fake, runtime = start_fake_runtime(tmp_path)
    log = tmp_path / "proxy.log"
    try:
        proxy, sock = start_proxy(tmp_path, runtime, "--log-level", level, "--relay-mode", mode, log=log)
        with CriClient(f"unix://{sock}") as client:
            config = v1.PodSandboxConfig(
                metadata=v1.PodSandboxMetadata(name="p", uid="u", namespace="d"),
                annotations={LAST_APPLIED: json.dumps({"spec": {"token": "applied-pod-s3cret"}})},
                linux=v1.LinuxPodSandboxConfig(cgroup_parent="/kubepods/burstable/podu"),
            )
            sandbox = client.runtime.RunPodSandbox(v1.RunPodSandboxRequest(config=config)).pod_sandbox_id
            cid = client.runtime.CreateContainer(_create_request(sandbox, config)).container_id
            status = client.runtime.ContainerStatus(v1.ContainerStatusRequest(container_id=cid)).status
            assert list(status.annotations) == [LAST_APPLIED]  # the runtime got it whole; only logs lose it
        proxy.send_signal(signal.SIGTERM)
        assert proxy.wait(20) == 0
    finally:
        stop(fake)
    text = log.read_text()
    assert "CreateContainer d/p c:" in text and "DB_PASSWORD" in text and LAST_APPLIED in text  # dumped
    assert REDACTED in text
    for secret in SECRETS:
        assert secret not in text, secret


def test_dump_keeps_the_shape_and_drops_every_secret() -> None:
    config = v1.PodSandboxConfig(annotations={LAST_APPLIED: "applied-pod-s3cret", "other": "kept"})
    text = dump(_create_request("sb", config))
    data = json.loads(text)
    assert data["config"]["args"] == [REDACTED]
    assert data["config"]["command"] == [REDACTED] * 3
    assert data["config"]["envs"] == [{"key": "DB_PASSWORD", "value": REDACTED}]
    assert data["config"]["annotations"] == {LAST_APPLIED: REDACTED}
    assert data["sandbox_config"]["annotations"] == {LAST_APPLIED: REDACTED, "other": "kept"}
    assert data["pod_sandbox_id"] == "sb"
    exec_sync = dump(v1.ExecSyncRequest(container_id="c", cmd=["mysql", "-pcmd-s3cret"]))
    assert json.loads(exec_sync)["cmd"] == [REDACTED, REDACTED]
    for secret in SECRETS:
        assert secret not in text + exec_sync, secret
