"""The periodic merge in a whole proxy, in front of the fake runtime: what happens behind its back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import grpc.aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from cri_proxy.state.model import ContainerState
from tests.unit.enforce_support import QOS_LABEL, alloc, node
from tests.unit.relay_support import run


async def until(condition: Callable[[], bool], what: str, within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"not within {within} s: {what}"
        await asyncio.sleep(0.02)


def test_created_and_exited_behind_the_proxys_back_within_a_period(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, reconcile_period_seconds=0.2) as n:
            await n.run_pod("lsr", "guaranteed", {QOS_LABEL: "LSR"}, alloc("0-1"))
            sandbox, ids = await n.run_pod("ls", "burstable")
            config = n.fake.store.sandboxes[sandbox].config
            async with grpc.aio.insecure_channel(n.fake.opts.listen) as channel:
                direct = v1_grpc.RuntimeServiceStub(channel)  # type: ignore[no-untyped-call]
                sneaky = (
                    await direct.CreateContainer(
                        v1.CreateContainerRequest(
                            pod_sandbox_id=sandbox,
                            config=v1.ContainerConfig(
                                metadata=v1.ContainerMetadata(name="sneaky"),
                                image=v1.ImageSpec(image="localhost/busybox:latest"),
                                linux=v1.LinuxContainerConfig(
                                    resources=v1.LinuxContainerResources(cpu_shares=2)
                                ),
                            ),
                            sandbox_config=config,
                        )
                    )
                ).container_id
                await direct.StartContainer(v1.StartContainerRequest(container_id=sneaky))
                await until(lambda: n.proxy.state.container(sneaky) is not None, "adopted")
                await until(lambda: n.cpuset(sneaky) == "2-15", "placed on the LS pool")
                adopted = n.proxy.state.container(sneaky)
                assert adopted is not None and adopted.linux_resources().cpu_shares == 2  # kept whole
                await direct.StopContainer(v1.StopContainerRequest(container_id=ids["main"]))

                def exited() -> bool:
                    c = n.proxy.state.container(ids["main"])
                    return c is not None and c.state is ContainerState.EXITED

                await until(exited, "seen exited")
                await direct.RemoveContainer(v1.RemoveContainerRequest(container_id=ids["main"]))
                await until(lambda: n.proxy.state.container(ids["main"]) is None, "forgotten")

    run(main())
