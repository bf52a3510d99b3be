"""Reconcile, never replace: merge what the runtime lists into what the proxy knows. Pure.

A listing is a picture of the runtime taken at one moment; CRI events keep arriving while it is
taken. Every change to the state stamps the records it touched (removals too) with the state's
generation, and a listing remembers the generation when it began (`Listing.started`). Then, per
pod sandbox and per container id:

- touched after the listing began: the event is newer than the picture, what we know stays
  (present or absent), so a container created or removed while the runtime is listed is never
  lost nor brought back;
- known and listed: refreshed (the runtime's state; what the listing does not say is kept);
- known, not listed: dropped;
- listed, unknown: adopted (a container with its pod: containers of a sandbox not kept go too);
- PENDING (a CreateContainer without its answer yet): resolved into the listed container of the
  same sandbox, name and attempt when there is one; else kept while this process still has the
  call open (`Known.in_flight`), and dropped otherwise (a checkpoint from a proxy killed mid-create).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from cri_proxy.state.records import ContainerRecord, ContainerState, PodRecord


@dataclass(frozen=True)
class Listing:
    """The runtime's sandboxes and containers (exited ones included), by id.

    A listed record leaves `cgroup_parent` empty, `resources` empty or `applied` None where the
    runtime was not asked (a cheap periodic listing): the merge keeps what it knew for those.
    """

    pods: Mapping[str, PodRecord]
    containers: Mapping[str, ContainerRecord]
    started: int  # the state's generation when the listing began


@dataclass(frozen=True)
class Known:
    """What the proxy knows, and when each record last changed (generation, removals included)."""

    pods: Mapping[str, PodRecord]
    containers: Mapping[str, ContainerRecord]
    touched: Mapping[str, int] = field(default_factory=dict)
    in_flight: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Merged:
    """The merged state and what the merge did, for the log."""

    pods: dict[str, PodRecord]
    containers: dict[str, ContainerRecord]
    adopted_pods: list[str] = field(default_factory=list)
    dropped_pods: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    exited: list[str] = field(default_factory=list)  # known live, now listed exited
    resolved: dict[str, str | None] = field(default_factory=dict)  # pending id -> container id / None
    changed: bool = False


def _refresh_pod(old: PodRecord, new: PodRecord) -> PodRecord:
    return replace(
        new,
        cgroup_parent=new.cgroup_parent or old.cgroup_parent,
        api_version=old.api_version,
    )


def _refresh_container(old: ContainerRecord, new: ContainerRecord) -> ContainerRecord:
    return replace(
        old,
        sandbox_id=new.sandbox_id,
        name=new.name,
        attempt=new.attempt,
        state=new.state,
        resources=new.resources or old.resources,
        applied=new.applied if new.applied is not None else old.applied,
    )


def _slot(c: ContainerRecord) -> tuple[str, str, int]:
    return c.sandbox_id, c.name, c.attempt


def merge(known: Known, listing: Listing) -> Merged:
    """The state after merging `listing` into `known` (see the module docstring)."""

    def newer(record_id: str) -> bool:
        return known.touched.get(record_id, -1) > listing.started

    out = Merged(pods={}, containers={})
    for sid in known.pods.keys() | listing.pods.keys():
        old, new = known.pods.get(sid), listing.pods.get(sid)
        if newer(sid):
            if old is not None:
                out.pods[sid] = old
        elif new is None:
            out.dropped_pods.append(sid)
        elif old is None:
            out.pods[sid] = new
            out.adopted_pods.append(sid)
        else:
            out.pods[sid] = _refresh_pod(old, new)

    listed_slots = {_slot(c): c.id for c in listing.containers.values()}
    for cid in known.containers.keys() | listing.containers.keys():
        old_c, new_c = known.containers.get(cid), listing.containers.get(cid)
        if newer(cid):
            if old_c is not None:
                out.containers[cid] = old_c
        elif old_c is not None and old_c.state is ContainerState.PENDING:
            found = listed_slots.get(_slot(old_c))
            if found is not None:
                out.resolved[cid] = found
            elif cid in known.in_flight:
                out.containers[cid] = old_c
            else:
                out.resolved[cid] = None
        elif new_c is None:
            out.dropped.append(cid)
        elif old_c is None:
            out.containers[cid] = new_c
            out.adopted.append(cid)
        else:
            out.containers[cid] = _refresh_container(old_c, new_c)
            if new_c.state is ContainerState.EXITED and old_c.state is not ContainerState.EXITED:
                out.exited.append(cid)

    # a resolved pending lends what the listing may lack (its resources, its API version)
    for pid, into in out.resolved.items():
        adopted = out.containers.get(into) if into is not None else None
        pending = known.containers[pid]
        if adopted is not None and into is not None and into not in known.containers:
            out.containers[into] = replace(
                adopted, resources=adopted.resources or pending.resources, api_version=pending.api_version
            )

    for cid, c in list(out.containers.items()):
        if c.sandbox_id in out.pods or newer(cid):
            continue  # an event newer than the listing put it there: it stays
        del out.containers[cid]
        if cid in out.adopted:
            out.adopted.remove(cid)
        else:
            out.dropped.append(cid)

    for names in (out.adopted_pods, out.dropped_pods, out.adopted, out.dropped, out.exited):
        names.sort()
    changed = out.pods != dict(known.pods) or out.containers != dict(known.containers)
    return replace(out, changed=changed)
