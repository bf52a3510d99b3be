"""Problems as Kubernetes Events: the correlator (dedup, count, token bucket) and, end to end, the
proxy posting to a real HTTP fake API server (tests/unit/kube_api_server.py) with the real client."""

from __future__ import annotations

from pathlib import Path

from cri_proxy.sources.kube_events import Correlator, Create, Occurrence, Patch, Target, occurrences, reason
from tests.unit.enforce_support import QOS_LABEL, alloc
from tests.unit.kube_api_server import KubeApiServer
from tests.unit.relay_support import run
from tests.unit.test_kube_api import api_node, eventually, synced

POD = Target("Pod", "default", "ls", "uid-ls")
FULL = Occurrence(
    POD, "PoolExhausted", "the LS share pool is empty: its CPUs are held by LSE default/x (0-3)"
)


def test_reasons_are_camel_case() -> None:
    assert reason("pool-exhausted") == "PoolExhausted"
    assert reason("exclusive-overlap") == "ExclusivityBroken"
    assert reason("bad-kubelet-state") == "KubeletStateUnreadable"


def test_a_problem_is_posted_once_while_it_lasts_and_counted_when_it_comes_back() -> None:
    c = Correlator(host="node-1")
    (first,) = c.observe([FULL], 1000.0)
    assert isinstance(first[1], Create) and first[1].body["count"] == 1
    assert first[1].body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "ls",
        "namespace": "default",
        "uid": "uid-ls",
    }
    assert c.observe([FULL], 1001.0) == []  # still there: nothing new
    assert c.observe([], 1002.0) == []  # gone
    (again,) = c.observe([FULL], 1003.0)  # back: the same Event, counted
    assert isinstance(again[1], Patch) and again[1].name == first[1].body["metadata"]["name"]
    assert again[1].body == {"count": 2, "lastTimestamp": "1970-01-01T00:16:43Z"}


def test_the_token_bucket_limits_a_flapping_object() -> None:
    c = Correlator(host="node-1", burst=3, rate=1 / 300)
    sent = 0
    for step in range(20):  # a problem that comes and goes every second
        sent += len(c.observe([FULL] if step % 2 == 0 else [], 1000.0 + step))
    assert sent == 3 and c.dropped == 7
    assert len(c.observe([FULL], 1000.0 + 20 + 300)) == 1  # a token back after 5 minutes


def test_a_node_wide_problem_goes_on_the_node() -> None:
    (o,) = occurrences([{"pod": None, "kind": "bad-kubelet-state", "message": "m"}], {}, "node-1")
    assert o.target == Target("Node", "default", "node-1", "") and o.reason == "KubeletStateUnreadable"
    assert occurrences([{"pod": "a/b", "kind": "cpuset-drift", "message": "m"}], {}, "n") == []


def test_the_proxy_posts_pool_exhausted_and_exclusivity_broken_on_the_pods(tmp_path: Path) -> None:
    async def main() -> None:
        with KubeApiServer() as server:
            server.put_pod("ls")
            server.put_pod("x", labels={QOS_LABEL: "LSE"}, annotations=alloc("0-3"))
            async with api_node(tmp_path, server, numa={0: "0-3"}, reserved_cpus="") as n:
                await synced(n)
                poster = n.proxy.events
                assert poster is not None
                poster.period = 0.05
                poster.kick()
                await n.run_pod("ls", "burstable")
                await n.run_pod("x", "guaranteed", {QOS_LABEL: "LSE"}, alloc("0-3"))

                def reasons() -> dict[tuple[str, str], dict[str, object]]:
                    return {
                        (e["involvedObject"]["name"], e["reason"]): e for e in list(server.events.values())
                    }

                await eventually(
                    lambda: {("ls", "PoolExhausted"), ("x", "ExclusivityBroken")} <= set(reasons()),
                    "the Events on both pods",
                )
                exhausted = reasons()[("ls", "PoolExhausted")]
                assert "LSE default/x (0-3)" in str(exhausted["message"])
                assert "default/ls main" in str(exhausted["message"])
                assert exhausted["involvedObject"]["uid"] == "uid-ls"  # type: ignore[index]
                assert exhausted["type"] == "Warning" and exhausted["count"] == 1
                broken = reasons()[("x", "ExclusivityBroken")]
                assert "CPUs 0-3" in str(broken["message"]) and "default/ls main" in str(broken["message"])
                creates, passes = len(server.event_requests), poster.passes
                await eventually(lambda: poster.passes >= passes + 5, "five more passes")
                assert len(server.event_requests) == creates  # nothing new while the problems last
                assert all(kind == "create" for kind, *_ in server.event_requests)

    run(main())


def test_the_rbac_example_grants_just_pods_read_and_events_create_patch() -> None:
    import yaml

    docs = list(yaml.safe_load_all((Path(__file__).parents[2] / "systemd" / "rbac.yaml").read_text()))
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules == {(("",), ("pods",)): {"get", "list", "watch"}, (("",), ("events",)): {"create", "patch"}}
