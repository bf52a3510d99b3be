"""Enforcement against the real containerd (2 CPUs here): what the cgroup files say.

A BE and an LS pod start on 0-1; an LSR pod allocated CPU 1 arrives: the LS container is moved to
0 before the LSR container is created, which starts on 1 (BE may share LSR CPUs, by the rules);
an LSE pod would move BE too. The LSR pod goes: LS is back on 0-1. The proxy is SIGKILLed and
restarted: nothing moves and `ctl cpusets` shows the same. kubelet's own cpuset update does not
undo the decision; a pod with a broken annotation still starts.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from conftest import ProxyProcess
from containerd import CriClient, PrivateContainerd, connect, read_container_cpuset
from kube import start_pod

pytestmark = pytest.mark.e2e

QOS = "koordinator.sh/qosClass"
ALLOC = "scheduling.koordinator.sh/resource-status"


def _start_pod(cri: CriClient, containerd: PrivateContainerd, *args: Any, **kw: Any) -> tuple[str, str, Any]:
    """`kube.start_pod` through `cri`, the pod's logs in the test bed's dir."""
    return start_pod(cri.api, cri.runtime, *args, log_root=containerd.pod_log_dir, **kw)


def _ctl_cpusets(proxy: ProxyProcess) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = proxy.ctl_json("cpusets", "-o", "json")
    return rows


def test_lsr_pod_comes_and_goes_and_the_proxy_survives_sigkill(
    containerd: PrivateContainerd, enforcer: ProxyProcess
) -> None:
    with connect(enforcer.address) as cri:
        api, rt = cri.api, cri.runtime
        _, be, be_pod = _start_pod(cri, containerd, "be", "besteffort", {QOS: "BE"})
        _, ls, ls_pod = _start_pod(cri, containerd, "ls", "burstable")
        cpus = lambda pod, cid: read_container_cpuset(pod.linux.cgroup_parent, cid)  # noqa: E731
        assert (cpus(be_pod, be), cpus(ls_pod, ls)) == ("0-1", "0-1")

        lsr_id, lsr, lsr_pod = _start_pod(
            cri,
            containerd,
            "lsr",
            "guaranteed",
            {QOS: "LSR"},
            {ALLOC: json.dumps({"cpuset": "1"})},
            start=False,
        )
        assert cpus(ls_pod, ls) == "0"  # moved before the LSR container was even created
        created = rt.ContainerStatus(api.ContainerStatusRequest(container_id=lsr), timeout=10).status
        assert created.resources.linux.cpuset_cpus == "1"  # injected into CreateContainer
        rt.StartContainer(api.StartContainerRequest(container_id=lsr), timeout=30)
        assert cpus(lsr_pod, lsr) == "1"
        assert cpus(be_pod, be) == "0-1"  # BE may run on LSR CPUs (cpuset-rules.md, Pools)

        # kubelet's static CPU manager re-sends its own view: the decision stays
        rt.UpdateContainerResources(
            api.UpdateContainerResourcesRequest(
                container_id=ls, linux=api.LinuxContainerResources(cpuset_cpus="0-1")
            ),
            timeout=30,
        )
        assert cpus(ls_pod, ls) == "0"

        before = _ctl_cpusets(enforcer)
        assert {r["id"]: r["applied"] for r in before} == {be: "0-1", ls: "0", lsr: "1"}
        enforcer.kill()
    enforcer.start()  # the same state dir and socket path: a stale socket, a checkpoint
    assert _ctl_cpusets(enforcer) == before
    assert (cpus(be_pod, be), cpus(ls_pod, ls), cpus(lsr_pod, lsr)) == ("0-1", "0", "1")

    with connect(enforcer.address) as cri:
        api, rt = cri.api, cri.runtime
        rt.StopPodSandbox(api.StopPodSandboxRequest(pod_sandbox_id=lsr_id), timeout=30)
        rt.RemovePodSandbox(api.RemovePodSandboxRequest(pod_sandbox_id=lsr_id), timeout=30)
        deadline = time.monotonic() + 30
        while cpus(ls_pod, ls) != "0-1" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cpus(ls_pod, ls) == "0-1"  # back on every CPU once the LSR pod is gone


def test_lse_pod_moves_be_off_its_cpus(containerd: PrivateContainerd, enforcer: ProxyProcess) -> None:
    with connect(enforcer.address) as cri:
        _, be, be_pod = _start_pod(cri, containerd, "be", "besteffort")
        _, lse, lse_pod = _start_pod(
            cri, containerd, "lse", "guaranteed", {QOS: "LSE"}, {ALLOC: json.dumps({"cpuset": "0"})}
        )
        assert read_container_cpuset(lse_pod.linux.cgroup_parent, lse) == "0"
        assert read_container_cpuset(be_pod.linux.cgroup_parent, be) == "1"


def test_a_pod_with_a_broken_annotation_still_starts(
    containerd: PrivateContainerd, enforcer: ProxyProcess
) -> None:
    with connect(enforcer.address) as cri:
        _, cid, pod = _start_pod(cri, containerd, "broken", "burstable", {QOS: "LSR"}, {ALLOC: '{"cpuset": '})
        status = cri.runtime.ContainerStatus(cri.api.ContainerStatusRequest(container_id=cid), timeout=10)
        assert status.status.state == cri.api.CONTAINER_RUNNING
        assert read_container_cpuset(pod.linux.cgroup_parent, cid) == "0-1"  # the LS rule, annotation ignored
    problems = enforcer.ctl_json("plan")["problems"]
    assert {p["kind"] for p in problems} >= {"bad-annotation", "missing-cpuset"}


def test_the_same_through_runtime_v1alpha2(containerd: PrivateContainerd, enforcer: ProxyProcess) -> None:
    with connect(enforcer.address, "v1alpha2") as cri:
        _, ls, ls_pod = _start_pod(cri, containerd, "ls", "burstable")
        _, lsr, lsr_pod = _start_pod(
            cri, containerd, "lsr", "burstable", {QOS: "LSR"}, {ALLOC: json.dumps({"cpuset": "0"})}
        )
        assert read_container_cpuset(lsr_pod.linux.cgroup_parent, lsr) == "0"
        assert read_container_cpuset(ls_pod.linux.cgroup_parent, ls) == "1"
