"""Kubelet-like CRI request builders for the end-to-end tests.

The proxy decides placement from what kubelet puts in CRI (labels, annotations, the QoS class hidden in
``cgroup_parent``, container resources), so the tests must send what kubelet sends, not a minimal
request. Every builder takes the generated ``api_pb2`` module (``cri_api.v1`` or ``cri_api.v1alpha2``:
same message names and numbers), so one test runs on both API versions.

Host-network pods only: the machines have no CNI, and kubelet sets no hostname for such pods (runc
refuses one without a private UTS namespace).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

QoS = Literal["guaranteed", "burstable", "besteffort"]
QOS_CLASSES: tuple[QoS, ...] = ("guaranteed", "burstable", "besteffort")

POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_UID = "io.kubernetes.pod.uid"
CONTAINER_NAME = "io.kubernetes.container.name"

DEFAULT_IMAGE = "localhost/busybox:latest"
DEFAULT_COMMAND = ("sleep", "3600")
CPU_PERIOD = 100_000  # kubelet's CFS period (µs)
MIN_SHARES = 2
MEM_GUARANTEED = 64 << 20


def cgroup_parent(qos: QoS, uid: str) -> str:
    """The pod cgroup kubelet (cgroupfs driver) hands to the runtime: the QoS class is read from it."""
    if qos == "guaranteed":
        return f"/kubepods/pod{uid}"
    if qos in ("burstable", "besteffort"):
        return f"/kubepods/{qos}/pod{uid}"
    raise ValueError(f"unknown QoS class {qos!r}; expected one of {QOS_CLASSES}")


def milli_cpu_to_shares(milli: int) -> int:
    """kubelet's cpu.shares for a CPU request (1 CPU = 1024 shares, at least 2)."""
    return max(MIN_SHARES, milli * 1024 // 1000) if milli else MIN_SHARES


def linux_resources(
    api: ModuleType,
    qos: QoS = "burstable",
    *,
    cpu_request_milli: int | None = None,
    cpu_limit_milli: int | None = None,
    memory_limit: int | None = None,
    cpuset_cpus: str = "",
) -> Any:
    """``LinuxContainerResources`` as kubelet fills them for a container of the given QoS class.

    Defaults: guaranteed = 1 CPU and 64 MiB (requests = limits), burstable = 100m CPU request and no
    limits, besteffort = nothing but the minimal shares.
    """
    if qos == "guaranteed":
        request = limit = cpu_limit_milli or cpu_request_milli or 1000
        if cpu_request_milli and cpu_limit_milli and cpu_request_milli != cpu_limit_milli:
            raise ValueError("a guaranteed container has CPU request == limit")
        memory = memory_limit or MEM_GUARANTEED
        oom_score_adj = -997
    elif qos == "burstable":
        request = cpu_request_milli if cpu_request_milli is not None else 100
        limit = cpu_limit_milli or 0
        memory = memory_limit or 0
        oom_score_adj = 999  # kubelet: 1000 - 1000 * memory request / node memory, clamped to [2, 999]
    elif qos == "besteffort":
        if cpu_request_milli or cpu_limit_milli or memory_limit:
            raise ValueError("a besteffort container has no requests or limits")
        request = limit = memory = 0
        oom_score_adj = 1000
    else:
        raise ValueError(f"unknown QoS class {qos!r}; expected one of {QOS_CLASSES}")
    return api.LinuxContainerResources(
        cpu_period=CPU_PERIOD,
        cpu_quota=limit * CPU_PERIOD // 1000 if limit else 0,
        cpu_shares=milli_cpu_to_shares(request),
        memory_limit_in_bytes=memory,
        oom_score_adj=oom_score_adj,
        cpuset_cpus=cpuset_cpus,
    )


def _host_network_namespaces(api: ModuleType) -> Any:
    return api.NamespaceOption(network=api.NODE, pid=api.CONTAINER, ipc=api.POD)


def pod_sandbox_config(
    api: ModuleType,
    name: str,
    *,
    qos: QoS = "burstable",
    namespace: str = "default",
    uid: str | None = None,
    attempt: int = 0,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    log_root: str | Path | None = None,
) -> Any:
    """A ``PodSandboxConfig`` for a host-network pod, as kubelet builds it.

    Labels: the pod's labels plus name/namespace/uid. Annotations: the pod's, unchanged (kubelet adds
    its config.seen/config.source ones, the pod's own win). ``log_root`` stands for /var/log/pods: pass
    ``containerd.pod_log_dir`` so container logs stay in the test bed's private dir; without it no
    ``log_directory`` is set (and container configs get no ``log_path``).
    """
    uid = uid or str(uuid.uuid4())
    all_labels = {**(labels or {}), POD_NAME: name, POD_NAMESPACE: namespace, POD_UID: uid}
    all_annotations = {
        "kubernetes.io/config.seen": time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime()),
        "kubernetes.io/config.source": "api",
        **(annotations or {}),
    }
    return api.PodSandboxConfig(
        metadata=api.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=attempt),
        log_directory=str(Path(log_root) / f"{namespace}_{name}_{uid}") if log_root else "",
        labels=all_labels,
        annotations=all_annotations,
        linux=api.LinuxPodSandboxConfig(
            cgroup_parent=cgroup_parent(qos, uid),
            security_context=api.LinuxSandboxSecurityContext(
                namespace_options=_host_network_namespaces(api),
            ),
        ),
    )


def container_config(
    api: ModuleType,
    pod: Any,
    name: str,
    *,
    image: str = DEFAULT_IMAGE,
    command: Sequence[str] = DEFAULT_COMMAND,
    args: Sequence[str] = (),
    resources: Any | None = None,
    qos: QoS | None = None,
    attempt: int = 0,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> Any:
    """A ``ContainerConfig`` for a container of ``pod`` (a ``PodSandboxConfig``), as kubelet builds it.

    ``resources`` defaults to ``linux_resources(api, qos)`` with ``qos`` read from the pod's cgroup
    parent. Labels: the pod's three identity labels plus the container name.
    """
    meta = pod.metadata
    if resources is None:
        resources = linux_resources(api, qos or qos_of(pod.linux.cgroup_parent))
    all_labels = {
        **(labels or {}),
        POD_NAME: meta.name,
        POD_NAMESPACE: meta.namespace,
        POD_UID: meta.uid,
        CONTAINER_NAME: name,
    }
    all_annotations = {
        "io.kubernetes.container.hash": f"{uuid.uuid5(uuid.NAMESPACE_OID, name).int % (1 << 32):08x}",
        "io.kubernetes.container.restartCount": str(attempt),
        "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
        "io.kubernetes.container.terminationMessagePolicy": "File",
        "io.kubernetes.pod.terminationGracePeriod": "30",
        **(annotations or {}),
    }
    return api.ContainerConfig(
        metadata=api.ContainerMetadata(name=name, attempt=attempt),
        image=api.ImageSpec(image=image),
        command=list(command),
        args=list(args),
        labels=all_labels,
        annotations=all_annotations,
        log_path=f"{name}/{attempt}.log" if pod.log_directory else "",
        linux=api.LinuxContainerConfig(
            resources=resources,
            security_context=api.LinuxContainerSecurityContext(
                namespace_options=_host_network_namespaces(api),
            ),
        ),
    )


def qos_of(parent: str) -> QoS:
    """The QoS class kubelet encoded in a pod's cgroup parent."""
    parts = parent.strip("/").split("/")
    if len(parts) >= 2 and parts[1] in ("burstable", "besteffort"):
        return "burstable" if parts[1] == "burstable" else "besteffort"
    return "guaranteed"


def start_pod(
    api: ModuleType,
    rt: Any,
    name: str,
    qos: QoS = "burstable",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    *,
    uid: str | None = None,
    log_root: str | Path | None = None,
    start: bool = True,
    timeout: float = 30,
) -> tuple[str, str, Any]:
    """A pod with one container ``app``, as kubelet runs it through ``rt`` (a RuntimeService stub):
    RunPodSandbox, CreateContainer and (``start``) StartContainer. Returns (pod id, container id,
    the ``PodSandboxConfig``)."""
    pod = pod_sandbox_config(
        api, name, qos=qos, uid=uid, labels=labels, annotations=annotations, log_root=log_root
    )
    pod_id = rt.RunPodSandbox(api.RunPodSandboxRequest(config=pod), timeout=timeout).pod_sandbox_id
    cid = run_container(api, rt, (pod_id, pod), "app", start=start, timeout=timeout)
    return str(pod_id), cid, pod


def run_container(
    api: ModuleType,
    rt: Any,
    pod: tuple[str, Any],
    name: str,
    *,
    start: bool = True,
    timeout: float = 30,
    **kw: Any,
) -> str:
    """CreateContainer (and StartContainer) of `name` in `pod` (its id and config) through `rt` (a
    RuntimeService stub), as kubelet sends them; `kw` goes to `container_config`."""
    request = api.CreateContainerRequest(
        pod_sandbox_id=pod[0], config=container_config(api, pod[1], name, **kw), sandbox_config=pod[1]
    )
    cid: str = rt.CreateContainer(request, timeout=timeout).container_id
    if start:
        rt.StartContainer(api.StartContainerRequest(container_id=cid), timeout=timeout)
    return cid


def create(
    cri: Any, pod: tuple[str, Any], name: str, *, start: bool = True, timeout: float = 30, **kw: Any
) -> str:
    """`run_container` through `cri` (a `containerd.CriClient`)."""
    return run_container(cri.api, cri.runtime, pod, name, start=start, timeout=timeout, **kw)
