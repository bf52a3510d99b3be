"""The views, checked against an oracle of CPU sets over random nodes: pods of every QoS with
their allocations, tracked containers in every state, the runtime's listing with sets that are
canonical, empty (none set: every online CPU), unparseable or unknown, and containers it has that
the proxy does not track. The views compare text; the oracle compares the CPUs."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cri_proxy.config import Config
from cri_proxy.cpu import CPUSet, QoS, Topology
from cri_proxy.enforce import views
from cri_proxy.enforce.observe import Seen
from cri_proxy.enforce.policy import Policy
from cri_proxy.state.model import ContainerRecord, ContainerState, NodeState, PodRecord

TOPOLOGY = Topology.build({0: CPUSet.parse("0-3"), 1: CPUSet.parse("4-7")})
ONLINE = TOPOLOGY.online
SETS = st.sampled_from(["", "0-7", "0-1", "2-3", "4-7", "1,5", "x-"])
QOS = st.sampled_from([None, "LSE", "LSR", "LS", "BE"])
POD = st.tuples(QOS, st.sampled_from([None, "0-1", "2-3", "1-2", "6"]), st.booleans())
CONTAINER = st.tuples(
    st.integers(0, 4),  # its pod (of those made)
    st.sampled_from(list(ContainerState)),
    st.one_of(st.none(), SETS),  # applied
    st.one_of(
        st.none(), st.tuples(st.sampled_from(["created", "running", "exited"]), st.one_of(st.none(), SETS))
    ),
)


def cpus(text: str | None) -> CPUSet | str | None:
    """What a set's text means: "" every online CPU; text that does not parse stays text."""
    if text is None:
        return None
    if text == "":
        return ONLINE
    try:
        return CPUSet.parse(text)
    except ValueError:
        return text


def on(row: dict[str, Any]) -> CPUSet:
    if row["state"] not in views.LIVE:
        return CPUSet()
    found = cpus(row["actual"] if row["actual"] is not None else row["applied"])
    return found if isinstance(found, CPUSet) else CPUSet()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(POD, min_size=1, max_size=5),
    st.lists(CONTAINER, max_size=8),
    st.lists(st.tuples(st.sampled_from(["running", "exited"]), SETS), max_size=3),
    st.booleans(),
    st.booleans(),
)
def test_the_views_say_what_the_cpus_are(
    pods: list[tuple[Any, ...]],
    containers: list[tuple[Any, ...]],
    untracked: list[tuple[str, str]],
    dry_run: bool,
    listed: bool,
) -> None:
    state = NodeState()
    for n, (qos, alloc, ready) in enumerate(pods):
        labels = {"koordinator.sh/qosClass": qos} if qos else {}
        annotations = (
            {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": alloc})} if alloc else {}
        )
        parent = "/kubepods/pod" if qos in ("LSE", "LSR") else "/kubepods/burstable/pod"
        state.put_pod(PodRecord(f"s{n}", f"u{n}", f"p{n}", "ns", f"{parent}u{n}", labels, annotations, ready))
    seen: dict[str, Seen] = {}
    for n, (pod, status, applied, listing) in enumerate(containers):
        sandbox = f"s{pod % len(pods)}"
        state.put_container(ContainerRecord(f"c{n}", sandbox, f"k{n}", b"", status, applied))
        if listing is not None:
            seen[f"c{n}"] = Seen(f"c{n}", sandbox, f"k{n}", None, listing[0], listing[1], "status")
    for n, (status, actual) in enumerate(untracked):
        seen[f"x{n}"] = Seen(f"x{n}", "s-other", f"other{n}", "else/q", status, actual, "cgroup")
    config = Config(dry_run=dry_run)
    plan = Policy(state, TOPOLOGY, lambda: config).plan()
    i = views.Inputs(
        state.pods(), state.containers(), plan, seen if listed else None, dry_run, ONLINE, CPUSet()
    )
    rows = views.container_rows(i)

    ids = [r["id"] for r in rows]
    assert sorted(ids) == sorted({c.id for c in state.containers()} | (set(seen) if listed else set()))
    for r in rows:
        tracked = state.container(r["id"])
        if tracked is None:
            assert r["mark"] == views.UNTRACKED
            continue
        s = seen.get(r["id"]) if listed else None
        if listed and s is None and tracked.state is not ContainerState.PENDING:
            assert r["mark"] == views.GONE
            continue
        differs = (
            r["state"] in views.LIVE
            and r["decided"] is not None
            and r["actual"] is not None
            and cpus(r["actual"]) != cpus(r["decided"])
        )
        assert r["mark"] == ((views.DRY_RUN if dry_run else views.DRIFT) if differs else ""), r

    table = {c["cpu"]: c for c in views.cpu_rows(i, rows)}
    assert set(table) == set(ONLINE)
    for r in rows:
        label = f"{r['pod'] or '?'} {r['container']}"
        for cpu in ONLINE:
            assert (label in table[cpu]["containers"]) == any(
                cpu in on(o) for o in rows if f"{o['pod'] or '?'} {o['container']}" == label
            )

    def intruded(claim: views.Claim) -> bool:
        for r in rows:
            holder = r["pod"] == claim.pod and (claim.container is None or r["container"] == claim.container)
            shared_ok = claim.qos is QoS.LSR and r["qos"] == str(QoS.BE)
            if on(r) & claim.cpus and not holder and not shared_ok:
                return True
        return False

    overlapped = {p["pod"] for p in views.exclusivity_problems(i, rows)}
    assert overlapped == {claim.pod for claim in views.claims(i) if intruded(claim)}

    pooled = [m["id"] for p in views.pool_rows(i, rows) for m in p["containers"]]
    assert sorted(pooled) == sorted(ids)
    assert sum(views.counts(rows).values()) == sum(1 for r in rows if r["mark"])
