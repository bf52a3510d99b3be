"""Problems as Kubernetes Events, where operators already look (`kubectl describe pod`).

A pure correlator, as kubelet's event recorder does it: an event per (object, reason, message);
the same one again is a PATCH of `count` and `lastTimestamp` on the Event already posted, not a new
Event; a token bucket per object (burst 25, one more every 5 minutes) keeps a flapping problem from
flooding the API. A problem is posted when it appears (and again when it comes back after it went
away), not on every pass while it lasts. Node-wide problems (the kubelet state file) go on the Node.

`EventPoster` is the thin I/O shell: the live problems every `period` seconds, the actions sent
through the Kubernetes API watcher's client (create, patch; a patch of an expired Event creates).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from cri_proxy.threads import in_daemon_thread

COMPONENT = "cri-proxy"
SKIPPED_KINDS = frozenset({"api-unreachable", "api-wrong-node", "cpuset-drift", "dry-run"})
"""Not posted: the API is what failed (or its Node is not this one), drift is being repaired,
dry-run is the operator's choice."""


def reason(kind: str) -> str:
    """`pool-exhausted` -> `PoolExhausted` (kubelet's reasons are CamelCase)."""
    special = {"bad-kubelet-state": "KubeletStateUnreadable", "exclusive-overlap": "ExclusivityBroken"}
    return special.get(kind) or "".join(part.capitalize() for part in kind.split("-"))


@dataclass(frozen=True, slots=True)
class Target:
    kind: str  # "Pod" or "Node"
    namespace: str
    name: str
    uid: str = ""


@dataclass(frozen=True, slots=True)
class Occurrence:
    target: Target
    reason: str
    message: str


@dataclass
class TokenBucket:
    """`burst` tokens, one more every `1/rate` seconds."""

    burst: float
    rate: float
    tokens: float = -1.0
    at: float = 0.0

    def take(self, now: float) -> bool:
        if self.tokens < 0:
            self.tokens, self.at = self.burst, now
        self.tokens = self.level(now)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def level(self, now: float) -> float:
        """The tokens at `now` (a wall clock stepped back refills nothing, and takes nothing)."""
        return min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)


@dataclass(frozen=True, slots=True)
class Create:
    namespace: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Patch:
    namespace: str
    name: str
    body: dict[str, Any]
    create: Create  # if the Event expired meanwhile


@dataclass
class _Posted:
    name: str
    namespace: str
    count: int
    first: str
    at: float  # when it was last posted


FORGET_AFTER = 3600.0
"""Seconds after its last post that an Event not present any more is forgotten: the API server's
default `--event-ttl`, after which a PATCH finds nothing and a new Event is created anyway."""
KEPT_AT_MOST = 4096
"""Events remembered at most (as client-go's event correlator's cache); past it the oldest go."""


def _stamp(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Correlator:
    """Occurrences in, Create/Patch actions out; dedup, count and rate limit, no I/O."""

    host: str
    burst: float = 25.0
    rate: float = 1.0 / 300.0
    posted: dict[Occurrence, _Posted] = field(default_factory=dict)
    active: set[Occurrence] = field(default_factory=set)
    buckets: dict[Target, TokenBucket] = field(default_factory=dict)
    dropped: int = 0
    forget_after: float = FORGET_AFTER
    kept_at_most: int = KEPT_AT_MOST

    def _body(self, o: Occurrence, name: str, count: int, first: str, last: str) -> dict[str, Any]:
        t = o.target
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": t.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": t.kind, "name": t.name, "namespace": t.namespace}
            | ({"uid": t.uid} if t.uid else {}),
            "reason": o.reason,
            "message": o.message,
            "type": "Warning",
            "count": count,
            "firstTimestamp": first,
            "lastTimestamp": last,
            "source": {"component": COMPONENT, "host": self.host},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.host,
        }

    def failed(self, o: Occurrence) -> None:
        """Its action could not be sent: not active, so the next call tries again."""
        self.active.discard(o)
        seen = self.posted.get(o)
        if seen is not None and seen.count == 1:
            del self.posted[o]  # never created
        elif seen is not None:
            seen.count -= 1

    def observe(
        self, now_present: Iterable[Occurrence], now: float
    ) -> list[tuple[Occurrence, Create | Patch]]:
        """The problems present now: an action for each that appeared since the last call."""
        present = set(now_present)
        actions: list[tuple[Occurrence, Create | Patch]] = []
        still: set[Occurrence] = set()
        for o in sorted(present - self.active, key=lambda o: (o.target.namespace, o.target.name, o.reason)):
            bucket = self.buckets.setdefault(o.target, TokenBucket(self.burst, self.rate))
            if not bucket.take(now):
                self.dropped += 1
                continue  # not active: tried again at the next call while it lasts
            last = _stamp(now)
            seen = self.posted.get(o)
            if seen is None:
                name = f"{o.target.name}.{int(now * 1e9):x}"
                seen = self.posted[o] = _Posted(name, o.target.namespace, 1, last, now)
                actions.append((o, Create(o.target.namespace, self._body(o, name, 1, last, last))))
            else:
                seen.count += 1
                seen.at = now
                fresh = Create(o.target.namespace, self._body(o, seen.name, seen.count, seen.first, last))
                body = {"count": seen.count, "lastTimestamp": last}
                actions.append((o, Patch(seen.namespace, seen.name, body, fresh)))
            still.add(o)
        self.active = (self.active & present) | still
        self._forget(now)
        return actions

    def _forget(self, now: float) -> None:
        """Bounded over a node's lifetime: pods come and go, and a message may name what changes.
        An Event whose problem is not present and whose last post is over `forget_after` old is
        forgotten, at most `kept_at_most` are kept (the oldest posts go first), and a bucket that
        is full again is as good as a new one."""
        posted, keep, old = self.posted, self.kept_at_most, now - self.forget_after
        for o in [o for o, seen in posted.items() if o not in self.active and seen.at < old]:
            del posted[o]
        if len(posted) > keep:
            for o in sorted(posted, key=lambda o: posted[o].at)[: len(posted) - keep]:
                del posted[o]  # (if still present, it is posted anew once it has gone and come back)
        busy = {o.target for o in self.active}
        for target in [t for t, b in self.buckets.items() if t not in busy and b.level(now) >= b.burst]:
            del self.buckets[target]


def occurrences(
    problems: Iterable[Mapping[str, Any]], uids: Mapping[str, str], node: str
) -> list[Occurrence]:
    """Live problem rows (`pod` ns/name or None, `kind`, `message`) as occurrences on their object."""
    out = []
    for p in problems:
        kind = str(p.get("kind", ""))
        if kind in SKIPPED_KINDS:
            continue
        pod = p.get("pod")
        if pod:
            namespace, _, name = str(pod).partition("/")
            target = Target("Pod", namespace, name, uids.get(str(pod), ""))
        else:
            target = Target("Node", "default", node, "")
        out.append(Occurrence(target, reason(kind), str(p.get("message", ""))))
    return out


Send = Callable[[Create | Patch], Awaitable[None]]


def client_sender(get_client: Callable[[], Any], timeout: float = 5.0) -> Send:
    """Create/Patch through the kubernetes client, in a daemon thread (the client is blocking):
    an API server that takes the request and answers nothing holds that thread up to `timeout`
    for each of the client's tries, not the proxy's stop (the loop's default executor is waited
    for at exit)."""

    def call(action: Create | Patch) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        api_client = get_client()
        if api_client is None:
            raise ConnectionError("the Kubernetes API client is not connected yet")
        api: Any = client.CoreV1Api(api_client)
        if isinstance(action, Patch):
            try:
                api.patch_namespaced_event(
                    action.name,
                    action.namespace,
                    action.body,
                    _request_timeout=timeout,
                    _preload_content=False,
                )
                return
            except ApiException as exc:
                if exc.status != 404:  # expired (events live an hour): post it anew
                    raise
            action = action.create
        api.create_namespaced_event(
            action.namespace, action.body, _request_timeout=timeout, _preload_content=False
        )

    async def send(action: Create | Patch) -> None:
        await in_daemon_thread(lambda: call(action), name="kube-events")

    return send


class EventPoster:
    """Every `period` seconds: the live problems, correlated, posted. Failures are logged once."""

    def __init__(
        self,
        correlator: Correlator,
        problems: Callable[[], Awaitable[list[dict[str, Any]]]],
        uids: Callable[[], Mapping[str, str]],
        send: Send,
        period: float = 10.0,
    ) -> None:
        self.correlator = correlator
        self.problems = problems
        self.uids = uids
        self.send = send
        self.period = period
        self.passes = 0
        self.posted = 0
        self.failed = 0
        self._last_error = ""
        self._kick = asyncio.Event()

    def kick(self) -> None:
        """Look at the problems now rather than at the end of the period."""
        self._kick.set()

    async def once(self, now: float) -> None:
        found = occurrences(await self.problems(), self.uids(), self.correlator.host)
        for o, action in self.correlator.observe(found, now):
            try:
                await self.send(action)
                self.posted += 1
                self._last_error = ""
            except Exception as exc:
                self.failed += 1
                self.correlator.failed(o)
                text = f"{type(exc).__name__}: {getattr(exc, 'status', '') or exc}"
                if text != self._last_error:
                    logger.warning("Kubernetes Event not posted: {}", text)
                    self._last_error = text
        self.passes += 1

    async def run(self) -> None:
        while True:
            try:
                await self.once(time.time())
            except Exception as exc:  # the views failed: try again next period
                logger.opt(exception=exc).warning("problems not turned into Events: {}", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.period)
            self._kick.clear()
