"""Serve the fake runtime on a socket, for every API version at once."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from dataclasses import dataclass

import grpc
import grpc.aio
from loguru import logger

from cri_proxy.endpoints import grpc_target, prepare_listen_socket, remove_socket, socket_path
from cri_proxy.fake_runtime.service import ImageServicer, RuntimeServicer
from cri_proxy.fake_runtime.store import Container, Sandbox, Store, now_ns

MIB = 1024 * 1024


@dataclass(frozen=True)
class FakeOptions:
    listen: str
    latency: float = 0.0  # seconds added to every call
    update_latency: float = 0.0  # more seconds for UpdateContainerResources (real runtimes take 20-30 ms)
    create_latency: float = 0.0  # more seconds for CreateContainer
    seed_pods: int = 0  # pods created at start, each with `seed_containers_per_pod` running containers
    seed_containers_per_pod: int = 1
    seed_label_bytes: int = 0  # size of a padding label on each seeded container (large responses)
    max_message_bytes: int = 64 * MIB


def _add_servicers(server: grpc.aio.Server, store: Store, opts: FakeOptions) -> None:
    from cri_api.v1 import api_pb2 as v1
    from cri_api.v1 import api_pb2_grpc as v1_grpc
    from cri_api.v1alpha2 import api_pb2 as v1a2
    from cri_api.v1alpha2 import api_pb2_grpc as v1a2_grpc

    for name, pb, pb_grpc in (("v1", v1, v1_grpc), ("v1alpha2", v1a2, v1a2_grpc)):
        runtime_cls = type(f"FakeRuntime_{name}", (RuntimeServicer, pb_grpc.RuntimeServiceServicer), {})
        image_cls = type(f"FakeImage_{name}", (ImageServicer, pb_grpc.ImageServiceServicer), {})
        runtime = runtime_cls(pb, store, opts.latency, opts.update_latency, opts.create_latency, name)
        image = image_cls(pb, store)
        pb_grpc.add_RuntimeServiceServicer_to_server(runtime, server)
        pb_grpc.add_ImageServiceServicer_to_server(image, server)


def seed(store: Store, opts: FakeOptions) -> None:
    """Pods and running containers that exist before the first call (for load tests)."""
    from cri_api.v1 import api_pb2 as pb

    padding = "x" * opts.seed_label_bytes
    for p in range(opts.seed_pods):
        uid = f"seed-{p:05d}"
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=f"seed-{p}", uid=uid, namespace="default"),
            labels={
                "io.kubernetes.pod.name": f"seed-{p}",
                "io.kubernetes.pod.namespace": "default",
                "io.kubernetes.pod.uid": uid,
            },
            linux=pb.LinuxPodSandboxConfig(cgroup_parent=f"/kubepods/burstable/pod{uid}"),
        )
        sandbox = Sandbox(store.new_id(), config, now_ns())
        store.sandboxes[sandbox.id] = sandbox
        for c in range(opts.seed_containers_per_pod):
            labels = {"io.kubernetes.container.name": f"c{c}", "io.kubernetes.pod.uid": uid}
            if padding:
                labels["padding"] = padding
            cconfig = pb.ContainerConfig(
                metadata=pb.ContainerMetadata(name=f"c{c}"),
                image=pb.ImageSpec(image="localhost/busybox:latest"),
                labels=labels,
                linux=pb.LinuxContainerConfig(
                    resources=pb.LinuxContainerResources(cpu_shares=2, cpuset_cpus="0-1")
                ),
            )
            container = Container(
                store.new_id(),
                sandbox.id,
                cconfig,
                now_ns(),
                pb.LinuxContainerResources(cpu_shares=2, cpuset_cpus="0-1"),
                state="RUNNING",
                started_at=now_ns(),
            )
            store.containers[container.id] = container


class FakeRuntime:
    """A running fake runtime; `store` is open for tests that run it in-process."""

    def __init__(self, opts: FakeOptions, store: Store | None = None) -> None:
        self.opts = opts
        self.store = store if store is not None else Store()
        options = [
            ("grpc.max_receive_message_length", opts.max_message_bytes),
            ("grpc.max_send_message_length", opts.max_message_bytes),
        ]
        self.server = grpc.aio.server(options=options)
        _add_servicers(self.server, self.store, opts)
        seed(self.store, opts)
        self._socket = socket_path(opts.listen)

    async def start(self) -> None:
        if self._socket is not None:
            prepare_listen_socket(self._socket, allow_world_writable_dir=True)  # a test tool
        self.server.add_insecure_port(grpc_target(self.opts.listen))
        await self.server.start()
        logger.info(
            "fake runtime serving on {} ({} pods, {} containers)",
            self.opts.listen,
            len(self.store.sandboxes),
            len(self.store.containers),
        )

    async def stop(self, grace: float | None = 0.5) -> None:
        await self.server.stop(grace)
        if self._socket is not None:
            remove_socket(self._socket)


async def run(opts: FakeOptions) -> None:
    fake = FakeRuntime(opts)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await fake.start()
    try:
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await fake.stop()
