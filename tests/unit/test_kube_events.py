"""Problems as Kubernetes Events: the correlator (dedup, count, token bucket) and, end to end, the
proxy posting to a real HTTP fake API server (tests/unit/kube_api_server.py) with the real client."""

from __future__ import annotations

import asyncio
import select
import socket
import time
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cri_proxy.sources.kube_events import (
    Correlator,
    Create,
    Occurrence,
    Patch,
    Target,
    client_sender,
    occurrences,
    reason,
)
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


def test_a_clock_stepped_back_does_not_empty_the_bucket() -> None:
    """The correlator runs on the wall clock (its stamps must): an NTP step back of an hour used
    to leave the bucket an hour's refill in debt, so the problem's next post was dropped."""
    c = Correlator(host="node-1", burst=3, rate=1 / 300)
    assert len(c.observe([FULL], 10_000.0)) == 1
    assert c.observe([], 10_001.0) == []
    assert len(c.observe([FULL], 10_002.0 - 3600)) == 1  # back, on a clock an hour behind
    assert c.dropped == 0


def test_what_is_remembered_is_bounded_over_a_node_lifetime() -> None:
    """Ten simulated days of pods that each have a problem for a minute, one every 30 s: the
    correlator remembers the Events of the last hour (the API server's default event TTL: a PATCH
    after it finds nothing) and the buckets not yet full again, not every pod it ever saw."""
    c = Correlator(host="node-1")
    most = 0
    for n in range(10 * 24 * 120):
        now = 1_000_000.0 + n * 30
        pod = Target("Pod", "default", f"job-{n}", f"uid-{n}")
        before = Target("Pod", "default", f"job-{n - 1}", f"uid-{n - 1}")
        present = [Occurrence(pod, "PoolExhausted", f"pool empty at {n}")]
        present.append(Occurrence(before, "PoolExhausted", f"pool empty at {n - 1}"))
        c.observe(present, now)
        most = max(most, len(c.posted), len(c.buckets))
    assert most <= 3600 // 30 + 3  # an hour of them, not 28,800
    assert c.dropped == 0


def test_at_most_kept_at_most_events_are_remembered() -> None:
    """Past `kept_at_most` (client-go keeps 4,096) the oldest posts go; one still present is not
    posted again while it lasts."""
    c = Correlator(host="node-1", kept_at_most=10)
    many = [Occurrence(Target("Pod", "default", f"p{n}", ""), "PoolExhausted", "m") for n in range(25)]
    assert len(c.observe(many, 1000.0)) == 25
    assert len(c.posted) == 10
    assert c.observe(many, 1001.0) == []  # all still present: nothing new


class Lifetimes(RuleBasedStateMachine):
    """Problems appearing and going on a few pods, time moving on (and the clock stepping back
    now and then): what the correlator remembers stays within its bounds after every pass, a
    problem that stays is never posted twice, and one that comes back within `forget_after` of its
    last post patches the same Event."""

    def __init__(self) -> None:
        super().__init__()
        self.c = Correlator(host="node-1", burst=3, rate=1 / 60, forget_after=600, kept_at_most=6)
        self.now = 1_000_000.0
        self.last: set[Occurrence] = set()
        self.names: dict[Occurrence, tuple[str, float]] = {}  # what each was posted as, and when

    @rule(
        present=st.sets(st.tuples(st.integers(0, 5), st.integers(0, 2)), max_size=8),
        step=st.sampled_from([1.0, 30.0, 300.0, 900.0, -3600.0]),
    )
    def observe(self, present: set[tuple[int, int]], step: float) -> None:
        self.now += step
        occ = {Occurrence(Target("Pod", "ns", f"p{p}", ""), "PoolExhausted", f"m{m}") for p, m in present}
        actions = self.c.observe(occ, self.now)
        for o, action in actions:
            assert o not in self.last  # present before too: never posted again while it lasts
            name = action.name if isinstance(action, Patch) else action.body["metadata"]["name"]
            if isinstance(action, Patch):
                posted_as, at = self.names[o]
                assert name == posted_as and self.now - at <= 600 + 3600  # (a step back may lengthen it)
            self.names[o] = (name, self.now)
        self.last = occ & (self.c.active)

    @invariant()
    def bounded(self) -> None:
        c = self.c
        assert len(c.posted) <= c.kept_at_most
        assert all(o in c.active or seen.at >= self.now - 600 for o, seen in c.posted.items())
        busy = {o.target for o in c.active}
        assert all(t in busy or b.level(self.now) < b.burst for t, b in c.buckets.items())


Lifetimes.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestLifetimes = Lifetimes.TestCase


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


def test_an_api_server_that_answers_no_post_does_not_hold_the_stop() -> None:
    """The API server takes the Event's request and answers nothing (a hung apiserver, a load
    balancer that black-holes it): the post waits out the client's time-out in a thread. The
    stop (the event loop's end) must not wait with it. Posted from the loop's default executor,
    the loop's shutdown waited for that thread: here the whole 30 s time-out."""
    from kubernetes import client

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        configuration = client.Configuration()
        configuration.host = f"http://127.0.0.1:{silent.getsockname()[1]}"
        configuration.retries = 1
        api = client.ApiClient(configuration)
        send = client_sender(lambda: api, timeout=30.0)
        taken: list[socket.socket] = []

        async def main() -> None:
            ((_, event),) = Correlator(host="node-1").observe([FULL], 1000.0)
            posting = asyncio.ensure_future(send(event))
            ready, _, _ = await asyncio.to_thread(select.select, [silent], [], [], 10)
            assert ready, "the post never reached the server"
            taken.append(silent.accept()[0])  # taken, never answered
            posting.cancel()  # the proxy stops

        began = time.monotonic()
        try:
            asyncio.run(main())
            stopped = time.monotonic() - began
        finally:
            for conn in taken:
                conn.close()
    assert stopped < 10, f"the stop waited {stopped:.1f} s for the post"
