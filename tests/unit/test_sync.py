"""The periodic merge in a whole proxy, in front of the fake runtime: what happens behind its back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc.aio
import pytest

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from cri_proxy.state.model import ContainerState
from tests.unit.enforce_support import QOS_LABEL, alloc, node
from tests.unit.relay_support import eventually, run


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
                await eventually(lambda: n.proxy.state.container(sneaky) is not None, "adopted")
                await eventually(lambda: n.cpuset(sneaky) == "2-15", "placed on the LS pool")
                adopted = n.proxy.state.container(sneaky)
                assert adopted is not None and adopted.linux_resources().cpu_shares == 2  # kept whole
                await direct.StopContainer(v1.StopContainerRequest(container_id=ids["main"]))

                def exited() -> bool:
                    c = n.proxy.state.container(ids["main"])
                    return c is not None and c.state is ContainerState.EXITED

                await eventually(exited, "seen exited")
                await direct.RemoveContainer(v1.RemoveContainerRequest(container_id=ids["main"]))
                await eventually(lambda: n.proxy.state.container(ids["main"]) is None, "forgotten")

    run(main())


def test_on_demand_listings_are_shared_and_rationed(monkeypatch: pytest.MonkeyPatch) -> None:
    """`learn` (an update naming an unknown container): concurrent callers share one listing, no more
    than one a LEARN_EVERY, and a listing that fails or is slow only returns the caller."""
    from cri_proxy.enforce import sync
    from cri_proxy.state.merge import Merged
    from cri_proxy.state.model import NodeState

    async def main() -> None:
        syncer = sync.Syncer(NodeState(), grpc.aio.insecure_channel("unix:///nonexistent"))
        listings: list[float] = []
        outcome: list[Exception | None] = [None]
        gate = asyncio.Event()
        gate.set()

        async def listing(full: bool = False) -> Merged:  # stands in for ListPodSandbox/ListContainers
            listings.append(asyncio.get_running_loop().time())
            await asyncio.sleep(0.05)
            await gate.wait()
            if outcome[0] is not None:
                raise outcome[0]
            return Merged(pods={}, containers={})

        syncer.sync = listing  # type: ignore[method-assign]
        monkeypatch.setattr(sync, "LEARN_EVERY", 3600.0)  # rationed: one listing, then none
        await asyncio.gather(*(syncer.learn(1.0) for _ in range(5)))
        assert len(listings) == 1
        await syncer.learn(1.0)
        assert len(listings) == 1  # within LEARN_EVERY of the last one: what is known will do
        monkeypatch.setattr(sync, "LEARN_EVERY", 0.0)  # from here on, as if a second had passed each time
        outcome[0] = RuntimeError("runtime away")
        await syncer.learn(1.0)  # does not raise
        assert len(listings) == 2
        outcome[0] = None
        gate.clear()  # the next listing hangs until the gate opens
        await asyncio.wait_for(syncer.learn(0.01), 5)  # the caller gives up waiting; no hang
        assert len(listings) == 3
        gate.set()

    run(main())
