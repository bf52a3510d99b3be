"""Recovery against the in-process fake runtime, over a real Unix socket."""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf.message import DecodeError

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from cri_proxy.enforce import lenient
from cri_proxy.enforce.recovery import (
    Recovered,
    canonical_cpuset,
    cgroup_parent_from_info,
    read_runtime,
    recover,
)
from cri_proxy.fake_runtime.server import FakeOptions, FakeRuntime
from cri_proxy.fake_runtime.service import RuntimeServicer
from cri_proxy.state.model import ContainerRecord, ContainerState, PodRecord
from tests.unit.relay_support import run


@dataclass
class Bed:
    fake: FakeRuntime
    channel: grpc.aio.Channel
    rt: Any  # RuntimeServiceStub

    async def pod(
        self,
        name: str,
        *,
        parent: str | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> tuple[str, Any]:
        uid = f"uid-{name}"
        config = v1.PodSandboxConfig(
            metadata=v1.PodSandboxMetadata(name=name, uid=uid, namespace="team"),
            labels={"io.kubernetes.pod.uid": uid, **(labels or {})},
            annotations=annotations or {},
        )
        if parent is None:
            config.linux.cgroup_parent = f"/kubepods/burstable/pod{uid}"
        elif parent:
            config.linux.cgroup_parent = parent
        response = await self.rt.RunPodSandbox(v1.RunPodSandboxRequest(config=config))
        return response.pod_sandbox_id, config

    async def container(
        self, pod: tuple[str, Any], name: str, *, attempt: int = 0, start: bool = True, cpuset: str = ""
    ) -> str:
        sandbox_id, sandbox_config = pod
        config = v1.ContainerConfig(
            metadata=v1.ContainerMetadata(name=name, attempt=attempt),
            image=v1.ImageSpec(image="localhost/busybox:latest"),
            linux=v1.LinuxContainerConfig(
                resources=v1.LinuxContainerResources(cpu_period=100_000, cpu_shares=102, oom_score_adj=999)
            ),
        )
        request = v1.CreateContainerRequest(
            pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox_config
        )
        container_id: str = (await self.rt.CreateContainer(request)).container_id
        if start:
            await self.rt.StartContainer(v1.StartContainerRequest(container_id=container_id))
        if cpuset:
            await self.rt.UpdateContainerResources(
                v1.UpdateContainerResourcesRequest(
                    container_id=container_id, linux=v1.LinuxContainerResources(cpuset_cpus=cpuset)
                )
            )
        return container_id


@contextlib.asynccontextmanager
async def bed(**options: Any) -> AsyncIterator[Bed]:
    with tempfile.TemporaryDirectory(prefix="cri-proxy-recovery-") as tmp:
        endpoint = f"unix://{tmp}/runtime.sock"
        fake = FakeRuntime(FakeOptions(listen=endpoint, **options))
        await fake.start()
        channel = grpc.aio.insecure_channel(endpoint)
        try:
            yield Bed(fake, channel, v1_grpc.RuntimeServiceStub(channel))  # type: ignore[no-untyped-call]
        finally:
            await channel.close(None)
            await fake.stop(0)


def _by_name(result: Recovered) -> dict[str, ContainerRecord]:
    return {c.name: c for c in result.containers}


def test_recovers_pods_and_live_containers() -> None:
    async def main() -> None:
        async with bed() as b:
            web = await b.pod(
                "web",
                labels={"koordinator.sh/qosClass": "LSR"},
                annotations={"scheduling.koordinator.sh/resource-status": '{"cpuset":"1-3"}'},
            )
            app = await b.container(web, "app", attempt=2, cpuset="3,1-2")
            side = await b.container(web, "side", start=False)
            done = await b.container(web, "done")
            await b.rt.StopContainer(v1.StopContainerRequest(container_id=done))
            weird = await b.container(web, "weird", cpuset="abc")
            stopped = await b.pod("stopped", parent="/kubepods/besteffort/poduid-stopped")
            await b.container(stopped, "gone-with-pod")
            await b.rt.StopPodSandbox(v1.StopPodSandboxRequest(pod_sandbox_id=stopped[0]))

            result = await recover(b.channel, None)

            pods = {p.name: p for p in result.pods}
            assert pods["web"] == PodRecord(
                sandbox_id=web[0],
                uid="uid-web",
                name="web",
                namespace="team",
                cgroup_parent="/kubepods/burstable/poduid-web",
                labels={"io.kubernetes.pod.uid": "uid-web", "koordinator.sh/qosClass": "LSR"},
                annotations={"scheduling.koordinator.sh/resource-status": '{"cpuset":"1-3"}'},
                ready=True,
            )
            assert pods["stopped"].ready is False
            assert pods["stopped"].cgroup_parent == "/kubepods/besteffort/poduid-stopped"

            containers = _by_name(result)
            assert set(containers) == {"app", "side", "weird"}  # exited ones are not recovered
            assert containers["app"].id == app and containers["app"].sandbox_id == web[0]
            assert (containers["app"].state, containers["app"].attempt) == (ContainerState.RUNNING, 2)
            assert containers["app"].applied == "1-3"  # canonical
            resources = containers["app"].linux_resources()
            assert resources == b.fake.store.containers[app].resources
            assert (resources.cpuset_cpus, resources.cpu_shares, resources.oom_score_adj) == (
                "3,1-2",
                102,
                999,
            )
            assert containers["side"].id == side
            assert (containers["side"].state, containers["side"].applied) == (ContainerState.CREATED, "")
            assert containers["weird"].id == weird and containers["weird"].applied == "abc"  # kept as text
            assert result.problems == []

    run(main())


def test_checkpoint_entries_the_runtime_lacks_are_dropped() -> None:
    async def main() -> None:
        async with bed() as b:
            web = await b.pod("web")
            app = await b.container(web, "app", cpuset="0")
            checkpoint: tuple[list[PodRecord], list[ContainerRecord]] = (
                [
                    PodRecord(web[0], "uid-web", "web", "team", "/stale", api_version="v1alpha2"),
                    PodRecord("gone-pod", "uid-gone", "gone", "team", "/kubepods/podgone"),
                ],
                [
                    ContainerRecord(
                        app, web[0], "app", b"", ContainerState.CREATED, "5", api_version="v1alpha2"
                    ),
                    ContainerRecord("gone-ctr", "gone-pod", "x", b"", ContainerState.RUNNING, "1"),
                    ContainerRecord("gone-2", web[0], "y", b"", ContainerState.RUNNING, "1"),
                ],
            )
            result = await recover(b.channel, checkpoint)
            assert [p.sandbox_id for p in result.pods] == [web[0]]
            assert [c.id for c in result.containers] == [app]
            assert result.dropped_pods == ["gone-pod"]
            assert result.dropped_containers == ["gone-2", "gone-ctr"]
            # The runtime wins on what it knows; the checkpoint keeps only the API version kubelet used.
            pod, container = result.pods[0], result.containers[0]
            assert (pod.cgroup_parent, pod.api_version) == ("/kubepods/burstable/poduid-web", "v1alpha2")
            assert (container.state, container.applied, container.api_version) == (
                ContainerState.RUNNING,
                "0",
                "v1alpha2",
            )
            assert container.linux_resources().cpu_shares == 102

    run(main())


def test_checkpoint_supplies_resources_the_runtime_does_not_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime older than CRI 1.25 leaves ContainerStatus.resources out."""
    original = RuntimeServicer._status

    def without_resources(self: RuntimeServicer, c: Any) -> Any:
        status = original(self, c)
        status.ClearField("resources")
        return status

    monkeypatch.setattr(RuntimeServicer, "_status", without_resources)
    saved = v1.LinuxContainerResources(cpu_shares=2048, cpuset_cpus="0-1", memory_limit_in_bytes=1 << 30)

    async def main() -> None:
        async with bed() as b:
            web = await b.pod("web")
            known = await b.container(web, "known")
            unknown = await b.container(web, "unknown")
            checkpoint: tuple[list[PodRecord], list[ContainerRecord]] = (
                [],
                [ContainerRecord(known, web[0], "known", saved.SerializeToString(), applied="0-1")],
            )
            result = await recover(b.channel, checkpoint)
            containers = _by_name(result)
            assert containers["known"].linux_resources() == saved
            assert containers["known"].applied == "0-1"
            assert containers["known"].state is ContainerState.RUNNING  # the state is the runtime's
            assert (containers["unknown"].id, containers["unknown"].resources) == (unknown, b"")
            assert containers["unknown"].applied is None
            assert len(result.problems) == 1
            assert "unknown" in result.problems[0] and "no resources" in result.problems[0]

    run(main())


def test_missing_cgroup_parent_comes_from_checkpoint_or_is_reported() -> None:
    async def main() -> None:
        async with bed() as b:
            a = await b.pod("a", parent="")
            c = await b.pod("c", parent="")
            pod = PodRecord(a[0], "uid-a", "a", "team", "/kubepods/poduid-a")
            result = await recover(b.channel, ([pod], []))
            pods = {p.name: p for p in result.pods}
            assert pods["a"].cgroup_parent == "/kubepods/poduid-a"
            assert pods["c"].cgroup_parent == ""
            assert len(result.problems) == 1
            assert "team/c" in result.problems[0] and c[0][:13] in result.problems[0]

    run(main())


def test_container_vanishing_between_list_and_status_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    original = RuntimeServicer.ContainerStatus

    async def vanish_first(self: RuntimeServicer, request: Any, context: Any) -> Any:
        c = self.store.containers.get(request.container_id)
        if c is not None and c.config.metadata.name == "ghost":
            del self.store.containers[c.id]
        return await original(self, request, context)

    monkeypatch.setattr(RuntimeServicer, "ContainerStatus", vanish_first)

    async def main() -> None:
        async with bed() as b:
            web = await b.pod("web")
            await b.container(web, "ghost")
            await b.container(web, "real")
            result = await recover(b.channel, None)
            assert [c.name for c in result.containers] == ["real"]
            assert result.problems == []

    run(main())


def test_other_runtime_errors_are_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(self: RuntimeServicer, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.INTERNAL, "disk on fire")

    monkeypatch.setattr(RuntimeServicer, "ContainerStatus", broken)

    async def main() -> None:
        async with bed(seed_pods=40, seed_containers_per_pod=2) as b:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await recover(b.channel, None)
            assert err.value.code() is grpc.StatusCode.INTERNAL

    run(main())


def test_unreachable_runtime_raises() -> None:
    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            async with grpc.aio.insecure_channel(f"unix://{tmp}/nothing.sock") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await recover(channel, None, timeout=1.0)
                assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

    run(main())


def test_500_containers_recover_with_bounded_concurrency(monkeypatch: pytest.MonkeyPatch) -> None:
    in_flight = peak = 0
    original = RuntimeServicer.ContainerStatus

    async def counted(self: RuntimeServicer, request: Any, context: Any) -> Any:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            return await original(self, request, context)
        finally:
            in_flight -= 1

    monkeypatch.setattr(RuntimeServicer, "ContainerStatus", counted)

    async def main() -> None:
        # 5 ms per call, so that calls overlap; the time itself is bench/sync.py's business
        async with bed(seed_pods=100, seed_containers_per_pod=5, latency=0.005) as b:
            result = await recover(b.channel, None)
            assert (len(result.pods), len(result.containers)) == (100, 500)
            assert all(c.applied == "0-1" and c.state is ContainerState.RUNNING for c in result.containers)
            assert 1 < peak <= 16

    run(main())


@pytest.mark.parametrize(
    "info,expected",
    [
        ({"info": json.dumps({"config": {"linux": {"cgroup_parent": "/kubepods/podx"}}})}, "/kubepods/podx"),
        (
            {
                "info": json.dumps(
                    {"runtimeSpec": {"annotations": {"io.kubernetes.cri-o.CgroupParent": "kubepods.slice"}}}
                )
            },
            "kubepods.slice",
        ),
        ({"info": json.dumps({"config": {"linux": {}}})}, ""),
        ({"info": json.dumps({"config": {"linux": {"cgroup_parent": 5}}})}, ""),
        ({"info": json.dumps(["not", "an", "object"])}, ""),
        ({"info": "{not json"}, ""),
        ({}, ""),
    ],
    ids=["containerd", "cri-o", "no-parent", "wrong-type", "list", "not-json", "no-info"],
)
def test_cgroup_parent_from_verbose_info(info: dict[str, str], expected: str) -> None:
    assert cgroup_parent_from_info(info) == expected


@pytest.mark.parametrize(
    "text,expected", [("3,1-2", "1-3"), ("0 - 1, 4", "0-1,4"), ("", ""), ("0-7:2", "0-7:2"), ("x", "x")]
)
def test_canonical_cpuset(text: str, expected: str) -> None:
    assert canonical_cpuset(text) == expected


def test_recovered_records_feed_the_node_state() -> None:
    from cri_proxy.state.model import NodeState

    async def main() -> None:
        async with bed() as b:
            web = await b.pod("web", labels={"koordinator.sh/qosClass": "LS"})
            await b.container(web, "app")
            result = await recover(b.channel, None)
            state = NodeState()
            state.replace_all(result.pods, result.containers)
            (info,) = state.pod_infos()
            assert (info.name, [c.name for c in info.containers]) == ("web", ["app"])

    run(main())


def test_labels_and_annotations_that_are_not_utf8_never_stop_a_listing() -> None:
    """containerd 1.6 stores any bytes; strict protobuf parsing would refuse the whole reply."""
    pod_type = lenient.message_class("PodSandbox")

    def sandbox(sid: str, name: str, bad: bool) -> Any:
        item = pod_type(id=sid.encode(), state=v1.SANDBOX_READY)
        item.metadata.name, item.metadata.uid, item.metadata.namespace = (
            name.encode(),
            b"u-" + name.encode(),
            b"team",
        )
        entry = item.annotations.add()
        entry.key, entry.value = (b"note", b"caf\xe9 \xff") if bad else (b"note", b"ok")
        return item

    listing = lenient.message_class("ListPodSandboxResponse")(
        items=[sandbox("s-bad", "bad", True), sandbox("s-good", "good", False)]
    )
    containers = lenient.message_class("ListContainersResponse")()
    c = containers.containers.add(id=b"c1", pod_sandbox_id=b"s-bad", state=v1.CONTAINER_RUNNING)
    c.metadata.name = b"app"
    label = c.labels.add()
    label.key, label.value = b"\xfe", b"x"
    status = lenient.message_class("ContainerStatusResponse")()
    status.status.id, status.status.state = b"c1", v1.CONTAINER_RUNNING
    status.status.resources.linux.cpuset_cpus = b"1"
    bad_label = status.status.labels.add()
    bad_label.key, bad_label.value = b"\xfe", b"x"
    info = json.dumps({"config": {"linux": {"cgroup_parent": "/kubepods/burstable/podu"}}}).encode()

    def pod_status(request: bytes) -> bytes:
        reply = lenient.message_class("PodSandboxStatusResponse")()
        entry = reply.info.add()
        entry.key, entry.value = b"info", info
        return bytes(reply.SerializeToString())

    answers: dict[str, Any] = {
        "ListPodSandbox": lambda _: listing.SerializeToString(),
        "ListContainers": lambda _: containers.SerializeToString(),
        "PodSandboxStatus": pod_status,
        "ContainerStatus": lambda _: status.SerializeToString(),
    }

    class Raw(grpc.GenericRpcHandler):
        def service(self, details: Any) -> Any:
            name = details.method.rsplit("/", 1)[-1]
            answer = answers.get(name)
            if answer is None:
                return None

            async def behaviour(request: bytes, context: Any) -> bytes:
                return bytes(answer(request))

            return grpc.unary_unary_rpc_method_handler(behaviour)

    with pytest.raises(DecodeError):  # what a strict reader meets
        v1.ListPodSandboxResponse.FromString(listing.SerializeToString())

    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            server = grpc.aio.server()
            server.add_generic_rpc_handlers((Raw(),))
            server.add_insecure_port(f"unix://{tmp}/raw.sock")
            await server.start()
            try:
                async with grpc.aio.insecure_channel(f"unix://{tmp}/raw.sock") as channel:
                    view = await read_runtime(channel, {}, {}, full=True, timeout=5)
            finally:
                await server.stop(0)
        assert set(view.pods) == {"s-bad", "s-good"}
        bad, good = view.pods["s-bad"], view.pods["s-good"]
        assert bad.annotations == {"note": "caf\ufffd \ufffd"} and good.annotations == {"note": "ok"}
        assert len(bad.problems) == 1 and "note" in bad.problems[0] and good.problems == ()
        assert bad.cgroup_parent == "/kubepods/burstable/podu"
        assert any("team/bad" in p for p in view.problems)
        assert view.containers["c1"].applied == "1" and view.containers["c1"].state is ContainerState.RUNNING

    run(main())
