"""Through the proxy, a CRI client sees exactly what it sees straight from containerd.

Every call here goes kubelet-like client -> `cri-proxy serve` (a real process) -> the private
containerd, on runtime.v1 and runtime.v1alpha2.
"""

from __future__ import annotations

import json
import time

import grpc
import pytest
from containerd import CriClient, PrivateContainerd, connect, read_container_cpuset
from kube import CONTAINER_NAME, DEFAULT_IMAGE, POD_UID, container_config, pod_sandbox_config

pytestmark = pytest.mark.e2e


def test_pod_and_container_lifecycle_through_the_proxy(
    containerd: PrivateContainerd, proxy_cri: CriClient
) -> None:
    api, rt = proxy_cri.api, proxy_cri.runtime

    version = rt.Version(api.VersionRequest(version=proxy_cri.version), timeout=5)
    assert (version.runtime_name, version.runtime_api_version) == ("containerd", proxy_cri.version)
    assert version.version and version.runtime_version

    pod = pod_sandbox_config(
        api,
        "relayed",
        qos="burstable",
        labels={"app": "relayed"},
        annotations={"scheduling.koordinator.sh/resource-status": '{"cpuset": "1"}'},
        log_root=containerd.pod_log_dir,
    )
    pod_id = rt.RunPodSandbox(api.RunPodSandboxRequest(config=pod), timeout=30).pod_sandbox_id
    status = rt.PodSandboxStatus(api.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True), timeout=5)
    assert status.status.state == api.SANDBOX_READY
    assert dict(status.status.annotations) == dict(pod.annotations)
    assert json.loads(status.info["info"])["config"]["linux"]["cgroup_parent"] == pod.linux.cgroup_parent

    config = container_config(api, pod, "app")
    ctr_id = rt.CreateContainer(
        api.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod), timeout=30
    ).container_id
    rt.StartContainer(api.StartContainerRequest(container_id=ctr_id), timeout=30)

    # List calls with each kind of filter
    running = api.ContainerStateValue(state=api.CONTAINER_RUNNING)
    listed = rt.ListContainers(
        api.ListContainersRequest(
            filter=api.ContainerFilter(
                pod_sandbox_id=pod_id, state=running, label_selector={CONTAINER_NAME: "app"}
            )
        ),
        timeout=5,
    ).containers
    assert [c.id for c in listed] == [ctr_id]
    by_prefix = rt.ListContainers(
        api.ListContainersRequest(filter=api.ContainerFilter(id=ctr_id[:12])), timeout=5
    )
    assert [c.id for c in by_prefix.containers] == [ctr_id]
    exited = api.ContainerStateValue(state=api.CONTAINER_EXITED)
    assert not rt.ListContainers(
        api.ListContainersRequest(filter=api.ContainerFilter(pod_sandbox_id=pod_id, state=exited)), timeout=5
    ).containers
    pods = rt.ListPodSandbox(
        api.ListPodSandboxRequest(
            filter=api.PodSandboxFilter(
                label_selector={POD_UID: pod.metadata.uid},
                state=api.PodSandboxStateValue(state=api.SANDBOX_READY),
            )
        ),
        timeout=5,
    ).items
    assert [p.id for p in pods] == [pod_id]

    cstatus = rt.ContainerStatus(api.ContainerStatusRequest(container_id=ctr_id), timeout=5)
    assert cstatus.status.state == api.CONTAINER_RUNNING
    out = rt.ExecSync(
        api.ExecSyncRequest(container_id=ctr_id, cmd=["echo", "through", "proxy"], timeout=10), timeout=15
    )
    assert (out.exit_code, out.stdout) == (0, b"through proxy\n")
    fail = rt.ExecSync(
        api.ExecSyncRequest(container_id=ctr_id, cmd=["sh", "-c", "exit 3"], timeout=10), timeout=15
    )
    assert fail.exit_code == 3

    rt.UpdateContainerResources(
        api.UpdateContainerResourcesRequest(
            container_id=ctr_id, linux=api.LinuxContainerResources(cpuset_cpus="1")
        ),
        timeout=10,
    )
    assert read_container_cpuset(pod.linux.cgroup_parent, ctr_id) == "1"
    rt.UpdateContainerResources(
        api.UpdateContainerResourcesRequest(
            container_id=ctr_id, linux=api.LinuxContainerResources(cpuset_cpus="0-1")
        ),
        timeout=10,
    )
    assert read_container_cpuset(pod.linux.cgroup_parent, ctr_id) == "0-1"

    rt.StopContainer(api.StopContainerRequest(container_id=ctr_id, timeout=10), timeout=30)
    assert (
        rt.ContainerStatus(api.ContainerStatusRequest(container_id=ctr_id), timeout=5).status.state
        == api.CONTAINER_EXITED
    )
    rt.RemoveContainer(api.RemoveContainerRequest(container_id=ctr_id), timeout=30)
    rt.StopPodSandbox(api.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)
    rt.RemovePodSandbox(api.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)
    assert pod_id not in {p.id for p in rt.ListPodSandbox(api.ListPodSandboxRequest(), timeout=5).items}


def test_image_service_through_the_proxy(via_proxy_and_direct: tuple[CriClient, CriClient]) -> None:
    proxy_cri, containerd_cri = via_proxy_and_direct
    api = proxy_cri.api
    via_proxy = proxy_cri.image.ListImages(api.ListImagesRequest(), timeout=5)
    direct = containerd_cri.image.ListImages(containerd_cri.api.ListImagesRequest(), timeout=5)
    assert via_proxy.SerializeToString(deterministic=True) == direct.SerializeToString(deterministic=True)
    assert any(DEFAULT_IMAGE in img.repo_tags for img in via_proxy.images)
    status = proxy_cri.image.ImageStatus(
        api.ImageStatusRequest(image=api.ImageSpec(image=DEFAULT_IMAGE)), timeout=5
    )
    assert DEFAULT_IMAGE in status.image.repo_tags
    missing = proxy_cri.image.ImageStatus(
        api.ImageStatusRequest(image=api.ImageSpec(image="localhost/not-here:1")), timeout=5
    )
    assert not missing.HasField("image")
    fs = proxy_cri.image.ImageFsInfo(api.ImageFsInfoRequest(), timeout=5)
    fs_direct = containerd_cri.image.ImageFsInfo(containerd_cri.api.ImageFsInfoRequest(), timeout=5)
    # the same filesystems as containerd says directly (its usage figures are refreshed in the
    # background, from 0 in a fresh containerd: they are compared as present, not as values)
    assert [f.fs_id.mountpoint for f in fs.image_filesystems] == [
        f.fs_id.mountpoint for f in fs_direct.image_filesystems
    ]
    assert fs.image_filesystems and all(f.HasField("used_bytes") for f in fs.image_filesystems)


def _error(call: object) -> grpc.RpcError:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("the call succeeded")


def test_errors_come_back_unchanged(via_proxy_and_direct: tuple[CriClient, CriClient]) -> None:
    proxy_cri, containerd_cri = via_proxy_and_direct
    api = proxy_cri.api
    req = api.ContainerStatusRequest(container_id="0123456789abcdef-does-not-exist")
    via_proxy = _error(lambda: proxy_cri.runtime.ContainerStatus(req, timeout=5))
    direct = _error(lambda: containerd_cri.runtime.ContainerStatus(req, timeout=5))
    assert via_proxy.code() is grpc.StatusCode.NOT_FOUND
    assert (via_proxy.code(), via_proxy.details()) == (direct.code(), direct.details())


def test_a_method_our_proto_does_not_know_gets_the_runtimes_answer(
    proxy: object, containerd: PrivateContainerd, proxy_cri: CriClient
) -> None:
    path = f"/runtime.{proxy_cri.version}.RuntimeService/SomeMethodFromAFutureKubelet"
    via_proxy = _error(lambda: proxy_cri.channel.unary_unary(path)(b"\x0a\x01x", timeout=5))
    with connect(containerd.address, proxy_cri.version) as direct_cri:
        direct = _error(lambda: direct_cri.channel.unary_unary(path)(b"\x0a\x01x", timeout=5))
    assert via_proxy.code() is grpc.StatusCode.UNIMPLEMENTED
    assert (via_proxy.code(), via_proxy.details()) == (direct.code(), direct.details())


def test_same_listing_through_the_proxy_as_direct(
    containerd: PrivateContainerd, via_proxy_and_direct: tuple[CriClient, CriClient]
) -> None:
    proxy_cri, containerd_cri = via_proxy_and_direct
    api = proxy_cri.api
    pod = pod_sandbox_config(api, "listed", qos="besteffort", log_root=containerd.pod_log_dir)
    pod_id = proxy_cri.runtime.RunPodSandbox(api.RunPodSandboxRequest(config=pod), timeout=30).pod_sandbox_id
    proxy_cri.runtime.CreateContainer(
        api.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=container_config(api, pod, "c"), sandbox_config=pod
        ),
        timeout=30,
    )
    for method, request in (
        ("ListPodSandbox", api.ListPodSandboxRequest()),
        ("ListContainers", api.ListContainersRequest()),
        ("Status", api.StatusRequest()),
        ("ListContainerStats", api.ListContainerStatsRequest()),
    ):
        a = getattr(proxy_cri.runtime, method)(request, timeout=5)
        b = getattr(containerd_cri.runtime, method)(request, timeout=5)
        if method == "ListContainerStats":  # stats carry timestamps: compare who is listed
            assert sorted(s.attributes.id for s in a.stats) == sorted(s.attributes.id for s in b.stats)
        else:
            assert a == b, method


def test_container_events_stream_through_the_proxy(
    containerd: PrivateContainerd, via_proxy_and_direct: tuple[CriClient, CriClient]
) -> None:
    proxy_cri, containerd_cri = via_proxy_and_direct
    """containerd 1.6 may not serve GetContainerEvents: then the proxy must give the same answer."""
    api = proxy_cri.api
    stream = proxy_cri.runtime.GetContainerEvents(api.GetEventsRequest(), timeout=20)
    direct = containerd_cri.runtime.GetContainerEvents(containerd_cri.api.GetEventsRequest(), timeout=20)
    time.sleep(0.3)
    pod = pod_sandbox_config(api, "evented", qos="burstable", log_root=containerd.pod_log_dir)
    pod_id = proxy_cri.runtime.RunPodSandbox(api.RunPodSandboxRequest(config=pod), timeout=30).pod_sandbox_id
    try:
        first = next(iter(stream))
    except grpc.RpcError as exc:
        direct_error = _error(lambda: next(iter(direct)))
        assert (exc.code(), exc.details()) == (direct_error.code(), direct_error.details())
        return
    finally:
        stream.cancel()
        direct.cancel()
    assert first.pod_sandbox_status.id == pod_id or first.container_id
