"""What a container really has: its cgroup's `cpuset.cpus` where the proxy can read it, else the
runtime's ContainerStatus. Never what the proxy last sent (containerd 1.6 can answer OK to an
update, report it in ContainerStatus, and leave the cgroup as it was). And the resources the
runtime holds for it now, which may have been changed at the runtime directly."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NamedTuple

import grpc.aio

from cri_api.v1 import api_pb2 as v1
from cri_proxy.enforce import lenient
from cri_proxy.enforce.recovery import canonical_cpuset, status_resources
from cri_proxy.sources.cgroupfs import CgroupReader
from cri_proxy.state.model import ACTUAL_CGROUP, ACTUAL_STATUS, ContainerRecord, NodeState


class Reading(NamedTuple):
    """What a container really has: canonical cpuset, and where it was read (`ACTUAL_*`)."""

    cpuset: str
    source: str


ReadActual = Callable[[ContainerRecord, bool], Awaitable[Reading | None]]
"""The cpuset a container really has now: its cgroup where readable, else (when the bool says so)
the runtime's ContainerStatus; None: neither says. Raises the runtime's error (NOT_FOUND: gone)."""


RuntimeResources = Callable[[ContainerRecord], Awaitable[bytes | None]]
"""The resources the runtime holds for a container now, as LinuxContainerResources wire bytes (its
ContainerStatus, CRI >= 1.25); None: it does not say. Raises the runtime's error (NOT_FOUND: gone)."""


def actual_reader(
    state: NodeState, cgroups: CgroupReader | None, channel: grpc.aio.Channel, timeout: float = 10.0
) -> ReadActual:
    """The container's cgroup `cpuset.cpus` where readable, else ContainerStatus over the runtime
    channel (CRI >= 1.25; read leniently: a label need not be UTF-8)."""
    status = channel.unary_unary("/runtime.v1.RuntimeService/ContainerStatus", None, None)

    async def read(c: ContainerRecord, status_too: bool = True) -> Reading | None:
        pod = state.pod(c.sandbox_id)
        if cgroups is not None and pod is not None and pod.cgroup_parent:
            found = cgroups.read(pod.cgroup_parent, c.id)
            if found is not None:
                return Reading(found, ACTUAL_CGROUP)
        if not status_too:
            return None
        request = v1.ContainerStatusRequest(container_id=c.id).SerializeToString()
        reply = lenient.parse("ContainerStatusResponse", await status(request, timeout=timeout))
        if not reply.status.HasField("resources") or not reply.status.resources.HasField("linux"):
            return None
        cpuset = lenient.text(reply.status.resources.linux.cpuset_cpus)
        return Reading(canonical_cpuset(cpuset), ACTUAL_STATUS)

    return read


def resources_reader(channel: grpc.aio.Channel, timeout: float = 10.0) -> RuntimeResources:
    """ContainerStatus over the runtime channel, read leniently (a label need not be UTF-8)."""
    status = channel.unary_unary("/runtime.v1.RuntimeService/ContainerStatus", None, None)

    async def read(c: ContainerRecord) -> bytes | None:
        request = v1.ContainerStatusRequest(container_id=c.id).SerializeToString()
        reply = lenient.parse("ContainerStatusResponse", await status(request, timeout=timeout))
        return status_resources(reply.status)[0]

    return read
