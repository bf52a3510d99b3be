"""Following re-binds through the Kubernetes API: a real HTTP server speaking the pods list/watch
protocol (tests/unit/kube_api_server.py), the real `kubernetes` client in the proxy, the proxy in
front of the fake runtime. Plus the precedence rule of the node state and the `[kubernetes]` table.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from cri_proxy import config as config_mod
from cri_proxy.errors import ConfigError
from cri_proxy.sources.kube_api import KubeApiWatcher
from cri_proxy.state.model import NodeState, PodRecord
from tests.unit.enforce_support import ALLOC, QOS_LABEL, Node, alloc, node
from tests.unit.kube_api_server import KubeApiServer
from tests.unit.relay_support import eventually, run

LSR = {QOS_LABEL: "LSR"}
LS = {QOS_LABEL: "LS"}


def watcher(n: Node) -> KubeApiWatcher:
    api = n.proxy.kube_api
    assert api is not None
    return api


async def synced(n: Node) -> KubeApiWatcher:
    """Listed and watching."""
    api = watcher(n)
    await eventually(lambda: api.lists >= 1 and api.watches >= 1, "the watcher lists and watches")
    return api


@contextlib.asynccontextmanager
async def api_node(
    tmp: Path, server: KubeApiServer, token_file: Path | None = None, **config: Any
) -> AsyncIterator[Node]:
    kubeconfig = server.kubeconfig(tmp / "kubeconfig", token_file)
    async with node(
        tmp,
        kubernetes_enabled=True,
        kubernetes_node_name=server.node,
        kubernetes_kubeconfig=str(kubeconfig),
        **config,
    ) as n:
        yield n


@contextlib.asynccontextmanager
async def lsr_pod_on_2_3(
    tmp: Path,
) -> AsyncIterator[tuple[KubeApiServer, Node, KubeApiWatcher, dict[str, str]]]:
    """The API has an LSR pod allocated 2-3; a node follows the API (listed and watching) and runs
    that pod through CRI: (the API server, the node, its watcher, the pod's containers by name)."""
    with KubeApiServer() as server:
        server.put_pod("lsr", labels=LSR, annotations=alloc("2-3"))
        async with api_node(tmp, server) as n:
            api = await synced(n)
            _, lsr = await n.run_pod("lsr", "guaranteed", LSR, alloc("2-3"))
            yield server, n, api, lsr


async def problem_kinds(n: Node) -> list[str]:
    return [p["kind"] for p in (await n.introspect("Plan"))["problems"]]


# -- re-binds -------------------------------------------------------------------------------------
def test_a_rebind_in_the_api_moves_the_container_and_the_ls_pool_follows(tmp_path: Path) -> None:
    async def main() -> None:
        with KubeApiServer() as server:
            server.put_pod("lsr", labels=LSR, annotations=alloc("2-3"))
            server.put_pod("ls")
            server.put_pod("elsewhere", labels=LSR, annotations=alloc("6-7"), node="node-2")
            async with api_node(tmp_path, server) as n:
                api = await synced(n)
                _, lsr = await n.run_pod("lsr", "guaranteed", LSR, alloc("2-3"))
                _, ls = await n.run_pod("ls", "burstable")
                assert (n.cpuset(lsr["main"]), n.cpuset(ls["main"])) == ("2-3", "0-1,4-15")

                server.annotate("uid-lsr", alloc("4-5"))  # the scheduler re-binds the pod
                await eventually(
                    lambda: (n.cpuset(lsr["main"]), n.cpuset(ls["main"])) == ("4-5", "0-3,6-15"),
                    "the LSR container on 4-5, LS off it",
                )
                plan = await n.introspect("Plan")
                assert plan["containers"][lsr["main"]]["why"].endswith(
                    "(allocation from the Kubernetes API)"
                ), plan["containers"][lsr["main"]]
                assert "Kubernetes API" not in plan["containers"][ls["main"]]["why"]
                assert "api-unreachable" not in await problem_kinds(n)
                snapshot = await n.introspect("Snapshot")  # replays to the same decision
                (pod,) = [p for p in snapshot["pods"] if p["name"] == "lsr"]
                assert json.loads(pod["annotations"][ALLOC]) == {"cpuset": "4-5"}

                server.delete_pod("uid-lsr")  # gone from the API: the CRI values again
                await eventually(lambda: n.cpuset(lsr["main"]) == "2-3", "back on the CRI allocation")
                await n.settle()
                assert n.cpuset(ls["main"]) == "0-1,4-15"

            # only this node's pods, by field selector, with the kubeconfig's credentials
            lists = server.list_requests()
            assert lists and all(r.params["fieldSelector"] == "spec.nodeName=node-1" for r in lists)
            assert all(r.authorization == "Bearer test-token" for r in server.requests)
            watches = server.watch_requests()
            assert watches[0].params["resourceVersion"] == str(1003)  # the list's
            assert watches[0].params["allowWatchBookmarks"] == "true"
            assert api.problem is None

    run(main())


def test_a_qos_label_change_in_the_api_makes_the_pod_exclusive(tmp_path: Path) -> None:
    async def main() -> None:
        with KubeApiServer() as server:
            server.put_pod("web", labels=LS, annotations=alloc("2-3"))
            async with api_node(tmp_path, server) as n:
                await synced(n)
                _, web = await n.run_pod("web", "burstable", LS, alloc("2-3"))  # LS: its cpuset is ignored
                _, other = await n.run_pod("other", "burstable")
                assert (n.cpuset(web["main"]), n.cpuset(other["main"])) == ("0-15", "0-15")

                server.label("uid-web", LSR)
                await eventually(
                    lambda: (n.cpuset(web["main"]), n.cpuset(other["main"])) == ("2-3", "0-1,4-15"),
                    "web pinned to 2-3 as LSR, the other LS container off it",
                )
                plan = await n.introspect("Plan")
                assert plan["containers"][web["main"]]["qos"] == "LSR"
                assert plan["containers"][web["main"]]["why"].endswith("(QoS label from the Kubernetes API)")

    run(main())


# -- the protocol -----------------------------------------------------------------------------------
def test_410_gone_on_the_watch_lists_again(tmp_path: Path) -> None:
    async def main() -> None:
        async with lsr_pod_on_2_3(tmp_path) as (server, n, api, lsr):
            # a change whose event was lost to compaction: only a new list can see it
            server.annotate("uid-lsr", alloc("6-7"), emit=False)
            await asyncio.sleep(0.1)
            assert n.cpuset(lsr["main"]) == "2-3"
            server.expire()  # the open watch gets an ERROR event with code 410
            await eventually(lambda: n.cpuset(lsr["main"]) == "6-7", "the re-listed allocation applied")
            assert api.lists == 2
            assert api.problem is None

            # the same when the watch request itself is answered 410
            server.annotate("uid-lsr", alloc("8-9"), emit=False)
            server.gone_http_next()
            server.drop_watches()
            await eventually(lambda: n.cpuset(lsr["main"]) == "8-9", "re-listed after an HTTP 410")
            assert api.lists == 3
            statuses = [r.status for r in server.watch_requests()]
            assert 410 in statuses
            await eventually(lambda: server.open_watches == 1, "watching again")
            assert api.problem is None

    run(main())


def test_410_right_after_each_list_lists_again_with_back_off_and_is_no_problem(tmp_path: Path) -> None:
    """An API server whose watch cache lags the one that listed answers every watch 410 Gone,
    even from a fresh list's resourceVersion. Each list is still the truth: the watcher lists
    again (spaced out with back-off), reports no problem, and watches again once it can. Before,
    the third 410 in a row became `api-unreachable` and no list ever came again: the views went
    stale for good, the problem flapping at each try."""

    async def main() -> None:
        with KubeApiServer() as server:
            server.put_pod("lsr", labels=LSR, annotations=alloc("2-3"))
            state = NodeState()
            seen: list[object] = []
            kubeconfig = server.kubeconfig(tmp_path / "kubeconfig")
            api = KubeApiWatcher(
                state, server.node, str(kubeconfig), lambda: seen.append(api.problem), backoff=0.02
            )
            task = asyncio.ensure_future(api.run())
            try:
                await eventually(lambda: server.open_watches == 1, "watching")
                for _ in range(6):
                    server.gone_http_next()
                server.annotate("uid-lsr", alloc("4-5"), emit=False)
                server.expire()  # the open watch ends 410; then six watch requests answered 410
                await eventually(lambda: len(server.list_requests()) >= 8, "a list after each 410")
                server.annotate("uid-lsr", alloc("6-7"))
                await eventually(
                    lambda: json.loads(state.api_views()["uid-lsr"].annotations[ALLOC])["cpuset"] == "6-7",
                    "watching again",
                )
                assert [r.status for r in server.watch_requests()][-7:] == [410] * 6 + [200]
                assert api.problem is None and not any(seen)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    run(main())


def test_a_dropped_watch_resumes_from_the_last_resource_version(tmp_path: Path) -> None:
    async def main() -> None:
        async with lsr_pod_on_2_3(tmp_path) as (server, n, api, lsr):
            server.annotate("uid-lsr", alloc("4-5"))
            await eventually(lambda: n.cpuset(lsr["main"]) == "4-5", "first re-bind")
            last = str(server.resource_version)
            assert api.resource_version == last
            watches_before = len(server.watch_requests())

            assert server.drop_watches() == 1  # cut in the middle of a chunk
            server.annotate("uid-lsr", alloc("10-11"))  # while (or just after) it is down
            await eventually(lambda: n.cpuset(lsr["main"]) == "10-11", "the event after the drop")
            resumed = server.watch_requests()[watches_before]
            assert resumed.params["resourceVersion"] == last
            assert len(server.list_requests()) == 1  # resumed, not re-listed
            assert api.problem is None

    run(main())


def test_bookmarks_move_the_resume_point(tmp_path: Path) -> None:
    async def main() -> None:
        with KubeApiServer() as server:
            async with api_node(tmp_path, server) as n:
                api = await synced(n)
                for i in range(3):  # other nodes' pods move the resourceVersion on
                    server.put_pod(f"other-{i}", node="node-2")
                mark = server.bookmark()
                await eventually(lambda: api.resource_version == str(mark), "the bookmark's resourceVersion")
                assert not n.proxy.state.api_views()  # other nodes' pods are not this node's business
                before = len(server.watch_requests())
                server.drop_watches()
                await eventually(lambda: len(server.watch_requests()) > before, "a new watch")
                assert server.watch_requests()[before].params["resourceVersion"] == str(mark)

    run(main())


# -- faults ---------------------------------------------------------------------------------------
def test_api_down_at_start_cri_still_works_then_the_watcher_catches_up(tmp_path: Path) -> None:
    async def main() -> None:
        server = KubeApiServer().start()
        server.stop()  # the port is known, nothing listens on it
        async with api_node(tmp_path, server) as n:
            api = watcher(n)
            _, lsr = await n.run_pod("lsr", "guaranteed", LSR, alloc("2-3"))
            _, ls = await n.run_pod("ls", "burstable")
            assert (n.cpuset(lsr["main"]), n.cpuset(ls["main"])) == ("2-3", "0-1,4-15")  # CRI alone
            await eventually(lambda: api.problem is not None, "api-unreachable reported")
            problems = (await n.introspect("Plan"))["problems"]
            (down,) = [p for p in problems if p["kind"] == "api-unreachable"]
            assert down["pod"] is None and server.url in down["message"]

            server.put_pod("lsr", labels=LSR, annotations=alloc("4-5"))  # re-bound meanwhile
            server.start()
            await eventually(
                lambda: (n.cpuset(lsr["main"]), n.cpuset(ls["main"])) == ("4-5", "0-3,6-15"),
                "caught up with the API",
            )
            assert api.problem is None
            assert "api-unreachable" not in await problem_kinds(n)

            server.stop()  # down again: the last API view stays, the problem comes back
            await eventually(lambda: api.problem is not None, "api-unreachable again")
            await n.settle()
            assert n.cpuset(lsr["main"]) == "4-5"

    run(main())


def test_a_bad_annotation_from_the_api_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    async def main() -> None:
        async with lsr_pod_on_2_3(tmp_path) as (server, n, api, lsr):
            server.annotate("uid-lsr", {ALLOC: '{"cpuset": '})
            await eventually(lambda: n.cpuset(lsr["main"]) == "0-15", "the LS rule for a bad annotation")
            problems = (await n.introspect("Plan"))["problems"]
            assert {(p["pod"], p["kind"]) for p in problems} >= {
                ("default/lsr", "bad-annotation"),
                ("default/lsr", "missing-cpuset"),
            }
            server.annotate("uid-lsr", alloc("4-5"))  # the watcher is still there
            await eventually(lambda: n.cpuset(lsr["main"]) == "4-5", "the fixed annotation applied")
            assert api.problem is None

    run(main())


def test_a_node_name_that_is_not_the_kubelets_is_a_problem_not_a_quiet_watch(tmp_path: Path) -> None:
    """`[kubernetes] node_name` (or the host name) that is not the kubelet's node name (its
    --hostname-override, a cloud's node name): the API binds none of the runtime's pods to it, and
    the watch followed nothing while looking healthy. Now `api-wrong-node`, after each list and
    each watch's normal end (pods started since the list), gone once the API binds one of them."""

    def running(uid: str) -> PodRecord:
        return PodRecord(f"s-{uid}", uid, uid, "default", f"/kubepods/pod{uid}", LSR, alloc("2-3"))

    recovered = [False]

    async def follow(state: NodeState, server: KubeApiServer, node: str) -> KubeApiWatcher:
        kubeconfig = server.kubeconfig(tmp_path / f"kubeconfig-{node}")
        api = KubeApiWatcher(
            state, node, str(kubeconfig), backoff=0.01, watch_seconds=1, pods_current=lambda: recovered[0]
        )
        tasks.append(asyncio.ensure_future(api.run()))
        await eventually(lambda: api.lists >= 1, f"{node} listed")
        return api

    tasks: list[asyncio.Future[None]] = []

    async def main() -> None:
        with KubeApiServer(node="node-1.example.internal") as server:
            server.put_pod("lsr", "uid-lsr", LSR, alloc("2-3"))
            state = NodeState()
            state.put_pod(running("uid-lsr"))
            try:
                wrong = await follow(state, server, "node-1")  # the host name; the kubelet's is longer
                assert wrong.problem is None  # the pods may be a stale checkpoint's: not yet
                recovered[0] = True  # the runtime's pods now: said at the watch's end
                await eventually(lambda: wrong.problem is not None, "api-wrong-node")
                assert wrong.problem is not None and str(wrong.problem.kind) == "api-wrong-node"
                assert "node_name" in wrong.problem.message and "node-1 " in wrong.problem.message
                static = replace(running("uid-etcd"), annotations={"kubernetes.io/config.source": "file"})
                fresh = NodeState()  # a fresh control-plane node: its static pods alone so far
                fresh.put_pod(static)  # whose mirror pods in the API have uids of their own
                right = await follow(fresh, server, server.node)
                assert right.problem is None
                right.state.put_pod(running("uid-late"))  # started after the list, not in the API
                await eventually(lambda: right.problem is not None, "said at the watch's end")
                server.put_pod("late", "uid-late", LSR, alloc("4-5"))
                await eventually(lambda: right.problem is None, "gone once the API binds it")
            finally:
                for task in tasks:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    run(main())


def test_no_usable_kubeconfig_is_reported_and_retried_and_stopping_is_prompt(tmp_path: Path) -> None:
    async def main() -> None:
        changes: list[int] = []
        api = KubeApiWatcher(
            NodeState(), "", str(tmp_path / "missing"), on_change=lambda: changes.append(1), backoff=0.01
        )
        assert api.node_name  # the host name by default
        task = asyncio.ensure_future(api.run())
        await eventually(lambda: api.problem is not None, "api-unreachable reported")
        assert api.problem is not None and str(api.problem.kind) == "api-unreachable"
        assert "(no config)" in api.problem.message and changes
        began = time.monotonic()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert time.monotonic() - began < 1.0

    run(main())


def test_a_kubeconfig_that_is_a_fifo_is_reported_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "kubeconfig"
    os.mkfifo(fifo)

    async def main() -> None:
        api = KubeApiWatcher(NodeState(), "n1", str(fifo), backoff=0.01)
        task = asyncio.ensure_future(api.run())
        await eventually(lambda: api.problem is not None, "api-unreachable reported")
        assert api.problem is not None and f"{fifo} is a FIFO, not a regular file" in api.problem.message
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    run(main())


def test_a_rotated_token_file_is_read_again_and_the_watch_goes_on(tmp_path: Path) -> None:
    """A kubeconfig whose user names a `tokenFile` (a bound service-account token that some agent
    renews, as client-go reads again every minute): the token in force when the proxy started
    expires; the watch must go on with the renewed one, without a restart."""

    async def main() -> None:
        token = tmp_path / "token"
        token.write_text("first")
        with KubeApiServer() as server:
            server.tokens = {"first"}
            server.put_pod("lsr", labels=LSR, annotations=alloc("2-3"))
            async with api_node(tmp_path, server, token) as n:
                api = await synced(n)
                _, lsr = await n.run_pod("lsr", "guaranteed", LSR, alloc("2-3"))

                token.write_text("second")  # renewed; the old one expires and the watch ends
                server.tokens = {"second"}
                server.drop_watches()
                server.annotate("uid-lsr", alloc("4-5"))
                await eventually(lambda: n.cpuset(lsr["main"]) == "4-5", "followed with the new token")
                assert server.watch_requests()[-1].authorization == "Bearer second"
                await eventually(lambda: api.problem is None, "no problem left")

    run(main())


def test_a_kubeconfig_edited_to_another_server_is_followed(tmp_path: Path) -> None:
    """The API server moved (a new address written into the kubeconfig): the next try reads the
    kubeconfig again instead of knocking at the old address for good."""

    async def main() -> None:
        with KubeApiServer() as old, KubeApiServer(node=old.node) as new:
            old.put_pod("lsr", labels=LSR, annotations=alloc("2-3"))
            new.put_pod("lsr", labels=LSR, annotations=alloc("6-7"))
            async with api_node(tmp_path, old) as n:
                api = await synced(n)
                _, lsr = await n.run_pod("lsr", "guaranteed", LSR, alloc("2-3"))
                new.kubeconfig(tmp_path / "kubeconfig")
                old.stop()
                await eventually(lambda: n.cpuset(lsr["main"]) == "6-7", "the new server's allocation")
                await eventually(lambda: api.problem is None, "no problem left")
                assert new.list_requests()

    run(main())


Op = tuple[str, int, str]
OPS: st.SearchStrategy[Op] = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 3), st.sampled_from(["2-3", "4-5", "10-11"])),
    st.tuples(st.sampled_from(["delete", "lost-delete"]), st.integers(0, 3), st.just("")),
    st.tuples(st.just("lost"), st.integers(0, 3), st.sampled_from(["6-7", "8-9"])),
    st.tuples(st.just("elsewhere"), st.integers(0, 3), st.just("")),
    st.tuples(
        st.sampled_from(["drop", "bookmark", "gone-http", "restart", "rotate"]), st.just(0), st.just("")
    ),
)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    phases=[
        Phase.explicit,
        Phase.reuse,
        Phase.generate,
    ],  # a failing example waits out its 10 s: no shrinking
)
@given(ops=st.lists(st.tuples(OPS, st.sampled_from([0.0, 0.01, 0.05])), max_size=10))
def test_whatever_the_api_does_the_views_end_as_the_api_has_the_pods(
    tmp_path: Path, ops: list[tuple[Op, float]]
) -> None:
    """The watcher as a state machine, against the test API server: random interleavings of pods
    added, changed and deleted, changes and deletions lost to compaction (only a re-list sees
    them), watches cut,
    bookmarks, 410 Gone answers, the server down and back, the token renewed. Once the API is
    quiet, the node state's API views are this node's pods, each at its latest resourceVersion,
    with no problem left."""
    run_dir = tmp_path / f"run-{time.monotonic_ns()}"
    run_dir.mkdir()
    token = run_dir / "token"
    token.write_text("t0")

    async def main() -> None:
        with KubeApiServer() as server:
            server.tokens = {"t0"}
            kubeconfig = server.kubeconfig(run_dir / "kubeconfig", token_file=token)
            state = NodeState()
            api = KubeApiWatcher(state, server.node, str(kubeconfig), backoff=0.01, backoff_max=0.2)
            task = asyncio.ensure_future(api.run())
            try:
                for n, ((op, i, cpus), pause) in enumerate(ops):
                    uid = f"uid-p{i}"
                    here = server.pods_on(server.node)
                    if op == "put":
                        server.put_pod(f"p{i}", uid, LSR, alloc(cpus))
                    elif op == "delete" and uid in here:
                        server.delete_pod(uid)
                    elif op == "lost-delete" and uid in here:
                        server.delete_pod(uid, emit=False)
                        server.expire()
                    elif op == "lost" and uid in here:
                        server.annotate(uid, alloc(cpus), emit=False)
                        server.expire()
                    elif op == "elsewhere":
                        server.put_pod(f"q{i}", f"uid-q{i}-{n}", LS, node="node-2")
                    elif op in ("drop", "bookmark", "gone-http"):
                        server.fault(op)
                    elif op == "restart":
                        server.stop()
                        await asyncio.sleep(pause)
                        server.start()
                    elif op == "rotate":
                        token.write_text(f"t{n + 1}")
                        server.tokens = {f"t{n + 1}"}
                    await asyncio.sleep(pause)

                def settled() -> bool:
                    views = {uid: v.resource_version for uid, v in state.api_views().items()}
                    return views == server.pods_on(server.node) and api.problem is None

                await eventually(settled, "the API views as the API has the pods", timeout=10)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    run(main())


# -- the precedence rule ----------------------------------------------------------------------------
def _pod(sandbox: str, cpus: str, qos: str = "LSR") -> PodRecord:
    return PodRecord(sandbox, "uid-a", "a", "default", "/kubepods/poduid-a", {QOS_LABEL: qos}, alloc(cpus))


def _effective(state: NodeState) -> tuple[str, str]:
    (info,) = state.pod_infos()
    return info.labels[QOS_LABEL], json.loads(info.annotations[ALLOC])["cpuset"]


def test_the_api_view_wins_once_it_is_newer_than_the_sandbox() -> None:
    state = NodeState()
    state.put_pod(_pod("s1", "2-3"))
    assert state.set_api_view("uid-a", {QOS_LABEL: "LSR", "other": "x"}, alloc("2-3"), "5")
    assert _effective(state) == ("LSR", "2-3") and state.api_sourced() == {}
    generation = state.generation
    assert not state.set_api_view("uid-a", {QOS_LABEL: "LSR"}, alloc("2-3"), "6")  # only the rv moved
    assert state.generation == generation and state.api_views()["uid-a"].resource_version == "6"
    assert set(state.api_views()["uid-a"].labels) == {QOS_LABEL}  # only the API keys are kept

    assert state.set_api_view("uid-a", {QOS_LABEL: "LSE"}, alloc("4-5"), "7")  # a re-bind
    assert _effective(state) == ("LSE", "4-5")
    assert state.api_sourced() == {"default/a": "QoS label and allocation"}

    # the sandbox is recreated after that: kubelet put the newer values in CRI, CRI wins for it
    state.remove_pod("s1")
    state.put_pod(_pod("s2", "6-7", "LSR"))
    assert _effective(state) == ("LSR", "6-7")
    assert state.set_api_view("uid-a", {QOS_LABEL: "LSR"}, alloc("8-9"), "8")  # newer again
    assert _effective(state) == ("LSR", "8-9")
    assert state.forget_api_view("uid-a") and not state.forget_api_view("uid-a")
    assert _effective(state) == ("LSR", "6-7")


def test_sandboxes_from_recovery_predate_every_api_view() -> None:
    state = NodeState()
    state.set_api_view("uid-a", {QOS_LABEL: "LSR"}, alloc("4-5"), "9")
    state.replace_all([_pod("s1", "2-3")], [])  # learnt from the runtime: created before we ran
    assert _effective(state) == ("LSR", "4-5")
    state.replace_all([_pod("s1", "2-3")], [])  # recovering again keeps it so
    assert _effective(state) == ("LSR", "4-5")


# -- config ---------------------------------------------------------------------------------------
def test_the_kubernetes_table(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[kubernetes]\nenabled = true\nnode_name = "n1"\nkubeconfig = "/etc/kubeconfig"\n')
    config = config_mod.load(path)
    assert (config.kubernetes_enabled, config.kubernetes_node_name, config.kubernetes_kubeconfig) == (
        True,
        "n1",
        "/etc/kubeconfig",
    )
    assert config_mod.Config().kubernetes_enabled is False
    for text, message in (
        ("[kubernetes]\nenable = true\n", "unknown key 'kubernetes.enable'"),
        ("[kubernetes]\nenabled = 1\n", "kubernetes.enabled: expected bool"),
        ("kubernetes_enabled = true\n", "unknown key 'kubernetes_enabled'"),
        ("kubernetes = true\n", "kubernetes: expected a table"),
    ):
        path.write_text(text)
        with pytest.raises(ConfigError, match=message):
            config_mod.load(path)
