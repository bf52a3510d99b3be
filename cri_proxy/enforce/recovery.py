"""Recovery after a restart: rebuild the node state from the runtime, filling gaps from the checkpoint.

The runtime is the truth for what exists: checkpoint entries it no longer has are dropped. The
checkpoint only fills what the runtime cannot say: a cgroup parent the sandbox status does not show,
and the resources of a container whose runtime predates `ContainerStatus.resources` (CRI < 1.25).
A runtime that cannot be reached raises (the caller retries); a container that vanished between the
listing and its status is skipped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import grpc.aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from cri_proxy.cpu import CPUSet
from cri_proxy.errors import CpuError
from cri_proxy.state.model import ContainerRecord, ContainerState, PodRecord

CRIO_CGROUP_PARENT = "io.kubernetes.cri-o.CgroupParent"
CONCURRENCY = 16

T = TypeVar("T")
R = TypeVar("R")
Checkpoint = tuple[list[PodRecord], list[ContainerRecord]]

_LIVE = {v1.CONTAINER_CREATED: ContainerState.CREATED, v1.CONTAINER_RUNNING: ContainerState.RUNNING}


@dataclass(frozen=True)
class Recovered:
    """What the runtime has, as records; `problems` are one line each, for people."""

    pods: list[PodRecord]
    containers: list[ContainerRecord]
    problems: list[str] = field(default_factory=list)
    dropped_pods: list[str] = field(default_factory=list)  # checkpoint sandbox ids the runtime lacks
    dropped_containers: list[str] = field(default_factory=list)  # checkpoint container ids likewise


async def recover(
    channel: grpc.aio.Channel, checkpoint: Checkpoint | None, timeout: float = 10.0
) -> Recovered:
    """Ask the runtime (runtime.v1 on `channel`) for every sandbox and live container."""
    stub: Any = v1_grpc.RuntimeServiceStub  # generated without annotations
    runtime = stub(channel)
    old_pods = {p.sandbox_id: p for p in checkpoint[0]} if checkpoint else {}
    old_containers = {c.id: c for c in checkpoint[1]} if checkpoint else {}
    problems: list[str] = []

    # Containers first: a container listed now has its sandbox in the sandbox listing that follows,
    # unless the sandbox went away meanwhile, and then the container is gone too.
    listed = (await runtime.ListContainers(v1.ListContainersRequest(), timeout=timeout)).containers
    sandboxes = (await runtime.ListPodSandbox(v1.ListPodSandboxRequest(), timeout=timeout)).items

    async def pod_status(sandbox_id: str) -> PodRecord | None:
        request = v1.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True)
        response = await _unless_not_found(runtime.PodSandboxStatus(request, timeout=timeout))
        if response is None:
            return None
        return _pod_record(response, old_pods.get(sandbox_id), problems)

    pods = [p for p in await _bounded(pod_status, [s.id for s in sandboxes]) if p is not None]
    known = {p.sandbox_id for p in pods}

    async def container_status(item: tuple[str, str]) -> ContainerRecord | None:
        container_id, sandbox_id = item
        request = v1.ContainerStatusRequest(container_id=container_id)
        response = await _unless_not_found(runtime.ContainerStatus(request, timeout=timeout))
        if response is None:
            return None
        old = old_containers.get(container_id)
        return _container_record(response.status, sandbox_id, old, problems)

    for c in listed:
        if c.state == v1.CONTAINER_UNKNOWN:
            problems.append(f"container {c.metadata.name} ({c.id[:13]}): the runtime reports state unknown")
    live = [(c.id, c.pod_sandbox_id) for c in listed if c.state in _LIVE and c.pod_sandbox_id in known]
    containers = [c for c in await _bounded(container_status, live) if c is not None]
    have = {c.id for c in containers}
    return Recovered(
        pods=pods,
        containers=containers,
        problems=problems,
        dropped_pods=sorted(set(old_pods) - known),
        dropped_containers=sorted(set(old_containers) - have),
    )


def _pod_record(response: Any, old: PodRecord | None, problems: list[str]) -> PodRecord:
    status = response.status
    meta = status.metadata
    parent = cgroup_parent_from_info(response.info)
    if not parent:
        if old is not None:
            parent = old.cgroup_parent
        else:
            problems.append(
                f"pod {meta.namespace}/{meta.name} (sandbox {status.id[:13]}): the runtime shows no "
                "cgroup parent and the checkpoint has none; the pod is left unmanaged"
            )
    return PodRecord(
        sandbox_id=status.id,
        uid=meta.uid,
        name=meta.name,
        namespace=meta.namespace,
        cgroup_parent=parent,
        labels=dict(status.labels),
        annotations=dict(status.annotations),
        ready=status.state == v1.SANDBOX_READY,
        api_version=old.api_version if old is not None else "v1",
    )


def _container_record(
    status: Any, sandbox_id: str, old: ContainerRecord | None, problems: list[str]
) -> ContainerRecord | None:
    state = _LIVE.get(status.state)
    if state is None:  # exited between the listing and the status
        return None
    if status.HasField("resources") and status.resources.HasField("linux"):
        linux = status.resources.linux
        resources: bytes = linux.SerializeToString()
        applied: str | None = canonical_cpuset(linux.cpuset_cpus)
    elif old is not None:
        resources, applied = old.resources, old.applied
    else:
        resources, applied = b"", None
        problems.append(
            f"container {status.metadata.name} ({status.id[:13]}): the runtime reports no resources "
            "and the checkpoint has none; its cpuset cannot be changed safely"
        )
    return ContainerRecord(
        id=status.id,
        sandbox_id=sandbox_id,
        name=status.metadata.name,
        resources=resources,
        state=state,
        applied=applied,
        attempt=status.metadata.attempt,
        api_version=old.api_version if old is not None else "v1",
    )


def cgroup_parent_from_info(info: Any) -> str:
    """The sandbox's cgroup parent from a verbose `PodSandboxStatus` info map; "" when not shown."""
    try:
        doc = json.loads(info.get("info", ""))
    except ValueError:
        return ""
    parent = _dig(doc, "config", "linux", "cgroup_parent")  # containerd
    if not isinstance(parent, str) or not parent:
        parent = _dig(doc, "runtimeSpec", "annotations", CRIO_CGROUP_PARENT)  # CRI-O
    return parent if isinstance(parent, str) else ""


def canonical_cpuset(text: str) -> str:
    """The canonical form of a CPU list; the text itself when it does not parse."""
    try:
        return str(CPUSet.parse(text))
    except CpuError:
        return text


def _dig(doc: object, *keys: str) -> object:
    for key in keys:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


async def _unless_not_found(call: Awaitable[T]) -> T | None:
    try:
        return await call
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise


async def _bounded(fn: Callable[[T], Awaitable[R]], items: Iterable[T], limit: int = CONCURRENCY) -> list[R]:
    """`fn` over `items`, at most `limit` at a time; the first error cancels the rest and is raised."""
    gate = asyncio.Semaphore(limit)

    async def one(item: T) -> R:
        async with gate:
            return await fn(item)

    tasks = [asyncio.ensure_future(one(item)) for item in items]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
