"""What the runtime has right now, for the views: every container it lists, and the cpuset each
really has (its cgroup where it can be read, else ContainerStatus). Read at view time, so a view
is never staler than the call that asked for it. Replies are read leniently (`lenient`): one
label that is not UTF-8 must not blank a view."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc.aio

from cri_api.v1 import api_pb2 as v1
from cri_proxy.enforce import lenient
from cri_proxy.enforce.recovery import canonical_cpuset
from cri_proxy.sources.cgroupfs import CgroupReader
from cri_proxy.state.model import ACTUAL_CGROUP, ACTUAL_STATUS, NodeState

NAMESPACE_LABEL = "io.kubernetes.pod.namespace"
NAME_LABEL = "io.kubernetes.pod.name"
STATES = {
    v1.CONTAINER_CREATED: "created",
    v1.CONTAINER_RUNNING: "running",
    v1.CONTAINER_EXITED: "exited",
    v1.CONTAINER_UNKNOWN: "unknown",
}


@dataclass(frozen=True, slots=True)
class Seen:
    """One container as the runtime lists it; `actual` None: nothing says what it has."""

    id: str
    sandbox_id: str
    name: str
    pod: str | None  # namespace/name from the runtime's labels (None when it has none)
    state: str
    actual: str | None = None
    source: str = ""  # where `actual` was read: "cgroup" or "status"


ReadActual = Callable[[str, str], Awaitable[tuple[str, str] | None]]
"""(container id, sandbox id) -> (canonical cpuset, source) it really has, or None."""

Observe = Callable[[], Awaitable[Mapping[str, Seen]]]


def status_reader(channel: grpc.aio.Channel, timeout: float = 5.0) -> ReadActual:
    """ContainerStatus over the runtime channel (CRI >= 1.25 reports the resources), read
    leniently: a label that is not UTF-8 must not hide the cpuset."""
    status = channel.unary_unary("/runtime.v1.RuntimeService/ContainerStatus", None, None)

    async def read(container_id: str, sandbox_id: str) -> tuple[str, str] | None:
        request = v1.ContainerStatusRequest(container_id=container_id).SerializeToString()
        reply = lenient.parse("ContainerStatusResponse", await status(request, timeout=timeout))
        if not reply.status.HasField("resources") or not reply.status.resources.HasField("linux"):
            return None
        return canonical_cpuset(lenient.text(reply.status.resources.linux.cpuset_cpus)), ACTUAL_STATUS

    return read


def cgroup_first(state: NodeState, cgroups: CgroupReader, fallback: ReadActual) -> ReadActual:
    """The container's cgroup `cpuset.cpus` where its pod's cgroup parent is known and the file
    reads, else `fallback` (ContainerStatus only echoes what was last sent; the cgroup is the truth)."""

    async def read(container_id: str, sandbox_id: str) -> tuple[str, str] | None:
        pod = state.pod(sandbox_id)
        if pod is not None and pod.cgroup_parent:
            found = cgroups.read(pod.cgroup_parent, container_id)
            if found is not None:
                return found, ACTUAL_CGROUP
        return await fallback(container_id, sandbox_id)

    return read


def runtime_observer(
    channel: grpc.aio.Channel, read: ReadActual, concurrency: int = 8, timeout: float = 5.0
) -> Observe:
    """ListContainers, then each container's actual cpuset with bounded concurrency. A container
    whose reading fails keeps `actual` None; a listing that fails raises (the view says so)."""
    listing = channel.unary_unary("/runtime.v1.RuntimeService/ListContainers", None, None)

    async def observe() -> Mapping[str, Seen]:
        reply = lenient.parse(
            "ListContainersResponse",
            await listing(v1.ListContainersRequest().SerializeToString(), timeout=timeout),
        )
        gate = asyncio.Semaphore(concurrency)

        async def one(c: Any) -> Seen:  # a lenient runtime.v1 Container: strings are bytes
            labels = lenient.text_map(c.labels, "labels", [])
            pod = (
                f"{labels[NAMESPACE_LABEL]}/{labels[NAME_LABEL]}"
                if NAMESPACE_LABEL in labels and NAME_LABEL in labels
                else None
            )
            cid, sandbox_id = lenient.text(c.id), lenient.text(c.pod_sandbox_id)
            found: tuple[str, str] | None = None
            async with gate:
                try:
                    found = await read(cid, sandbox_id)
                except Exception:  # one unreadable container must not hide the others
                    found = None
            return Seen(
                cid,
                sandbox_id,
                lenient.text(c.metadata.name),
                pod,
                STATES.get(c.state, "unknown"),
                found[0] if found is not None else None,
                found[1] if found is not None else "",
            )

        seen = await asyncio.gather(*(one(c) for c in reply.containers))
        return {s.id: s for s in seen}

    return observe
