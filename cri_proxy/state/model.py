"""The node state: pod sandboxes and containers as the proxy has seen them.

One normalised record per pod and per container, whatever the source (a RunPodSandbox or
CreateContainer request, the runtime's listing after a restart, a checkpoint entry), so the hooks,
the reconciler and recovery all feed the same rules. All mutation happens through `NodeState`'s
methods, under one lock, and bumps `generation` so readers can tell something changed.

Besides CRI, the Kubernetes API may say what a pod's QoS label and allocation annotations are now
(`ApiView`, by pod uid, from `cri_proxy.sources.kube_api`). Only those keys are taken from it, and
only when the API view is newer than the sandbox: an API view whose values changed after the proxy
saw the sandbox created wins; a sandbox created after the API view last changed carries the newer
values itself (kubelet copies them from the same pod), so CRI wins for it. Sandboxes learnt from a
checkpoint or the runtime's listing predate every API event this process saw: the API view wins.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from cri_proxy.cpu import ContainerInfo, PodInfo
from cri_proxy.cpu.keys import ALLOCATION_ANNOTATIONS, QOS_LABEL
from cri_proxy.state.merge import Known, Listing, Merged, merge
from cri_proxy.state.records import (
    ACTUAL_CGROUP,
    ACTUAL_STATUS,
    LIVE_STATES,
    UPDATABLE_STATES,
    ContainerRecord,
    ContainerState,
    PodRecord,
)

__all__ = [
    "ACTUAL_CGROUP",
    "ACTUAL_STATUS",
    "LIVE_STATES",
    "UPDATABLE_STATES",
    "ApiView",
    "ContainerRecord",
    "ContainerState",
    "NodeState",
    "PodRecord",
    "resources_bytes",
]

CHANGE_LOG_MAX = 65536
"""Record ids `NodeState.changes` keeps (a reader further behind reads everything)."""

API_LABELS: tuple[str, ...] = (QOS_LABEL,)
"""The labels taken from the Kubernetes API view; every other label comes from CRI."""

API_ANNOTATIONS: tuple[str, ...] = ALLOCATION_ANNOTATIONS
"""The annotations taken from the Kubernetes API view; every other annotation comes from CRI."""


@dataclass(frozen=True, slots=True)
class ApiView:
    """A pod as the Kubernetes API shows it, reduced to `API_LABELS` and `API_ANNOTATIONS`.

    `seq` is the node state's API sequence number when these values were first seen: it orders
    the view against the sandboxes (see the module docstring).
    """

    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    resource_version: str = ""
    seq: int = 0


def _pick(values: Mapping[str, str], keys: tuple[str, ...]) -> dict[str, str]:
    return {k: values[k] for k in keys if k in values}


def resources_bytes(message: object | None) -> bytes:
    """Any version's LinuxContainerResources (or None) as v1 wire bytes."""
    if message is None:
        return b""
    serialize = getattr(message, "SerializeToString", None)
    if serialize is None:
        raise TypeError(f"not a protobuf message: {type(message).__name__}")
    data: bytes = serialize()
    return data


class NodeState:
    """Pods and containers by id. Every method is atomic; `generation` counts changes."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._pods: dict[str, PodRecord] = {}
        self._containers: dict[str, ContainerRecord] = {}
        self.generation = 0
        self._readings = 0  # of the generation's changes, the readings (`observe_container`)
        self._api: dict[str, ApiView] = {}  # pod uid -> what the Kubernetes API says
        self._api_seq = 0  # bumped when an API view's values change
        self._born: dict[str, int] = {}  # sandbox id -> `_api_seq` when the proxy saw it created
        self._touched: dict[str, int] = {}  # id -> generation of its last change (removal too), while
        self._listings = 0  # ... runtime listings are open (`begin_listing`): none open, none kept
        self._in_flight: dict[str, float] = {}  # PENDING id -> when this process's CreateContainer began
        # the rules' view, kept per pod so that a change costs its own pod, not the node (see pod_infos)
        self._by_pod: dict[str, dict[str, ContainerRecord]] = {}  # sandbox id -> its containers, in order
        self._indexed = True  # False: `_by_pod` must be rebuilt from `_containers`
        self._infos: dict[str, PodInfo] = {}  # sandbox id -> its PodInfo, while nothing of it changed
        self._stale: set[str] = set()  # sandbox ids whose PodInfo must be built again
        self._live: dict[str, dict[str, ContainerInfo]] = {}  # sandbox id -> its live containers, in order
        # the ready pods' PodInfos in `_pods` order (the tuple `pod_infos` hands out), a pod's place
        # in it; None: found again from `_pods` (a pod stopped or went: the places move)
        self._ready_at: dict[str, int] | None = None
        self._ready: list[PodInfo | None] = []
        self._ready_view: tuple[PodInfo, ...] = ()
        self._pod_gen = 0  # counts changes of the pods or the API views (not of containers)
        self._troubled: set[str] = set()  # sandbox ids of the pods with problems
        self._sourced: tuple[int, dict[str, str]] = (-1, {})  # `api_sourced` as of `_pod_gen`
        # the ids each change touched, in order (see `changes`); positions before the gap unknown
        self._log: list[str] = []
        self._log_start = 0  # position of _log[0]
        self._log_gap = 0

    # -- reading ------------------------------------------------------------------------------
    def pod(self, sandbox_id: str) -> PodRecord | None:
        return self._pods.get(sandbox_id)

    def container(self, container_id: str) -> ContainerRecord | None:
        return self._containers.get(container_id)

    def pods(self) -> list[PodRecord]:
        with self._lock:
            return list(self._pods.values())

    def containers(self) -> list[ContainerRecord]:
        with self._lock:
            return list(self._containers.values())

    def snapshot(self) -> tuple[int, list[PodRecord], list[ContainerRecord]]:
        """(generation, pods, containers), all read under one lock (for the checkpoint)."""
        with self._lock:
            return self.generation, list(self._pods.values()), list(self._containers.values())

    def containers_of(self, sandbox_id: str) -> Iterator[ContainerRecord]:
        return (c for c in self.containers() if c.sandbox_id == sandbox_id)

    def pod_infos(self) -> tuple[PodInfo, ...]:
        """The rules' view: ready pods, each with its live containers (pending ones included).

        A pod's PodInfo is built again only when the pod, one of its containers or the API view
        changed, in its place: one CreateContainer (or a new pod) costs its pod, not the node. The
        very same tuple comes back while nothing changed."""
        with self._lock:
            infos = self._infos
            if not self._indexed:
                self._by_pod = {}
                for c in self._containers.values():
                    self._by_pod.setdefault(c.sandbox_id, {})[c.id] = c
                self._indexed = True
                infos.clear()
                self._live.clear()
                self._ready_at = None
            stale, self._stale = self._stale, set()
            for sandbox_id in stale:
                infos.pop(sandbox_id, None)
            at = self._ready_at
            if at is None:
                ready = [p for p in self._pods.values() if p.ready]
                self._ready_at = {p.sandbox_id: i for i, p in enumerate(ready)}
                self._ready = [infos.get(p.sandbox_id) or self._info(p) for p in ready]
            elif stale:
                for sandbox_id in stale:
                    i = at.get(sandbox_id)
                    if i is not None:
                        self._ready[i] = self._info(self._pods[sandbox_id])
            else:
                return self._ready_view
            self._ready_view = tuple(self._ready)  # type: ignore[arg-type]  # every place is filled
            return self._ready_view

    def ready_info(self, sandbox_id: str) -> PodInfo | None:
        """The PodInfo `pod_infos` last handed out for a ready pod, while nothing of the pod changed
        since; None when the pod is not ready, or changed (`pod_infos` builds it again)."""
        with self._lock:
            if not self._indexed or sandbox_id in self._stale:
                return None
            return self._infos.get(sandbox_id)

    def _info(self, p: PodRecord) -> PodInfo:
        info = self._infos[p.sandbox_id] = self._pod_info(p)
        return info

    def _pods_changed(self, moved: bool = True, appended: str | None = None) -> None:
        """Pods changed (caller holds the lock). `moved`: which pods are ready, or in which order,
        may have changed: their places are found again. `appended`: a new ready pod, last in
        `_pods` order, takes the next place (it is stale: `pod_infos` fills it)."""
        self._pod_gen += 1
        if moved:
            self._ready_at = None
        elif appended is not None and self._ready_at is not None:
            self._ready_at[appended] = len(self._ready)
            self._ready.append(None)

    def pod_problems(self) -> list[tuple[str, str]]:
        """(pod key, what) for what could not be read cleanly of each ready pod, sorted."""
        with self._lock:
            found = (self._pods.get(sandbox_id) for sandbox_id in self._troubled)
            return sorted(
                (p.key, message) for p in found if p is not None and p.ready for message in p.problems
            )

    def key_troubled(self, key: str) -> bool:
        """Whether a ready sandbox of pod `key` has a problem (`pod_problems`): asked on each
        CreateContainer's path, where there is usually none to look through."""
        if not self._troubled:
            return False
        return any(k == key for k, _ in self.pod_problems())

    def _pod_info(self, p: PodRecord) -> PodInfo:
        labels, annotations = self._effective(p)
        return PodInfo(
            uid=p.uid,
            name=p.name,
            namespace=p.namespace,
            cgroup_parent=p.cgroup_parent,
            labels=labels,
            annotations=annotations,
            containers=tuple(self._live_of(p.sandbox_id).values()),
        )

    def _live_of(self, sandbox_id: str) -> dict[str, ContainerInfo]:
        """The pod's live containers, in `_containers` order: kept up to date by `_store`/`_drop`."""
        live = self._live.get(sandbox_id)
        if live is None:
            live = self._live[sandbox_id] = {
                c.id: ContainerInfo(c.id, c.name)
                for c in self._by_pod.get(sandbox_id, {}).values()
                if c.state in LIVE_STATES
            }
        return live

    # -- keeping the per-pod view (caller holds the lock) ------------------------------------------
    def _store(self, c: ContainerRecord) -> None:
        """`_containers[c.id] = c`, the per-pod index and view following."""
        old = self._containers.get(c.id)
        self._containers[c.id] = c
        was_live = old is not None and old.state in LIVE_STATES
        is_live = c.state in LIVE_STATES
        if old is None or old.name != c.name or was_live != is_live:
            self._stale.add(c.sandbox_id)  # else its PodInfo (live containers' ids, names) holds
            live = self._live.get(c.sandbox_id)
            if live is not None:
                if not is_live:
                    live.pop(c.id, None)
                elif old is None or was_live:  # new (last in order), or renamed in its place
                    live[c.id] = ContainerInfo(c.id, c.name)
                else:  # live again: its place among the others is found again
                    del self._live[c.sandbox_id]
        if old is not None and old.sandbox_id != c.sandbox_id:
            self._stale.add(old.sandbox_id)
            self._indexed = False  # a container moved pods: its place is rebuilt from `_containers`
            self._live.clear()
        elif self._indexed:
            self._by_pod.setdefault(c.sandbox_id, {})[c.id] = c

    def _drop(self, container_id: str) -> ContainerRecord | None:
        """`_containers.pop(container_id)`, the per-pod index and view following."""
        c = self._containers.pop(container_id, None)
        if c is not None:
            self._stale.add(c.sandbox_id)
            live = self._live.get(c.sandbox_id)
            if live is not None:
                live.pop(container_id, None)
            siblings = self._by_pod.get(c.sandbox_id)
            if siblings is not None:
                siblings.pop(container_id, None)
                if not siblings:
                    del self._by_pod[c.sandbox_id]
        return c

    def _reindex(self) -> None:
        """Pods or containers replaced wholesale: every PodInfo is built again."""
        self._indexed = False
        self._infos.clear()
        self._live.clear()
        self._troubled = {sid for sid, p in self._pods.items() if p.problems}
        self._pods_changed()

    # -- the Kubernetes API view ----------------------------------------------------------------
    def _api_view_for(self, pod: PodRecord) -> ApiView | None:
        """The API view that wins for this sandbox, if any (caller holds the lock)."""
        view = self._api.get(pod.uid)
        if view is None or view.seq <= self._born.get(pod.sandbox_id, 0):
            return None
        return view

    def _effective(self, pod: PodRecord) -> tuple[Mapping[str, str], Mapping[str, str]]:
        view = self._api_view_for(pod)
        if view is None:
            return pod.labels, pod.annotations
        labels = {k: v for k, v in pod.labels.items() if k not in API_LABELS} | dict(view.labels)
        annotations = {k: v for k, v in pod.annotations.items() if k not in API_ANNOTATIONS}
        return labels, annotations | dict(view.annotations)

    def api_sourced(self) -> dict[str, str]:
        """Ready pods (`namespace/name`) whose QoS label or allocation the API view changed: what."""
        with self._lock:
            return dict(self._sourced_now())

    def is_api_sourced(self, key: str) -> bool:
        """Whether pod `key` is one of `api_sourced`, asked without a copy (on a create's path)."""
        if not self._api:  # no API view at all: none is
            return False
        with self._lock:
            return key in self._sourced_now()

    def _sourced_now(self) -> dict[str, str]:
        if self._sourced[0] != self._pod_gen:  # read again only after pods or API views changed
            self._sourced = (self._pod_gen, self._api_sourced())
        return self._sourced[1]

    def _api_sourced(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for p in self._pods.values() if self._api else ():
            view = self._api_view_for(p) if p.ready else None
            if view is None:
                continue
            what = []
            if _pick(p.labels, API_LABELS) != view.labels:
                what.append("QoS label")
            if _pick(p.annotations, API_ANNOTATIONS) != view.annotations:
                what.append("allocation")
            if what:
                out[p.key] = " and ".join(what)
        return out

    def has_api_view(self, uid: str) -> bool:
        return uid in self._api

    def api_views(self) -> dict[str, ApiView]:
        with self._lock:
            return dict(self._api)

    def set_api_view(
        self,
        uid: str,
        labels: Mapping[str, str],
        annotations: Mapping[str, str],
        resource_version: str = "",
    ) -> bool:
        """What the API says of pod `uid` now (only the API keys are kept); True when they changed."""
        view_labels, view_annotations = _pick(labels, API_LABELS), _pick(annotations, API_ANNOTATIONS)
        with self._lock:
            old = self._api.get(uid)
            if old is not None and old.labels == view_labels and old.annotations == view_annotations:
                if old.resource_version != resource_version:
                    self._api[uid] = replace(old, resource_version=resource_version)
                return False
            self._api_seq += 1
            self._api[uid] = ApiView(view_labels, view_annotations, resource_version, self._api_seq)
            self._infos.clear()
            self._pods_changed()
            self._bump()
            return True

    def forget_api_view(self, uid: str) -> bool:
        """The pod is gone from the API (or was never there after a re-list): CRI values again."""
        with self._lock:
            if self._api.pop(uid, None) is None:
                return False
            self._infos.clear()
            self._pods_changed()
            self._bump()
            return True

    # -- changing -----------------------------------------------------------------------------
    def _bump(self, *ids: str) -> None:
        """A change: the generation moves on, and (while a listing is open) the records it touched
        remember when."""
        self.generation += 1
        if self._listings:
            for record_id in ids:
                self._touched[record_id] = self.generation
        if ids:
            self._log.extend(ids)
            if len(self._log) > CHANGE_LOG_MAX:  # bounded: a reader that far behind reads everything
                half = len(self._log) // 2
                del self._log[:half]
                self._log_start += half
        else:
            self._log_gap = self._log_start + len(self._log)

    @property
    def rules_generation(self) -> int:
        """The generation less the readings of what containers really have (`observe_container`):
        a reading moves no decision, so what was decided ahead holds while this stays."""
        return self.generation - self._readings

    @property
    def position(self) -> int:
        """Where the change log is now: `changes(position)` later names what changed since."""
        with self._lock:
            return self._log_start + len(self._log)

    def changes(self, since: int) -> tuple[set[str] | None, int]:
        """(ids of the records changed since position `since`, the position now); None instead of
        the ids when that is not known (a wholesale change, or `since` too old): read everything.
        A reading of what a container really has (`observe_container`) is not a change here."""
        with self._lock:
            end = self._log_start + len(self._log)
            if since < self._log_gap or since < self._log_start or since > end:
                return None, end
            return set(self._log[since - self._log_start :]), end

    def begin_listing(self) -> int:
        """A runtime listing begins: returns its `Listing.started`; end it with `merge_listing` or
        `abandon_listing`. Changes are stamped only while a listing is open, so nothing grows
        between listings."""
        with self._lock:
            self._listings += 1
            return self.generation

    def stamps(self) -> dict[str, int]:
        """The change stamps kept now (id -> generation), for what shows their bound."""
        with self._lock:
            return dict(self._touched)

    def abandon_listing(self) -> None:
        """A listing that will not be merged (the runtime could not be listed)."""
        with self._lock:
            self._end_listing(None)

    def _end_listing(self, started: int | None) -> None:
        self._listings = max(0, self._listings - 1)
        if not self._listings:
            self._touched.clear()
        elif started is not None:  # what no later listing can contradict: tombstones older than this one
            self._touched = {
                k: g
                for k, g in self._touched.items()
                if g > started or k in self._pods or k in self._containers
            }

    def put_pod(self, pod: PodRecord) -> None:
        with self._lock:
            old = self._pods.get(pod.sandbox_id)
            if old != pod:
                if old is None:
                    self._born[pod.sandbox_id] = self._api_seq
                self._pods[pod.sandbox_id] = pod
                self._stale.add(pod.sandbox_id)
                if pod.problems:
                    self._troubled.add(pod.sandbox_id)
                else:
                    self._troubled.discard(pod.sandbox_id)
                if old is None:
                    self._pods_changed(moved=False, appended=pod.sandbox_id if pod.ready else None)
                else:
                    self._pods_changed(moved=old.ready != pod.ready)
                self._bump(pod.sandbox_id)

    def stop_pod(self, sandbox_id: str) -> bool:
        """The sandbox stopped: it no longer counts, nor do its containers (they stopped too)."""
        with self._lock:
            pod = self._pods.get(sandbox_id)
            if pod is None:
                return False
            self._pods[sandbox_id] = replace(pod, ready=False)
            self._stale.add(sandbox_id)
            self._pods_changed(moved=pod.ready)
            touched = [sandbox_id]
            for c in list(self._containers.values()):
                if c.sandbox_id == sandbox_id and c.state in UPDATABLE_STATES:  # PENDING: its call says
                    self._store(replace(c, state=ContainerState.EXITED))
                    touched.append(c.id)
            self._bump(*touched)
            return True

    def remove_pod(self, sandbox_id: str) -> list[ContainerRecord]:
        """Forget a sandbox and its containers; returns the containers forgotten."""
        with self._lock:
            gone = [c for c in self._containers.values() if c.sandbox_id == sandbox_id]
            for c in gone:
                self._drop(c.id)
                self._in_flight.pop(c.id, None)
            self._pods.pop(sandbox_id, None)
            self._troubled.discard(sandbox_id)
            self._stale.add(sandbox_id)
            self._pods_changed()
            self._live.pop(sandbox_id, None)
            self._born.pop(sandbox_id, None)
            self._bump(sandbox_id, *(c.id for c in gone))  # remembered even when unknown (see above)
            return gone

    def put_container(self, container: ContainerRecord) -> None:
        """Add or replace a container; a PENDING one is this process's open CreateContainer."""
        with self._lock:
            if container.state is ContainerState.PENDING:
                self._in_flight.setdefault(container.id, time.monotonic())
            if self._containers.get(container.id) != container:
                self._store(container)
                self._bump(container.id)

    def rename_container(
        self, old_id: str, new_id: str, state: ContainerState = ContainerState.CREATED, **changes: object
    ) -> bool:
        """A pending container got its runtime id (and `changes`, in the same change); False when
        the pending record is gone."""
        with self._lock:
            self._in_flight.pop(old_id, None)
            c = self._drop(old_id)
            if c is None:
                return False
            self._store(replace(c, id=new_id, state=state, **changes))  # type: ignore[arg-type]
            self._bump(old_id, new_id)
            return True

    def update_container(self, container_id: str, **changes: object) -> ContainerRecord | None:
        with self._lock:
            c = self._containers.get(container_id)
            if c is None:
                return None
            new = replace(c, **changes)  # type: ignore[arg-type]
            if new != c:
                self._store(new)
                self._bump(container_id)
            return new

    def observe_container(
        self, container_id: str, actual_cpuset: str | None, source: str, at: float
    ) -> ContainerRecord | None:
        """Record what a container really has (a reading, not an event: it touches no record)."""
        with self._lock:
            c = self._containers.get(container_id)
            if c is None:
                return None
            new = replace(c, actual_cpuset=actual_cpuset, actual_source=source, actual_at=at)
            self._containers[container_id] = new  # nothing of the rules' view: no PodInfo changes
            if self._indexed:
                self._by_pod[c.sandbox_id][container_id] = new
            if (c.actual_cpuset, c.actual_source) != (actual_cpuset, source):
                self.generation += 1  # the same reading again changes no decision nor problem
                self._readings += 1
            return new

    def remove_container(self, container_id: str) -> ContainerRecord | None:
        """Forget a container; even an unknown id is remembered as removed, so a listing taken
        before the removal cannot bring it back."""
        with self._lock:
            self._in_flight.pop(container_id, None)
            c = self._drop(container_id)
            self._bump(container_id)
            return c

    def replace_all(self, pods: Iterable[PodRecord], containers: Iterable[ContainerRecord]) -> None:
        """Loading a checkpoint: these records replace what we had (nothing of them is in flight)."""
        with self._lock:
            self._pods = {p.sandbox_id: p for p in pods}
            self._born = {sid: self._born.get(sid, 0) for sid in self._pods}  # new ones: from before us
            self._containers = {c.id: c for c in containers}
            self._reindex()
            self._in_flight.clear()
            self._touched.clear()
            self._bump()

    def merge_listing(self, listing: Listing, pending_grace: float = float("inf")) -> Merged:
        """Reconcile, never replace: merge what the runtime listed into what we know (see
        `cri_proxy.state.merge`). Events seen after the listing began win over it. A pending record
        counts as an open call for `pending_grace` seconds at most: a call whose answer never came
        back through a hook (its connection lost) must not keep its record for ever; if it does
        answer later, the hook records the container anew."""
        now = time.monotonic()
        with self._lock:
            known = Known(
                pods=dict(self._pods),
                containers=dict(self._containers),
                touched=dict(self._touched),
                in_flight=frozenset(k for k, began in self._in_flight.items() if now - began < pending_grace),
            )
            merged = merge(known, listing)
            if merged.changed:
                for sid in merged.pods.keys() - self._pods.keys():
                    self._born[sid] = 0  # learnt from the runtime: from before any API event
                self._pods = dict(merged.pods)
                self._born = {sid: self._born.get(sid, 0) for sid in self._pods}
                self._containers = dict(merged.containers)
                self._reindex()
                self._in_flight = {k: t for k, t in self._in_flight.items() if k in self._containers}
                self._bump()
            self._end_listing(listing.started)
            return merged
