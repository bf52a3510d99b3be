"""The proxy's views, pure: the state's records, the plan and what the runtime has now (`Seen`)
in; rows out. Every container the runtime lists appears, with the decided set, the set it really
has and a mark where they differ; every CPU with its pool, its holders and its conflicts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cri_proxy.cpu import CPUSet, Plan, ProblemKind, QoS
from cri_proxy.enforce.observe import Seen
from cri_proxy.state.model import ContainerRecord, PodRecord

DRIFT = "DRIFT"  # the container really has another set than the decided one
DRY_RUN = "DRY-RUN"  # it differs, and dry-run is why
GONE = "GONE"  # the proxy tracks it, the runtime does not list it
UNTRACKED = "UNTRACKED"  # the runtime lists it, the proxy does not track it (no decision)
LIVE = frozenset({"created", "running", "pending"})
EXCLUSIVE = frozenset({QoS.LSE, QoS.LSR, QoS.KUBELET})


@dataclass(frozen=True)
class Inputs:
    pods: list[PodRecord]
    containers: list[ContainerRecord]
    plan: Plan
    seen: Mapping[str, Seen] | None  # None: the runtime could not be listed
    dry_run: bool
    online: CPUSet
    reserved: CPUSet


def _mark(decided: str | None, actual: str | None, state: str, i: Inputs) -> str:
    if state not in LIVE or decided is None or actual is None:
        return ""
    everywhere = str(i.online)  # "" is no cpuset set: every online CPU, as the reconciler takes it
    if (actual or everywhere) == (decided or everywhere):
        return ""
    return DRY_RUN if i.dry_run else DRIFT


def container_rows(i: Inputs) -> list[dict[str, Any]]:
    """One row per container the runtime lists or the proxy tracks."""
    pods = {p.sandbox_id: p for p in i.pods}
    rows = []
    tracked = {c.id: c for c in i.containers}
    for c in i.containers:
        pod = pods.get(c.sandbox_id)
        d = i.plan.containers.get(c.id)
        seen = i.seen.get(c.id) if i.seen is not None else None
        state = seen.state if seen is not None else str(c.state)
        decided = str(d.cpuset) if d is not None and d.cpuset is not None else None
        actual = seen.actual if seen is not None else None
        mark = _mark(decided, actual, state, i)
        if i.seen is not None and seen is None and c.state.value != "pending":
            mark = GONE
        rows.append(
            {
                "pod": pod.key if pod else None,
                "container": c.name,
                "id": c.id,
                "state": state,
                "qos": str(d.qos) if d is not None and d.qos is not None else None,
                "decided": decided,
                "applied": c.applied,
                "actual": actual,
                "actual_source": seen.source if seen is not None and actual is not None else None,
                "mark": mark,
                "why": d.why if d is not None else "sandbox not ready",
                "pinned": c.pin,
                "dry_run": i.dry_run,
            }
        )
    for s in (i.seen or {}).values():
        if s.id in tracked:
            continue
        pod = pods.get(s.sandbox_id)
        rows.append(
            {
                "pod": pod.key if pod is not None else s.pod,
                "container": s.name,
                "id": s.id,
                "state": s.state,
                "qos": None,
                "decided": None,
                "applied": None,
                "actual": s.actual,
                "actual_source": s.source or None,
                "mark": UNTRACKED,
                "why": "not tracked by the proxy (created behind its back, or not recovered yet)",
                "pinned": None,
                "dry_run": i.dry_run,
            }
        )
    rows.sort(key=lambda r: (r["pod"] or "", r["container"], r["id"]))
    return rows


def _label(row: Mapping[str, Any]) -> str:
    return f"{row['pod'] or '?'} {row['container']}"


def _on(row: Mapping[str, Any], online: CPUSet) -> CPUSet:
    """The CPUs a container is on: what it really has, else what the proxy last applied; no
    cpuset set ("") is every online CPU."""
    if row["state"] not in LIVE:
        return CPUSet()
    text = row["actual"] if row["actual"] is not None else row["applied"]
    if text is None:
        return CPUSet()
    if not text:
        return online
    try:
        return CPUSet.parse(text)
    except ValueError:
        return CPUSet()


@dataclass(frozen=True)
class Claim:
    holder: str  # "LSE default/x" or "KUBELET default/p main"
    pod: str
    container: str | None  # only kubelet's static CPUs belong to one container
    qos: QoS
    cpus: CPUSet


def claims(i: Inputs) -> list[Claim]:
    """The exclusive claims the decision makes: LSE/LSR pods, kubelet's static containers."""
    names = {c.id: c.name for c in i.containers}
    found: dict[tuple[str, str | None], Claim] = {}
    for cid, d in i.plan.containers.items():
        if d.qos not in EXCLUSIVE or d.cpuset is None or not d.cpuset:
            continue
        container = names.get(cid, cid[:13]) if d.qos is QoS.KUBELET else None
        holder = f"{d.qos} {d.pod}" + (f" {container}" if container else "")
        found.setdefault((d.pod, container), Claim(holder, d.pod, container, d.qos, d.cpuset))
    return sorted(found.values(), key=lambda c: c.holder)


def _intrudes(row: Mapping[str, Any], claim: Claim) -> bool:
    """Is this container on the claim's CPUs without being its holder (BE may share LSR CPUs)?"""
    if row["pod"] == claim.pod and (claim.container is None or row["container"] == claim.container):
        return False
    return not (claim.qos is QoS.LSR and row["qos"] == str(QoS.BE))


def pools_of(cpu: int, i: Inputs) -> list[str]:
    p = i.plan.pools
    out = []
    for name, cpus in (
        ("reserved", i.reserved),
        ("LSE", p.lse),
        ("LSR", p.lsr),
        ("kubelet", p.kubelet),
        ("LS", p.ls),
        ("BE", p.be),
    ):
        if cpu in cpus:
            out.append(name)
    return out


def cpu_rows(i: Inputs, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per online (or reserved) CPU: pools, exclusive holders, containers on it, conflicts."""
    all_claims = claims(i)
    on = [(r, _on(r, i.online)) for r in rows]
    out = []
    for cpu in i.online | i.reserved:
        holders = [c for c in all_claims if cpu in c.cpus]
        here = [r for r, cpus in on if cpu in cpus]
        conflicts = []
        if len(holders) > 1:
            conflicts.append("claimed by " + ", ".join(c.holder for c in holders))
        for claim in holders:
            for r in here:
                if _intrudes(r, claim):
                    conflicts.append(f"{_label(r)} is on {claim.holder}'s CPU")
        if cpu not in i.online:
            conflicts.append("not online")
        out.append(
            {
                "cpu": cpu,
                "pools": pools_of(cpu, i),
                "holders": [c.holder for c in holders],
                "containers": [_label(r) for r in here],
                "conflicts": conflicts,
            }
        )
    return out


def exclusivity_problems(i: Inputs, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`exclusive-overlap`, read live: an exclusive holder's CPUs that other containers really are on
    (the same kind the policy reports from its last readings; this one names each container)."""
    out = []
    for claim in claims(i):
        others = []
        overlap = CPUSet()
        for r in rows:
            shared = _on(r, i.online) & claim.cpus
            if shared and _intrudes(r, claim):
                others.append(f"{_label(r)} ({shared})")
                overlap |= shared
        if others:
            out.append(
                {
                    "pod": claim.pod,
                    "kind": str(ProblemKind.EXCLUSIVE_OVERLAP),
                    "message": f"CPUs {overlap} of {claim.holder} ({claim.cpus}) are also used by "
                    + ", ".join(others[:6])
                    + (f" and {len(others) - 6} more" if len(others) > 6 else ""),
                    "cpus": str(overlap),
                    "others": others,
                }
            )
    return out


def problem_rows(i: Inputs, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The decision's problems (pool-exhausted ones name the containers really on exclusive CPUs),
    then exclusivity not held and drift, from what the runtime has."""
    exclusive = CPUSet()
    for claim in claims(i):
        exclusive |= claim.cpus
    by_pod: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_pod.setdefault(r["pod"] or "", []).append(r)
    live = exclusivity_problems(i, rows)
    seen_live = {p["pod"] for p in live}
    out: list[dict[str, Any]] = []
    for p in i.plan.problems:
        if p.kind is ProblemKind.EXCLUSIVE_OVERLAP and p.pod in seen_live:
            continue  # the live reading below says it, naming each container
        item: dict[str, Any] = {"pod": p.pod, "kind": str(p.kind), "message": p.message}
        if p.holders:
            item["holders"] = list(p.holders)
        if str(p.kind) == "pool-exhausted":
            overlapping = [
                f"{_label(r)} ({_on(r, i.online) & exclusive})"
                for r in by_pod.get(p.pod or "", ())
                if _on(r, i.online) & exclusive
            ]
            if overlapping:
                item["overlapping"] = overlapping
                item["message"] += "; left on exclusive CPUs: " + ", ".join(overlapping)
        out.append(item)
    out.extend(live)
    for r in rows:
        if r["mark"] in (DRIFT, DRY_RUN):
            out.append(
                {
                    "pod": r["pod"],
                    "kind": "cpuset-drift" if r["mark"] == DRIFT else "dry-run",
                    "message": f"container {r['container']}: has cpuset {r['actual']}, decided {r['decided']}"
                    + (" (dry-run: not applied)" if r["mark"] == DRY_RUN else ""),
                }
            )
    return out


def pool_rows(i: Inputs, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each pool's CPUs and the containers decided onto it (every container lands in one)."""
    p = i.plan.pools
    pools: dict[str, tuple[CPUSet | None, list[dict[str, Any]]]] = {
        "reserved": (i.reserved, []),
        "LSE": (p.lse, []),
        "LSR": (p.lsr, []),
        "kubelet": (p.kubelet, []),
        "LS": (p.ls, []),
        "BE": (p.be, []),
        "SYSTEM": (None, []),
        "unmanaged": (None, []),
    }
    for r in rows:
        qos = r["qos"]
        name = {"KUBELET": "kubelet"}.get(qos, qos) if qos else "unmanaged"
        pools.setdefault(name, (None, []))[1].append(
            {k: r[k] for k in ("pod", "container", "id", "state", "decided", "actual", "mark")}
        )
    return [
        {
            "pool": name,
            "cpus": None if cpus is None else str(cpus),
            "containers": members,
            "dry_run": i.dry_run,
        }
        for name, (cpus, members) in pools.items()
    ]


def counts(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        if r["mark"]:
            out[r["mark"].lower()] = out.get(r["mark"].lower(), 0) + 1
    return out
