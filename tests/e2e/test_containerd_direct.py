"""The test bed itself, straight against the private containerd (no proxy in between).

If this fails, every proxy end-to-end test would fail for reasons that are not the proxy's: it pins
down that pods, containers, exec and cpuset updates work on this machine, on both CRI versions.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from containerd import CriClient, PrivateContainerd, connect, read_container_cpuset
from kube import CONTAINER_NAME, POD_UID, container_config, pod_sandbox_config, start_pod

pytestmark = pytest.mark.e2e


def _proc_cpus_allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for pid {pid}")


def test_pod_lifecycle_and_cpuset_update(containerd: PrivateContainerd, containerd_cri: CriClient) -> None:
    api, rt = containerd_cri.api, containerd_cri.runtime

    version = rt.Version(api.VersionRequest(version=containerd_cri.version), timeout=5)
    assert version.runtime_name == "containerd"
    assert version.runtime_api_version == containerd_cri.version
    assert version.version and version.runtime_version

    pod = pod_sandbox_config(
        api,
        "direct",
        qos="burstable",
        labels={"app": "direct"},
        annotations={"example.com/note": "kept as is"},
        log_root=containerd.pod_log_dir,
    )
    parent = pod.linux.cgroup_parent
    assert parent == f"/kubepods/burstable/pod{pod.metadata.uid}"
    pod_id = rt.RunPodSandbox(api.RunPodSandboxRequest(config=pod), timeout=30).pod_sandbox_id

    status = rt.PodSandboxStatus(api.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True), timeout=5)
    assert status.status.state == api.SANDBOX_READY
    assert dict(status.status.labels) == dict(pod.labels)
    assert dict(status.status.annotations) == dict(pod.annotations)
    assert json.loads(status.info["info"])["config"]["linux"]["cgroup_parent"] == parent

    config = container_config(api, pod, "sleeper")
    ctr_id = rt.CreateContainer(
        api.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod), timeout=30
    ).container_id
    rt.StartContainer(api.StartContainerRequest(container_id=ctr_id), timeout=30)

    cstatus = rt.ContainerStatus(api.ContainerStatusRequest(container_id=ctr_id, verbose=True), timeout=5)
    assert cstatus.status.state == api.CONTAINER_RUNNING
    assert cstatus.status.labels[CONTAINER_NAME] == "sleeper"
    assert cstatus.status.labels[POD_UID] == pod.metadata.uid
    pid = json.loads(cstatus.info["info"])["pid"]

    out = rt.ExecSync(api.ExecSyncRequest(container_id=ctr_id, cmd=["echo", "hi"], timeout=10), timeout=15)
    assert (out.exit_code, out.stdout, out.stderr) == (0, b"hi\n", b"")

    rt.UpdateContainerResources(
        api.UpdateContainerResourcesRequest(
            container_id=ctr_id, linux=api.LinuxContainerResources(cpuset_cpus="0")
        ),
        timeout=10,
    )
    assert read_container_cpuset(parent, ctr_id) == "0"
    assert _proc_cpus_allowed(pid) == "0"

    rt.StopContainer(api.StopContainerRequest(container_id=ctr_id, timeout=10), timeout=30)
    cstatus = rt.ContainerStatus(api.ContainerStatusRequest(container_id=ctr_id), timeout=5)
    assert cstatus.status.state == api.CONTAINER_EXITED
    rt.RemoveContainer(api.RemoveContainerRequest(container_id=ctr_id), timeout=30)

    rt.StopPodSandbox(api.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)
    rt.RemovePodSandbox(api.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)
    left = rt.ListPodSandbox(api.ListPodSandboxRequest(), timeout=5).items
    assert pod_id not in {item.id for item in left}


@pytest.mark.parametrize("how", ["restart", "crash"])
def test_containers_survive_containerd_restart(containerd: PrivateContainerd, how: str) -> None:
    """Fault tests stop and restart containerd under the proxy: the bed must bring it back intact.

    The pod is left for the per-test cleanup on purpose: that path is exercised too.
    """
    with connect(containerd.address) as cri:
        api, rt = cri.api, cri.runtime
        _, ctr_id, _ = start_pod(api, rt, f"survivor-{how}", "guaranteed", log_root=containerd.pod_log_dir)
        verbose = api.ContainerStatusRequest(container_id=ctr_id, verbose=True)
        pid = json.loads(rt.ContainerStatus(verbose, timeout=5).info["info"])["pid"]

    old_daemon = containerd.pid
    if how == "restart":
        containerd.restart()
    else:
        containerd.kill()
        assert not containerd.running
        containerd.start_daemon()
    assert containerd.running and containerd.pid != old_daemon

    # A new channel: an old one may still be backing off from the dropped connection.
    with connect(containerd.address) as cri:
        api, rt = cri.api, cri.runtime
        status = rt.ContainerStatus(verbose, timeout=5)
        assert status.status.state == api.CONTAINER_RUNNING
        assert json.loads(status.info["info"])["pid"] == pid
        out = rt.ExecSync(
            api.ExecSyncRequest(container_id=ctr_id, cmd=["cat", "/proc/1/comm"], timeout=10), timeout=15
        )
        assert out.stdout == b"sleep\n"


def test_the_bed_ends_the_shims_its_containerd_lost(e2e_tools: None, tmp_path: Path) -> None:
    """A shim containerd lost track of (and the process under it) outlives every removal through
    containerd: the bed's stop ends it, and warns, rather than leave it on the machine."""
    bed = PrivateContainerd().start()
    try:
        # a stand-in shim by name and arguments, with a child as a container's process would be
        shim = subprocess.Popen(
            ["/usr/bin/containerd-shim-runc-v2", "-c", "sleep 120 & wait", "-address", str(bed.socket_path)],
            executable="/bin/sh",
        )
        child = _wait_for_child(shim.pid)
    finally:
        with pytest.warns(UserWarning, match="left 1 shims"):
            bed.stop()
    assert shim.wait(10) == -signal.SIGKILL
    assert _gone_or_zombie(child), f"the shim's child {child} still runs"


def _wait_for_child(pid: int, within: float = 10.0) -> int:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.02)
    raise AssertionError(f"no child under {pid} within {within} s")


def _gone_or_zombie(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False
