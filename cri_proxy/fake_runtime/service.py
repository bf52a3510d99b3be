"""The fake runtime's CRI services, one implementation for every API version.

`RuntimeServicer(pb, store)` builds replies from `pb` (the version's generated module), so the
same code answers `runtime.v1` and `runtime.v1alpha2`. Methods not written here answer
UNIMPLEMENTED, as the generated base class does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import grpc
import grpc.aio
from google.protobuf.json_format import MessageToDict

from cri_proxy.fake_runtime.store import Container, Sandbox, Store, now_ns
from cri_proxy.state.resources import merge_linux_resources

Ctx = grpc.aio.ServicerContext[Any, Any]


def _labels_match(labels: Any, selector: Any) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


class RuntimeServicer:
    """Implements RuntimeService over a `Store`; mixed into the version's generated base class."""

    def __init__(
        self,
        pb: ModuleType,
        store: Store,
        latency: float = 0.0,
        update_latency: float = 0.0,
        create_latency: float = 0.0,
        version_name: str = "v1",
    ) -> None:
        self.pb = pb
        self.store = store
        self.latency = latency
        self.update_latency = update_latency
        self.create_latency = create_latency
        self.version_name = version_name

    async def _delay(self, extra: float = 0.0) -> None:
        wait = self.latency + extra
        if wait > 0:
            await asyncio.sleep(wait)

    async def _sandbox(self, sandbox_id: str, context: Ctx) -> Sandbox:
        sandbox: Sandbox | None = self.store.resolve(self.store.sandboxes, sandbox_id)
        if sandbox is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"an error occurred when try to find sandbox {sandbox_id!r}: not found",
            )
        return sandbox

    async def _container(self, container_id: str, context: Ctx) -> Container:
        container: Container | None = self.store.resolve(self.store.containers, container_id)
        if container is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"an error occurred when try to find container {container_id!r}: not found",
            )
        return container

    # -- runtime ---------------------------------------------------------------------------
    async def Version(self, request: Any, context: Ctx) -> Any:
        await self._delay()
        return self.pb.VersionResponse(
            version="0.1.0",
            runtime_name="cri-proxy-fake-runtime",
            runtime_version="0.1.0",
            runtime_api_version=self.version_name,
        )

    async def Status(self, request: Any, context: Ctx) -> Any:
        await self._delay()
        conditions = [
            self.pb.RuntimeCondition(type="RuntimeReady", status=True),
            self.pb.RuntimeCondition(type="NetworkReady", status=True),
        ]
        return self.pb.StatusResponse(status=self.pb.RuntimeStatus(conditions=conditions))

    async def UpdateRuntimeConfig(self, request: Any, context: Ctx) -> Any:
        return self.pb.UpdateRuntimeConfigResponse()

    # -- sandboxes -------------------------------------------------------------------------
    async def RunPodSandbox(self, request: Any, context: Ctx) -> Any:
        await self._delay()
        sandbox_id = self.store.new_id()
        self.store.sandboxes[sandbox_id] = Sandbox(sandbox_id, request.config, now_ns())
        return self.pb.RunPodSandboxResponse(pod_sandbox_id=sandbox_id)

    async def StopPodSandbox(self, request: Any, context: Ctx) -> Any:
        await self._delay()
        sandbox = self.store.resolve(self.store.sandboxes, request.pod_sandbox_id)
        if sandbox is not None:  # containerd: stopping a missing sandbox is not an error
            sandbox.ready = False
            for container in self.store.containers.values():
                if container.sandbox_id == sandbox.id and container.state != "EXITED":
                    self._exit(container)
        return self.pb.StopPodSandboxResponse()

    async def RemovePodSandbox(self, request: Any, context: Ctx) -> Any:
        await self._delay()
        sandbox = self.store.resolve(self.store.sandboxes, request.pod_sandbox_id)
        if sandbox is not None:
            for cid in [c.id for c in self.store.containers.values() if c.sandbox_id == sandbox.id]:
                self.store.publish(self.store.containers.pop(cid), "CONTAINER_DELETED_EVENT")
            del self.store.sandboxes[sandbox.id]
        return self.pb.RemovePodSandboxResponse()

    def _sandbox_status(self, sandbox: Sandbox) -> Any:
        pb = self.pb
        cfg = sandbox.config
        return pb.PodSandboxStatus(
            id=sandbox.id,
            metadata=cfg.metadata,
            state=pb.SANDBOX_READY if sandbox.ready else pb.SANDBOX_NOTREADY,
            created_at=sandbox.created_at,
            labels=cfg.labels,
            annotations=cfg.annotations,
        )

    async def PodSandboxStatus(self, request: Any, context: Ctx) -> Any:
        await self._delay()
        sandbox = await self._sandbox(request.pod_sandbox_id, context)
        info = {}
        if request.verbose:  # containerd's shape: the sandbox config under info["info"]
            info["info"] = json.dumps(
                {"config": MessageToDict(sandbox.config, preserving_proto_field_name=True), "pid": 0}
            )
        return self.pb.PodSandboxStatusResponse(status=self._sandbox_status(sandbox), info=info)

    async def ListPodSandbox(self, request: Any, context: Ctx) -> Any:
        await self._delay()
        pb, f = self.pb, request.filter
        items = []
        for sandbox in self.store.sandboxes.values():
            state = pb.SANDBOX_READY if sandbox.ready else pb.SANDBOX_NOTREADY
            if f.id and not sandbox.id.startswith(f.id):
                continue
            if f.HasField("state") and f.state.state != state:
                continue
            if not _labels_match(sandbox.config.labels, f.label_selector):
                continue
            cfg = sandbox.config
            items.append(
                pb.PodSandbox(
                    id=sandbox.id,
                    metadata=cfg.metadata,
                    state=state,
                    created_at=sandbox.created_at,
                    labels=cfg.labels,
                    annotations=cfg.annotations,
                )
            )
        return pb.ListPodSandboxResponse(items=items)

    # -- containers ------------------------------------------------------------------------
    async def CreateContainer(self, request: Any, context: Ctx) -> Any:
        await self._delay(self.create_latency)
        sandbox = await self._sandbox(request.pod_sandbox_id, context)
        container_id = self.store.new_id()
        resources = self.pb.LinuxContainerResources()
        resources.CopyFrom(request.config.linux.resources)
        container = Container(container_id, sandbox.id, request.config, now_ns(), resources)
        self.store.containers[container_id] = container
        self.store.publish(container, "CONTAINER_CREATED_EVENT")
        return self.pb.CreateContainerResponse(container_id=container_id)

    async def StartContainer(self, request: Any, context: Ctx) -> Any:
        await self._delay()
        container = await self._container(request.container_id, context)
        if container.state != "CREATED":
            await context.abort(
                grpc.StatusCode.UNKNOWN, f"container {container.id} is in {container.state} state"
            )
        container.state, container.started_at = "RUNNING", now_ns()
        self.store.publish(container, "CONTAINER_STARTED_EVENT")
        return self.pb.StartContainerResponse()

    def _exit(self, container: Container) -> None:
        container.state, container.finished_at = "EXITED", now_ns()
        self.store.publish(container, "CONTAINER_STOPPED_EVENT")

    async def StopContainer(self, request: Any, context: Ctx) -> Any:
        await self._delay()
        container = await self._container(request.container_id, context)
        if container.state != "EXITED":
            self._exit(container)
        return self.pb.StopContainerResponse()

    async def RemoveContainer(self, request: Any, context: Ctx) -> Any:
        await self._delay()
        container = self.store.resolve(self.store.containers, request.container_id)
        if container is not None:
            del self.store.containers[container.id]
            self.store.publish(container, "CONTAINER_DELETED_EVENT")
        return self.pb.RemoveContainerResponse()

    def _state(self, container: Container) -> int:
        return int(getattr(self.pb, f"CONTAINER_{container.state}"))

    def _listed(self, c: Container) -> Any:
        cfg = c.config
        return self.pb.Container(
            id=c.id,
            pod_sandbox_id=c.sandbox_id,
            metadata=cfg.metadata,
            image=cfg.image,
            image_ref=cfg.image.image,
            state=self._state(c),
            created_at=c.created_at,
            labels=cfg.labels,
            annotations=cfg.annotations,
        )

    async def ListContainers(self, request: Any, context: Ctx) -> Any:
        await self._delay()
        f = request.filter
        out = []
        for c in self.store.containers.values():
            if f.id and not c.id.startswith(f.id):
                continue
            if f.pod_sandbox_id and not c.sandbox_id.startswith(f.pod_sandbox_id):
                continue
            if f.HasField("state") and f.state.state != self._state(c):
                continue
            if not _labels_match(c.config.labels, f.label_selector):
                continue
            out.append(self._listed(c))
        return self.pb.ListContainersResponse(containers=out)

    def _status(self, c: Container) -> Any:
        cfg = c.config
        return self.pb.ContainerStatus(
            id=c.id,
            metadata=cfg.metadata,
            state=self._state(c),
            created_at=c.created_at,
            started_at=c.started_at,
            finished_at=c.finished_at,
            exit_code=c.exit_code,
            image=cfg.image,
            image_ref=cfg.image.image,
            labels=cfg.labels,
            annotations=cfg.annotations,
            log_path=cfg.log_path,
            resources=self.pb.ContainerResources(linux=c.resources),
        )

    async def ContainerStatus(self, request: Any, context: Ctx) -> Any:
        await self._delay()
        c = await self._container(request.container_id, context)
        info = {}
        if request.verbose:
            info["info"] = json.dumps(
                {
                    "sandboxID": c.sandbox_id,
                    "updates": len(c.updates),
                    "config": MessageToDict(c.config, preserving_proto_field_name=True),
                }
            )
        return self.pb.ContainerStatusResponse(status=self._status(c), info=info)

    async def UpdateContainerResources(self, request: Any, context: Ctx) -> Any:
        await self._delay(self.update_latency)
        c = await self._container(request.container_id, context)
        if c.state == "EXITED":
            await context.abort(grpc.StatusCode.UNKNOWN, f"container {c.id} is not running or created")
        if request.HasField("linux"):
            merge_linux_resources(c.resources, request.linux)
            recorded = self.pb.LinuxContainerResources()
            recorded.CopyFrom(request.linux)
            c.updates.append(recorded)
        return self.pb.UpdateContainerResourcesResponse()

    async def ExecSync(self, request: Any, context: Ctx) -> Any:
        await self._delay()
        c = await self._container(request.container_id, context)
        if c.state != "RUNNING":
            await context.abort(grpc.StatusCode.UNKNOWN, f"container {c.id} is not running")
        cmd = list(request.cmd)
        if cmd[:1] == ["echo"]:
            return self.pb.ExecSyncResponse(stdout=(" ".join(cmd[1:]) + "\n").encode(), exit_code=0)
        if cmd[:1] == ["false"]:
            return self.pb.ExecSyncResponse(exit_code=1)
        return self.pb.ExecSyncResponse(exit_code=0)

    def _stats(self, c: Container) -> Any:
        pb = self.pb
        return pb.ContainerStats(
            attributes=pb.ContainerAttributes(
                id=c.id, metadata=c.config.metadata, labels=c.config.labels, annotations=c.config.annotations
            ),
            cpu=pb.CpuUsage(timestamp=now_ns(), usage_core_nano_seconds=pb.UInt64Value(value=1_000_000)),
            memory=pb.MemoryUsage(timestamp=now_ns(), working_set_bytes=pb.UInt64Value(value=4096)),
        )

    async def ContainerStats(self, request: Any, context: Ctx) -> Any:
        await self._delay()
        c = await self._container(request.container_id, context)
        return self.pb.ContainerStatsResponse(stats=self._stats(c))

    async def ListContainerStats(self, request: Any, context: Ctx) -> Any:
        await self._delay()
        f = request.filter
        stats = [
            self._stats(c)
            for c in self.store.containers.values()
            if (not f.id or c.id.startswith(f.id))
            and (not f.pod_sandbox_id or c.sandbox_id == f.pod_sandbox_id)
            and _labels_match(c.config.labels, f.label_selector)
        ]
        return self.pb.ListContainerStatsResponse(stats=stats)

    async def GetContainerEvents(self, request: Any, context: Ctx) -> AsyncIterator[Any]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self.store.subscribers.add(queue)
        try:
            while True:
                event = await queue.get()
                sandbox = self.store.sandboxes.get(event.sandbox_id)
                yield self.pb.ContainerEventResponse(
                    container_id=event.container_id,
                    container_event_type=getattr(self.pb, event.kind),
                    created_at=event.at,
                    pod_sandbox_status=self._sandbox_status(sandbox) if sandbox else None,
                )
        finally:
            self.store.subscribers.discard(queue)


class ImageServicer:
    """Implements ImageService over the store's image table (no registry: pulls just record)."""

    def __init__(self, pb: ModuleType, store: Store) -> None:
        self.pb = pb
        self.store = store

    def _image(self, ref: str, size: int) -> Any:
        return self.pb.Image(id=f"sha256:{abs(hash(ref)):064x}"[:71], repo_tags=[ref], size=size)

    async def ListImages(self, request: Any, context: Ctx) -> Any:
        want = request.filter.image.image
        return self.pb.ListImagesResponse(
            images=[
                self._image(ref, size) for ref, size in self.store.images.items() if not want or ref == want
            ]
        )

    async def ImageStatus(self, request: Any, context: Ctx) -> Any:
        size = self.store.images.get(request.image.image)
        if size is None:
            return self.pb.ImageStatusResponse()
        return self.pb.ImageStatusResponse(image=self._image(request.image.image, size))

    async def PullImage(self, request: Any, context: Ctx) -> Any:
        self.store.images.setdefault(request.image.image, 1_000_000)
        return self.pb.PullImageResponse(image_ref=request.image.image)

    async def RemoveImage(self, request: Any, context: Ctx) -> Any:
        self.store.images.pop(request.image.image, None)
        return self.pb.RemoveImageResponse()

    async def ImageFsInfo(self, request: Any, context: Ctx) -> Any:
        pb = self.pb
        usage = pb.FilesystemUsage(
            timestamp=now_ns(),
            fs_id=pb.FilesystemIdentifier(mountpoint="/fake"),
            used_bytes=pb.UInt64Value(value=sum(self.store.images.values())),
        )
        return pb.ImageFsInfoResponse(image_filesystems=[usage])
