"""Whether CreateContainer's post hook asks for a reconcile pass: only when a pass has something to
do (the container's cpuset is not what the plan decides now, or the node has exclusive containers,
whose overlaps a pass reports). Hooks called directly on an in-process proxy; passes counted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from cri_api.v1 import api_pb2 as pb
from cri_proxy.relay.methods import KNOWN
from cri_proxy.state.model import PodRecord
from tests.unit.enforce_support import ALLOC, QOS_LABEL, node
from tests.unit.relay_support import run

CREATE = KNOWN["/runtime.v1.RuntimeService/CreateContainer"]
RUN_POD = KNOWN["/runtime.v1.RuntimeService/RunPodSandbox"]


def sandbox(name: str) -> Any:
    uid = f"uid-{name}"
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace="default"),
        labels={"io.kubernetes.pod.uid": uid},
        linux=pb.LinuxPodSandboxConfig(cgroup_parent=f"/kubepods/besteffort/pod{uid}"),
    )


async def create(hooks: Any, name: str, between: Any = None, config: Any = None) -> str:
    """RunPodSandbox and CreateContainer through the hooks; `between` runs after the pre hook."""
    config = config if config is not None else sandbox(name)
    sid = f"sandbox-{name}"
    await hooks.run_pod_sandbox(
        pb.RunPodSandboxRequest(config=config), pb.RunPodSandboxResponse(pod_sandbox_id=sid), RUN_POD
    )
    request = pb.CreateContainerRequest(
        pod_sandbox_id=sid,
        config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name="main")),
        sandbox_config=config,
    )
    request = await hooks.create_container(request, CREATE)
    if between is not None:
        between()
    cid = f"ctr-{name}"
    await hooks.container_created(request, pb.CreateContainerResponse(container_id=cid), CREATE)
    return cid


def test_a_create_as_decided_asks_for_no_pass_one_the_plan_moved_under_does(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path) as n:
            hooks, reconciler = n.proxy.hooks, n.proxy.reconciler
            asked: list[int] = []
            request = reconciler.request
            reconciler.request = lambda *a, **k: asked.append(1) or request(*a, **k)  # type: ignore[method-assign]

            await create(hooks, "plain")
            assert asked == []  # BE on the BE pool, as decided: no pass has anything to do

            def lse_arrives() -> None:  # an LSE pod takes CPUs 0-1 while the create is at the runtime
                n.proxy.state.put_pod(
                    PodRecord(
                        "sandbox-lse",
                        "uid-lse",
                        "lse",
                        "default",
                        "/kubepods/poduid-lse",
                        labels={QOS_LABEL: "LSE"},
                        annotations={ALLOC: json.dumps({"cpuset": "0-1"})},
                    )
                )

            cid = await create(hooks, "raced", between=lse_arrives)
            assert asked  # its cpuset is no longer what the plan decides: a pass moves it
            decided = n.proxy.policy.plan().containers[cid].cpuset
            assert decided is not None and 0 not in decided
            await n.settle()  # that pass ends before the proxy stops

    run(main())


def test_a_create_under_a_v1_kubelet_file_asks_for_a_pass(tmp_path: Path) -> None:
    """A v1 kubelet file names containers by id: the runtime's id, unknown to the pre hook, may have
    an entry, so the decision made for the pending record may not be the created container's."""
    state = {"policyName": "static", "defaultCpuSet": "0,2-15", "entries": {"ctr-guar": "1"}, "checksum": 1}

    async def main() -> None:
        async with node(tmp_path, kubelet_state=state) as n:
            hooks, reconciler = n.proxy.hooks, n.proxy.reconciler
            for _ in range(100):  # the file is read by a poller
                if n.proxy.policy.ids_matter():
                    break
                await asyncio.sleep(0.05)
            assert n.proxy.policy.ids_matter()
            asked: list[int] = []
            request = reconciler.request
            reconciler.request = lambda *a, **k: asked.append(1) or request(*a, **k)  # type: ignore[method-assign]
            config = sandbox("guar")
            config.linux.cgroup_parent = "/kubepods/poduid-guar"  # Guaranteed: kubelet entries apply
            cid = await create(hooks, "guar", config=config)
            assert asked  # the pending record got the share pool; the entry for its id says CPU 1
            assert str(n.proxy.policy.plan().containers[cid].cpuset) == "1"
            await n.settle()

    run(main())
