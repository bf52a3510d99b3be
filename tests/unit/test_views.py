"""The proxy's live views and honest updates, in one process against the fake runtime: every
container the runtime lists, decided vs what it really has, marks, per-CPU holders and conflicts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from loguru import logger

from cri_api.v1 import api_pb2 as v1
from cri_proxy.cpu import CPUSet
from tests.unit.enforce_support import QOS_LABEL, Node, alloc, node
from tests.unit.relay_support import run

LSE = {QOS_LABEL: "LSE"}


async def pin(n: Node, cid: str, cpuset: str, force: bool = False) -> Any:
    body = json.dumps({"id": cid, "cpuset": cpuset, "force": force}).encode()
    return json.loads(await n.admin.unary_unary("/cri_proxy.v1.Introspect/Pin", None, None)(body))


async def update(n: Node, cid: str, cpuset: str) -> None:
    await n.stub().UpdateContainerResources(
        v1.UpdateContainerResourcesRequest(
            container_id=cid, linux=v1.LinuxContainerResources(cpuset_cpus=cpuset, cpu_shares=300)
        )
    )


def test_a_cpuset_changed_behind_the_proxys_back_is_marked_drift(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, reconcile_period_seconds=3600) as n:
            _, ls = await n.run_pod("ls", "burstable")
            _, be = await n.run_pod("be", "besteffort")
            rows = {r["id"]: r for r in await n.introspect("Cpusets")}
            assert rows[ls["main"]]["mark"] == "" and rows[ls["main"]]["actual"] == "0-15"
            n.fake.store.containers[ls["main"]].resources.cpuset_cpus = "5"  # behind the proxy's back
            rows = {r["id"]: r for r in await n.introspect("Cpusets")}
            row = rows[ls["main"]]
            assert (row["decided"], row["actual"], row["mark"], row["actual_source"]) == (
                "0-15",
                "5",
                "DRIFT",
                "status",
            )
            assert rows[be["main"]]["mark"] == ""
            problems = (await n.introspect("Problems"))["problems"]
            assert any(p["kind"] == "cpuset-drift" and p["pod"] == "default/ls" for p in problems)
            cpus = {r["cpu"]: r for r in (await n.introspect("Cpus"))["cpus"]}
            assert (
                "default/ls main" in cpus[5]["containers"] and "default/ls main" not in cpus[4]["containers"]
            )
            assert cpus[4]["pools"] == ["LS", "BE"] and cpus[4]["conflicts"] == []
            status = await n.introspect("Status")
            assert status["marks"] == {"drift": 1} and status["dry_run"] is False
            assert status["runtime_containers"] == 2
            # a container the runtime stopped on its own shows as exited, not running
            n.fake.store.containers[be["main"]].state = "EXITED"
            rows = {r["id"]: r for r in await n.introspect("Cpusets")}
            assert rows[be["main"]]["state"] == "exited"

    run(main())


def test_an_lse_pod_on_every_ls_cpu_is_named_with_the_containers_it_overlaps(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, numa={0: "0-3"}, reserved_cpus="") as n:
            _, ls = await n.run_pod("ls", "burstable")
            assert n.cpuset(ls["main"]) == "0-3"
            await n.run_pod("x", "guaranteed", LSE, alloc("0-3"))
            await n.settle()
            assert n.cpuset(ls["main"]) == "0-3"  # the pool is empty: left as it was
            problems = (await n.introspect("Problems"))["problems"]
            (exhausted,) = [p for p in problems if p["kind"] == "pool-exhausted" and p["pod"] == "default/ls"]
            assert exhausted["holders"] == ["LSE default/x (0-3)"]
            assert exhausted["overlapping"] == ["default/ls main (0-3)"]
            assert "LSE default/x" in exhausted["message"] and "default/ls main" in exhausted["message"]
            (broken,) = [p for p in problems if p["kind"] == "exclusive-overlap"]
            assert broken["pod"] == "default/x" and broken["others"] == ["default/ls main (0-3)"]
            cpus = (await n.introspect("Cpus"))["cpus"]
            assert [r["holders"] for r in cpus] == [["LSE default/x"]] * 4
            assert all(r["pools"] == ["LSE"] for r in cpus)
            assert all(r["conflicts"] == ["default/ls main is on LSE default/x's CPU"] for r in cpus)

    run(main())


def test_updates_are_honest(tmp_path: Path) -> None:
    async def main() -> None:
        lines: list[dict[str, Any]] = []
        sink = logger.add(
            lambda m: lines.append({"msg": m.record["message"], **m.record["extra"]}), level="INFO"
        )
        try:
            async with node(tmp_path) as n:
                _, ls = await n.run_pod("ls", "burstable")
                cid = ls["main"]
                refused = await pin(n, cid, "3")
                assert "default/ls main" in refused["refused"] and "is LS" in refused["refused"]
                assert "rules give it 0-15" in refused["refused"] and "--force" in refused["refused"]
                assert (await pin(n, cid, "0-15"))["same"] is True
                # a raw CRI update (any client): the decided cpuset replaces the asked one, said and counted
                await update(n, cid, "3")
                assert n.cpuset(cid) == "0-15" and n.proxy.hooks.replaced == 1
                (said,) = [line for line in lines if "asked for cpuset 3" in line["msg"]]
                assert (said["namespace"], said["pod"], said["container"]) == ("default", "ls", "main")
                assert "replaced by 0-15" in said["msg"]
                # CPUs that are not online: refused, naming them, for any client
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await update(n, cid, "3,99-100")
                assert (
                    err.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "99-100" in err.value.details()
                )
                assert "not online" in (await pin(n, cid, "99", force=True))["refused"]
                # --force: pinned, applied and kept across passes
                assert (await pin(n, cid, "3", force=True))["pinned"] == "3"
                await update(n, cid, "3")
                await n.settle()
                assert n.cpuset(cid) == "3" and n.proxy.hooks.replaced == 1
                row = next(r for r in await n.introspect("Cpusets") if r["id"] == cid)
                assert (row["decided"], row["actual"], row["mark"]) == ("3", "3", "")
                assert "pinned by an operator" in row["why"] and "rules: 0-15" in row["why"]
                # forcing the rules' own set removes the pin
                assert (await pin(n, cid, "0-15", force=True))["pinned"] == "0-15"
                await n.settle()
                assert n.cpuset(cid) == "0-15" and not n.proxy.policy.pins
        finally:
            logger.remove(sink)

    run(main())


def test_a_container_with_no_cpuset_is_on_every_cpu_in_the_views(tmp_path: Path) -> None:
    """No cpuset set ("" in its status: a container from before the proxy, or reset behind its
    back) means every online CPU, as the reconciler takes it. The views took it as on no CPU: a
    container on an LSR pod's CPUs hid from the per-CPU view and from `exclusive-overlap`, and one
    on every CPU as decided was marked DRIFT."""

    async def main() -> None:
        async with node(tmp_path, reconcile_period_seconds=3600) as n:
            _, ls = await n.run_pod("ls", "burstable")
            n.fake.store.containers[ls["main"]].resources.cpuset_cpus = ""
            row = next(r for r in await n.introspect("Cpusets") if r["id"] == ls["main"])
            assert (row["decided"], row["actual"], row["mark"]) == ("0-15", "", "")
            await n.run_pod("lsr", "guaranteed", {QOS_LABEL: "LSR"}, alloc("2-3"))
            await n.settle()
            assert n.cpuset(ls["main"]) == "0-1,4-15"
            n.fake.store.containers[ls["main"]].resources.cpuset_cpus = ""  # reset behind its back
            row = next(r for r in await n.introspect("Cpusets") if r["id"] == ls["main"])
            assert (row["decided"], row["actual"], row["mark"]) == ("0-1,4-15", "", "DRIFT")
            cpus = {r["cpu"]: r for r in (await n.introspect("Cpus"))["cpus"]}
            assert "default/ls main" in cpus[2]["containers"] and "default/ls main" in cpus[9]["containers"]
            assert cpus[2]["conflicts"] == ["default/ls main is on LSR default/lsr's CPU"]
            problems = (await n.introspect("Problems"))["problems"]
            (overlap,) = [p for p in problems if p["kind"] == "exclusive-overlap"]
            assert overlap["pod"] == "default/lsr" and overlap["others"] == ["default/ls main (2-3)"]

    run(main())


def test_rows_mark_gone_and_untracked_and_a_runtime_that_cannot_be_listed() -> None:
    from cri_proxy.cpu import CPUSet, NodeInputs, Topology, decide
    from cri_proxy.enforce import views
    from cri_proxy.enforce.observe import Seen
    from cri_proxy.state.model import ContainerRecord, PodRecord

    pod = PodRecord("s1", "u1", "p", "ns", "/kubepods/burstable/podu1")
    tracked = ContainerRecord("c1", "s1", "main", applied="0-3")
    online = CPUSet.parse("0-3")
    plan = decide(
        NodeInputs(topology=Topology.single_node(online), pods=(), reserved=CPUSet(), system=CPUSet())
    )
    seen = {"c2": Seen("c2", "s9", "side", "other/q", "running", "1", "status")}
    i = views.Inputs([pod], [tracked], plan, seen, False, online, CPUSet())
    rows = {r["id"]: r for r in views.container_rows(i)}
    assert rows["c1"]["mark"] == "GONE" and rows["c2"]["mark"] == "UNTRACKED"
    assert rows["c2"]["pod"] == "other/q" and rows["c2"]["actual"] == "1"
    unlisted = views.Inputs([pod], [tracked], plan, None, True, online, CPUSet())
    (row,) = views.container_rows(unlisted)
    assert row["mark"] == "" and row["actual"] is None and row["dry_run"] is True


def test_the_cpus_table_is_coloured_only_on_a_terminal() -> None:
    from cri_proxy.ctl.cpus import RED, table

    rows = [
        {
            "cpu": 0,
            "pools": ["LSE"],
            "holders": ["LSE a/x"],
            "containers": ["a/x m", "b/y n"],
            "conflicts": ["b/y n is on LSE a/x's CPU"],
        },
        {"cpu": 1, "pools": ["LS", "BE"], "holders": [], "containers": [], "conflicts": []},
    ]
    plain = table(rows, tty=False).splitlines()
    assert plain[0].split() == ["CPU", "POOL", "HOLDER", "CONTAINERS", "CONFLICTS"] and "\x1b" not in "".join(
        plain
    )
    assert plain[2].split() == ["1", "LS,BE", "-", "-", "-"]
    coloured = table(rows, tty=True).splitlines()
    assert coloured[1].startswith(RED) and "\x1b" not in coloured[2]


async def unpin(n: Node, cid: str) -> Any:
    body = json.dumps({"id": cid}).encode()
    return json.loads(await n.admin.unary_unary("/cri_proxy.v1.Introspect/Unpin", None, None)(body))


def test_an_operator_pin_survives_a_restart_until_unpinned_or_the_container_is_gone(tmp_path: Path) -> None:
    from cri_proxy.fake_runtime.server import FakeOptions, FakeRuntime
    from cri_proxy.state import checkpoint

    async def main() -> None:
        fake = FakeRuntime(FakeOptions(listen=f"unix://{tmp_path}/runtime.sock"))
        await fake.start()
        try:
            async with node(tmp_path, fake=fake) as n:
                _, ls = await n.run_pod("ls", "burstable", containers=("a", "b", "c"))
                a, b, c = ls["a"], ls["b"], ls["c"]
                for cid, cpus in ((a, "3"), (b, "4-5"), (c, "6")):
                    assert (await pin(n, cid, cpus, force=True))["pinned"] == cpus
                await n.settle()
                assert (n.cpuset(a), n.cpuset(b), n.cpuset(c)) == ("3", "4-5", "6")
                await n.proxy.checkpoints.save()
            saved = checkpoint.load(tmp_path / "state/checkpoint.json")
            assert saved is not None and {r.id: r.pin for r in saved[1]} == {a: "3", b: "4-5", c: "6"}
            del fake.store.containers[c]  # gone at the runtime while the proxy is down
            (tmp_path / "proxy.sock").unlink(missing_ok=True)
            async with node(tmp_path, fake=fake, reconcile_period_seconds=3600) as n:
                await n.settle()
                assert n.proxy.policy.pins == {a: CPUSet.parse("3"), b: CPUSet.parse("4-5")}
                rows = {r["id"]: r for r in await n.introspect("Cpusets")}
                assert (rows[a]["decided"], rows[a]["actual"], rows[a]["mark"], rows[a]["pinned"]) == (
                    "3",
                    "3",
                    "",
                    "3",
                )
                assert "pinned by an operator" in rows[a]["why"] and "rules: 0-15" in rows[a]["why"]
                assert c not in rows and (await n.introspect("Status"))["pins"] == 2
                # the rules' set again is applied by the proxy itself
                assert (await unpin(n, a)) == {"unpinned": "3", "cpuset": "0-15"}
                await n.settle()
                assert n.cpuset(a) == "0-15" and n.cpuset(b) == "4-5"
                refused = await unpin(n, a)
                assert refused["code"] == "FAILED_PRECONDITION" and "default/ls a" in refused["refused"]
                assert "no operator pin" in refused["refused"]
                assert (await unpin(n, "nosuch"))["code"] == "NOT_FOUND"
                # a container removed through the proxy takes its pin with it
                rt = n.stub()
                await rt.StopContainer(v1.StopContainerRequest(container_id=b))
                await rt.RemoveContainer(v1.RemoveContainerRequest(container_id=b))
                assert n.proxy.state.container(b) is None and not n.proxy.policy.pins
                await n.proxy.checkpoints.save()
            saved = checkpoint.load(tmp_path / "state/checkpoint.json")
            assert saved is not None and all(r.pin is None for r in saved[1])
        finally:
            await fake.stop(0)

    run(main())
