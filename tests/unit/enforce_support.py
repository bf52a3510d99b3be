"""In-process proxy (hooks, state, reconciler) in front of the fake runtime, on a fake sysfs."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from cri_api.v1 import api_pb2 as v1
from cri_proxy.config import Config
from cri_proxy.fake_runtime.server import FakeOptions, FakeRuntime
from cri_proxy.logs import set_debug_enabled
from cri_proxy.serve import Proxy

QOS_LABEL = "koordinator.sh/qosClass"
ALLOC = "scheduling.koordinator.sh/resource-status"


def fake_sysfs(root: Path, numa: Mapping[int, str]) -> Path:
    """A sysfs tree with the given NUMA nodes (node -> cpulist); one socket per node."""
    from cri_proxy.cpu import CPUSet

    cpu_dir = root / "devices/system/cpu"
    cpu_dir.mkdir(parents=True, exist_ok=True)
    everything = CPUSet.parse(",".join(numa.values()))
    (cpu_dir / "online").write_text(f"{everything}\n")
    for node, cpus in numa.items():
        node_dir = root / f"devices/system/node/node{node}"
        node_dir.mkdir(parents=True, exist_ok=True)
        (node_dir / "cpulist").write_text(f"{cpus}\n")
        for cpu in CPUSet.parse(cpus):
            topo = cpu_dir / f"cpu{cpu}/topology"
            topo.mkdir(parents=True, exist_ok=True)
            (topo / "physical_package_id").write_text(f"{node}\n")
    return root


@dataclass
class Node:
    """A proxy on a node: `call(...)` talks CRI through the proxy, `fake` is the runtime inside;
    `admin` is a channel to the proxy's admin socket (introspection, health)."""

    dir: Path
    proxy: Proxy
    fake: FakeRuntime
    channel: grpc.aio.Channel
    admin: grpc.aio.Channel
    pb: Any = v1

    def stub(self) -> Any:
        from cri_api.v1 import api_pb2_grpc

        return api_pb2_grpc.RuntimeServiceStub(self.channel)  # type: ignore[no-untyped-call]

    async def run_pod(
        self,
        name: str,
        qos: str = "burstable",
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        containers: tuple[str, ...] = ("main",),
        resources: Any = None,
    ) -> tuple[str, dict[str, str]]:
        """RunPodSandbox + CreateContainer + StartContainer as kubelet would; (sandbox id, name -> id)."""
        pb, rt = self.pb, self.stub()
        uid = f"uid-{name}"
        parent = {
            "guaranteed": f"/kubepods/pod{uid}",
            "burstable": f"/kubepods/burstable/pod{uid}",
            "besteffort": f"/kubepods/besteffort/pod{uid}",
        }[qos]
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace="default"),
            labels={**(labels or {}), "io.kubernetes.pod.uid": uid},
            annotations=dict(annotations or {}),
            linux=pb.LinuxPodSandboxConfig(cgroup_parent=parent),
        )
        sandbox = (await rt.RunPodSandbox(pb.RunPodSandboxRequest(config=config))).pod_sandbox_id
        ids = {}
        for cname in containers:
            res = (
                resources
                if resources is not None
                else pb.LinuxContainerResources(
                    cpu_shares=512, cpu_period=100000, cpu_quota=50000, memory_limit_in_bytes=64 << 20
                )
            )
            cconfig = pb.ContainerConfig(
                metadata=pb.ContainerMetadata(name=cname),
                image=pb.ImageSpec(image="localhost/busybox:latest"),
                linux=pb.LinuxContainerConfig(resources=res),
            )
            cid = (
                await rt.CreateContainer(
                    pb.CreateContainerRequest(pod_sandbox_id=sandbox, config=cconfig, sandbox_config=config)
                )
            ).container_id
            await rt.StartContainer(pb.StartContainerRequest(container_id=cid))
            ids[cname] = cid
        return sandbox, ids

    async def remove_pod(self, sandbox: str) -> None:
        rt = self.stub()
        await rt.StopPodSandbox(self.pb.StopPodSandboxRequest(pod_sandbox_id=sandbox))
        await rt.RemovePodSandbox(self.pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox))

    def cpuset(self, container_id: str) -> str:
        """What the runtime holds for the container (the fake applies updates like containerd)."""
        return str(self.fake.store.containers[container_id].resources.cpuset_cpus)

    async def settle(self) -> None:
        """Wait until the reconciler has nothing left to do."""
        ticket = self.proxy.reconciler.request()
        assert await self.proxy.reconciler.wait_for(ticket, 10)
        await asyncio.wait_for(self.proxy.reconciler.checks_done(), 10)

    async def introspect(self, method: str) -> Any:
        reply = await self.admin.unary_unary(f"/cri_proxy.v1.Introspect/{method}", None, None)(b"")
        return json.loads(reply)


def alloc(cpuset: str | None = None, **extra: Any) -> dict[str, str]:
    body: dict[str, Any] = dict(extra)
    if cpuset is not None:
        body["cpuset"] = cpuset
    return {ALLOC: json.dumps(body)}


@contextlib.asynccontextmanager
async def node(
    tmp: Path,
    numa: Mapping[int, str] | None = None,
    fake: FakeRuntime | None = None,
    kubelet_state: Any = None,
    debug: bool = False,
    **config: Any,
) -> AsyncIterator[Node]:
    """A fake runtime (or `fake`) and a full proxy in front of it; both stopped at the end. DEBUG
    lines are made as under `--log-level debug` when `debug`, else not, as under the default INFO
    (a create then goes on by the path a node takes: `EnforceHooks.ready_create`)."""
    debug_was = set_debug_enabled(debug)
    try:
        sysfs = fake_sysfs(tmp / "sys", numa or {0: "0-7", 1: "8-15"})
        runtime_ep = f"unix://{tmp}/runtime.sock"
        own_fake = fake is None
        if fake is None:
            fake = FakeRuntime(FakeOptions(listen=runtime_ep))
            await fake.start()
        else:
            runtime_ep = fake.opts.listen
        kubelet_file = tmp / "cpu_manager_state"
        if kubelet_state is not None:
            kubelet_file.write_text(json.dumps(kubelet_state))
        settings = dict(
            listen=f"unix://{tmp}/proxy.sock",
            runtime_endpoint=runtime_ep,
            state_dir=str(tmp / "state"),
            kubelet_state_file=str(kubelet_file),
            sysfs_root=str(sysfs),
            cgroup_root=str(tmp / "cgroup"),  # not the host's: its kubepods would bound the fake CPUs
            kubelet_poll_seconds=0.05,
        )
        settings.update(config)
        proxy = Proxy(Config(**settings).validate())
        await proxy.start()
        channel = grpc.aio.insecure_channel(settings["listen"])
        admin = grpc.aio.insecure_channel(proxy.config.admin_endpoint)
        try:
            yield Node(tmp, proxy, fake, channel, admin)
        finally:
            await channel.close(None)
            await admin.close(None)
            await proxy.stop()
            if own_fake:
                await fake.stop(0)
    finally:
        set_debug_enabled(debug_was)
