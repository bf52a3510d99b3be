"""Reading the runtime: what sandboxes and containers it has, as records for the merge.

The runtime is the truth for what exists (`cri_proxy.state.merge` folds a listing into the state).
What the proxy knew only fills what the runtime cannot say: a cgroup parent the sandbox status does
not show, and the resources of a container whose runtime predates `ContainerStatus.resources`
(CRI < 1.25). Replies are read by lenient twins of the messages, so no label or annotation content
can make a listing unreadable. A runtime that cannot be reached raises (the caller retries); a
container that vanished between the listing and its status is skipped.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import DecodeError, Message

from cri_api.v1 import api_pb2 as v1
from cri_proxy.cpu import CPUSet
from cri_proxy.enforce import lenient
from cri_proxy.errors import CpuError
from cri_proxy.state.merge import Known, Listing, merge
from cri_proxy.state.model import ContainerRecord, ContainerState, PodRecord

CRIO_CGROUP_PARENT = "io.kubernetes.cri-o.CgroupParent"
CONCURRENCY = 16

T = TypeVar("T")
R = TypeVar("R")
Checkpoint = tuple[list[PodRecord], list[ContainerRecord]]

_STATES = {
    v1.CONTAINER_CREATED: ContainerState.CREATED,
    v1.CONTAINER_RUNNING: ContainerState.RUNNING,
    v1.CONTAINER_EXITED: ContainerState.EXITED,
    v1.CONTAINER_UNKNOWN: ContainerState.UNKNOWN,
}
_LIVE = (ContainerState.CREATED, ContainerState.RUNNING)


@dataclass(frozen=True)
class Recovered:
    """What the runtime has, as records; `problems` are one line each, for people."""

    pods: list[PodRecord]
    containers: list[ContainerRecord]
    problems: list[str] = field(default_factory=list)
    dropped_pods: list[str] = field(default_factory=list)  # checkpoint sandbox ids the runtime lacks
    dropped_containers: list[str] = field(default_factory=list)  # checkpoint container ids likewise


@dataclass(frozen=True)
class RuntimeView:
    """One listing of the runtime, as records by id, and what could not be read cleanly."""

    pods: dict[str, PodRecord]
    containers: dict[str, ContainerRecord]
    problems: list[str]

    def listing(self, started: int) -> Listing:
        return Listing(self.pods, self.containers, started)


class _Runtime:
    """runtime.v1 calls as raw bytes, replies read by the lenient twins (any string content)."""

    def __init__(self, channel: grpc.aio.Channel, timeout: float) -> None:
        self.channel = channel
        self.timeout = timeout

    async def call(self, method: str, request: Message) -> Any:
        send = self.channel.unary_unary(f"/runtime.v1.RuntimeService/{method}", None, None)
        reply: bytes = await send(request.SerializeToString(), timeout=self.timeout)
        return lenient.parse(f"{method}Response", reply)


async def read_runtime(
    channel: grpc.aio.Channel,
    known_pods: Mapping[str, PodRecord],
    known_containers: Mapping[str, ContainerRecord],
    *,
    full: bool,
    timeout: float = 10.0,
) -> RuntimeView:
    """List the runtime's sandboxes and containers (runtime.v1 on `channel`).

    `full`: ask every sandbox's and live container's status (cgroup parent, resources, cpuset),
    as after a restart or an outage. Otherwise (the periodic pass) only the lists, plus the status
    of what is not known yet. A runtime that cannot be reached raises; a sandbox or container that
    vanished between the listing and its status is left out; a label or annotation that is not
    UTF-8 becomes a problem on its pod, never a failure.
    """
    runtime = _Runtime(channel, timeout)
    problems: list[str] = []
    # Containers first: a container listed now has its sandbox in the sandbox listing that follows,
    # unless the sandbox went away meanwhile, and then the container is gone too.
    listed = (await runtime.call("ListContainers", v1.ListContainersRequest())).containers
    sandboxes = (await runtime.call("ListPodSandbox", v1.ListPodSandboxRequest())).items

    async def pod_record(item: Any) -> PodRecord | None:
        sid = lenient.text(item.id)
        old = known_pods.get(sid)
        record = _pod_from_list(item, old)
        if not full and old is not None and old.cgroup_parent:
            return record  # the merge keeps its cgroup parent
        request = v1.PodSandboxStatusRequest(pod_sandbox_id=sid, verbose=True)
        response = await _unless_not_found(runtime.call("PodSandboxStatus", request))
        if response is None:
            return None
        parent = cgroup_parent_from_info(lenient.text_map(response.info, f"sandbox {sid[:13]} info", []))
        if not parent and old is not None:
            parent = old.cgroup_parent
        if not parent:
            problems.append(
                f"pod {record.key} (sandbox {sid[:13]}): the runtime shows no cgroup parent and the "
                "checkpoint has none; the pod is left unmanaged"
            )
        return replace(record, cgroup_parent=parent)

    pods = {p.sandbox_id: p for p in await _bounded(pod_record, sandboxes) if p is not None}
    for p in pods.values():
        problems.extend(f"pod {p.key}: {problem}" for problem in p.problems)

    async def container_record(item: Any) -> ContainerRecord | None:
        cid = lenient.text(item.id)
        old = known_containers.get(cid)
        record = _container_from_list(item, old)
        if record is None or record.state not in _LIVE or (not full and old is not None):
            return record
        request = v1.ContainerStatusRequest(container_id=cid)
        response = await _unless_not_found(runtime.call("ContainerStatus", request))
        if response is None:
            return None
        return _with_status(record, response.status, old, problems)

    live = [c for c in listed if lenient.text(c.pod_sandbox_id) in pods]
    containers = {c.id: c for c in await _bounded(container_record, live) if c is not None}
    for c in listed:
        if c.state == v1.CONTAINER_UNKNOWN:
            problems.append(
                f"container {lenient.text(c.metadata.name)} ({lenient.text(c.id)[:13]}): "
                "the runtime reports state unknown; its cpuset is left alone"
            )
    return RuntimeView(pods, containers, problems)


async def recover(
    channel: grpc.aio.Channel, checkpoint: Checkpoint | None, timeout: float = 10.0
) -> Recovered:
    """The runtime's sandboxes and live containers merged into a checkpoint (a full listing)."""
    old_pods = {p.sandbox_id: p for p in checkpoint[0]} if checkpoint else {}
    old_containers = {c.id: c for c in checkpoint[1]} if checkpoint else {}
    view = await read_runtime(channel, old_pods, old_containers, full=True, timeout=timeout)
    merged = merge(Known(old_pods, old_containers), view.listing(0))
    return Recovered(
        pods=list(merged.pods.values()),
        containers=[c for c in merged.containers.values() if c.state in _LIVE],
        problems=view.problems,
        dropped_pods=merged.dropped_pods,
        dropped_containers=sorted(
            cid for cid in old_containers if cid not in merged.containers or cid in merged.exited
        ),
    )


def _pod_from_list(item: Any, old: PodRecord | None) -> PodRecord:
    """A ListPodSandbox item as a record (no cgroup parent: the list does not show it)."""
    meta = item.metadata
    namespace, name = lenient.text(meta.namespace), lenient.text(meta.name)
    problems: list[str] = []
    labels = lenient.text_map(item.labels, "label", problems)
    annotations = lenient.text_map(item.annotations, "annotation", problems)
    return PodRecord(
        sandbox_id=lenient.text(item.id),
        uid=lenient.text(meta.uid),
        name=name,
        namespace=namespace,
        cgroup_parent="",
        labels=labels,
        annotations=annotations,
        ready=item.state == v1.SANDBOX_READY,
        api_version=old.api_version if old is not None else "v1",
        problems=tuple(problems),
    )


def _container_from_list(item: Any, old: ContainerRecord | None) -> ContainerRecord | None:
    """A ListContainers item as a record (a state this build does not know: what we knew)."""
    state = _STATES.get(item.state)
    if state is None:
        return old
    return ContainerRecord(
        id=lenient.text(item.id),
        sandbox_id=lenient.text(item.pod_sandbox_id),
        name=lenient.text(item.metadata.name),
        state=state,
        attempt=item.metadata.attempt,
        api_version=old.api_version if old is not None else "v1",
    )


def _with_status(
    record: ContainerRecord, status: Any, old: ContainerRecord | None, problems: list[str]
) -> ContainerRecord | None:
    state = _STATES.get(status.state)
    if state is None:
        return record
    resources, applied = status_resources(status)
    if resources is None:
        if old is not None:
            resources, applied = old.resources, old.applied
        else:
            resources, applied = b"", None
            problems.append(
                f"container {record.name} ({record.id[:13]}): the runtime reports no resources "
                "and the checkpoint has none; its cpuset cannot be changed safely"
            )
    return replace(record, state=state, resources=resources, applied=applied)


def status_resources(status: Any) -> tuple[bytes | None, str | None]:
    """(LinuxContainerResources wire bytes, canonical cpuset) from a lenient ContainerStatus."""
    if not status.HasField("resources") or not status.resources.HasField("linux"):
        return None, None
    data: bytes = status.resources.linux.SerializeToString()
    try:
        linux = v1.LinuxContainerResources.FromString(data)
    except DecodeError:
        return None, None
    return data, canonical_cpuset(linux.cpuset_cpus)


def cgroup_parent_from_info(info: Mapping[str, str]) -> str:
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
    if len(text) <= _SHORT:
        return _canonical_short(text)
    return _canonical(text)


_SHORT = 64  # a node's few cpusets, asked on every create and status read: kept (bounded: 256 of them)


def _canonical(text: str) -> str:
    try:
        return str(CPUSet.parse(text))
    except CpuError:
        return text


_canonical_short = functools.lru_cache(maxsize=256)(_canonical)


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
