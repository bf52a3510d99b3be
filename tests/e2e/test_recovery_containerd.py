"""Recovery against a real containerd: what a restarted proxy learns from the runtime alone."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc.aio
import pytest
from containerd import PrivateContainerd, connect, read_container_cpuset
from kube import container_config, pod_sandbox_config

from cri_api.v1 import api_pb2 as v1
from cri_proxy.enforce.recovery import Recovered, recover
from cri_proxy.state.model import ContainerRecord, ContainerState, PodRecord

pytestmark = pytest.mark.e2e

LABELS = {"koordinator.sh/qosClass": "LS", "app": "recovery"}
ANNOTATIONS = {"scheduling.koordinator.sh/resource-status": '{"numaNodeResources":[{"node":0}]}'}


def _recover(address: str, checkpoint: tuple[list[PodRecord], list[ContainerRecord]] | None) -> Recovered:
    async def main() -> Recovered:
        async with grpc.aio.insecure_channel(address) as channel:
            return await recover(channel, checkpoint)

    return asyncio.run(main())


def _pod(cri: Any, containerd: PrivateContainerd, name: str) -> tuple[str, Any]:
    config = pod_sandbox_config(
        v1, name, qos="burstable", labels=LABELS, annotations=ANNOTATIONS, log_root=containerd.pod_log_dir
    )
    pod_id = cri.runtime.RunPodSandbox(v1.RunPodSandboxRequest(config=config), timeout=30).pod_sandbox_id
    return pod_id, config


def _create(cri: Any, pod: tuple[str, Any], name: str) -> str:
    request = v1.CreateContainerRequest(
        pod_sandbox_id=pod[0], config=container_config(v1, pod[1], name), sandbox_config=pod[1]
    )
    container_id: str = cri.runtime.CreateContainer(request, timeout=30).container_id
    return container_id


def test_recover_running_and_created_containers(containerd: PrivateContainerd) -> None:
    with connect(containerd.address) as cri:
        running_pod = _pod(cri, containerd, "recover-running")
        running = _create(cri, running_pod, "app")
        cri.runtime.StartContainer(v1.StartContainerRequest(container_id=running), timeout=30)
        cri.runtime.UpdateContainerResources(
            v1.UpdateContainerResourcesRequest(
                container_id=running, linux=v1.LinuxContainerResources(cpuset_cpus="1")
            ),
            timeout=10,
        )
        assert read_container_cpuset(running_pod[1].linux.cgroup_parent, running) == "1"
        listed = _create(cri, running_pod, "listed")  # containerd echoes the text it was given
        cri.runtime.StartContainer(v1.StartContainerRequest(container_id=listed), timeout=30)
        cri.runtime.UpdateContainerResources(
            v1.UpdateContainerResourcesRequest(
                container_id=listed, linux=v1.LinuxContainerResources(cpuset_cpus="1,0")
            ),
            timeout=10,
        )
        created_pod = _pod(cri, containerd, "recover-created")
        created = _create(cri, created_pod, "waiting")

    stale = (
        [PodRecord("0" * 64, "gone", "gone", "default", "/kubepods/podgone")],
        [ContainerRecord("1" * 64, "0" * 64, "gone", b"", ContainerState.RUNNING, "0")],
    )
    result = _recover(containerd.address, stale)

    assert result.problems == []
    assert (result.dropped_pods, result.dropped_containers) == (["0" * 64], ["1" * 64])
    pods = {p.sandbox_id: p for p in result.pods}
    assert set(pods) == {running_pod[0], created_pod[0]}
    for pod_id, config in (running_pod, created_pod):
        pod = pods[pod_id]
        assert (pod.uid, pod.name, pod.namespace) == (
            config.metadata.uid,
            config.metadata.name,
            config.metadata.namespace,
        )
        assert pod.cgroup_parent == f"/kubepods/burstable/pod{config.metadata.uid}"  # from verbose info
        assert dict(pod.labels) == dict(config.labels)
        assert dict(pod.annotations) == dict(config.annotations)
        assert pod.ready

    containers = {c.id: c for c in result.containers}
    assert set(containers) == {running, listed, created}
    app, waiting = containers[running], containers[created]
    assert containers[listed].linux_resources().cpuset_cpus == "1,0"
    assert containers[listed].applied == "0-1"  # canonical
    assert (app.name, app.sandbox_id, app.state, app.applied) == (
        "app",
        running_pod[0],
        ContainerState.RUNNING,
        "1",
    )
    # containerd 1.6 reports the resources from the container's OCI spec (CRI >= 1.25 field).
    assert app.resources, "containerd reported no ContainerStatus.resources"
    resources = app.linux_resources()
    assert resources.cpuset_cpus == "1"
    assert resources.cpu_shares == 102 and resources.cpu_period == 100_000  # what kubelet asked for
    assert (waiting.name, waiting.sandbox_id, waiting.state) == (
        "waiting",
        created_pod[0],
        ContainerState.CREATED,
    )
    assert waiting.applied == ""  # kubelet set no cpuset
    assert waiting.linux_resources().cpu_shares == 102


def test_recover_skips_exited_containers_and_marks_stopped_pods(containerd: PrivateContainerd) -> None:
    with connect(containerd.address) as cri:
        pod = _pod(cri, containerd, "recover-stopped")
        container = _create(cri, pod, "app")
        cri.runtime.StartContainer(v1.StartContainerRequest(container_id=container), timeout=30)
        cri.runtime.StopPodSandbox(v1.StopPodSandboxRequest(pod_sandbox_id=pod[0]), timeout=30)

    result = _recover(containerd.address, None)
    assert [(p.sandbox_id, p.ready) for p in result.pods] == [(pod[0], False)]
    assert result.pods[0].cgroup_parent == pod[1].linux.cgroup_parent
    assert result.containers == []
