"""Desired vs applied: send UpdateContainerResources where the decision moved.

One pass at a time; requests that arrive during a pass coalesce into one more pass. Each update
carries the container's full last-known resources with only `cpuset_cpus` replaced, known as the
runtime holds them just before (a change made at the runtime directly is kept, not undone). Bounded
concurrency, retries with back-off for transient errors, NOT_FOUND drops the container, and a
periodic pass first merges the runtime's listing into the state (containers created or exited
behind the proxy's back), then repairs drift: what each container's cgroup really has, never what
the proxy last sent, is compared with what was applied. An update is checked against the cgroup
once sent, and again after the container's start (containerd 1.6 can drop an update that lands
around a start while reporting it applied).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
from loguru import logger
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from cri_api.v1 import api_pb2 as v1
from cri_proxy.config import Config
from cri_proxy.cpu import Plan, ProblemKind
from cri_proxy.enforce.actual import ReadActual, Reading, RuntimeResources
from cri_proxy.enforce.naming import about
from cri_proxy.enforce.policy import Policy
from cri_proxy.state.model import ACTUAL_CGROUP, UPDATABLE_STATES, ContainerRecord, ContainerState, NodeState
from cri_proxy.state.resources import merge_linux_resources

__all__ = ["PassResult", "Reconciler", "Totals", "channel_sender"]

SendUpdate = Callable[[ContainerRecord, bytes], Awaitable[None]]
"""Send UpdateContainerResources(container id, linux=<these LinuxContainerResources bytes>)."""


Sync = Callable[[], Awaitable[object]]
"""Merge the runtime's listing into the state (the periodic pass's cheap ListContainers diff)."""

ASKS = 16
"""ContainerStatus calls at once in a pass: each update's ask of what the runtime holds goes ahead of
the updates' gate, so the asks overlap the updates rather than lengthen each."""

Held = bytes | grpc.aio.AioRpcError | None
"""What the runtime said it holds for a container: resources, its error, or nothing (not asked)."""

FRESH_KEPT = 4096
"""Containers created with no update since that are remembered at most (`Reconciler.created`)."""

TRANSIENT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in TRANSIENT


@dataclass
class PassResult:
    updated: int = 0
    failed: int = 0
    dropped: int = 0
    would_update: int = 0


@dataclass
class Totals:
    passes: int = 0
    updated: int = 0
    failed: int = 0
    dropped: int = 0
    repaired: int = 0  # containers whose real cpuset differed from what was applied, re-sent
    start_checks: int = 0  # starts checked against the cgroup (an update went to the container)


class Reconciler:
    """`request()` asks for a pass and returns its ticket; `wait_for(ticket)` waits until done."""

    def __init__(
        self,
        state: NodeState,
        policy: Policy,
        send: SendUpdate,
        settings: Callable[[], Config],
        *,
        attempts: int = 4,
        retry_wait: float = 0.1,
        read_actual: ReadActual | None = None,
        sync: Sync | None = None,
        runtime_resources: RuntimeResources | None = None,
    ) -> None:
        self.state = state
        self.policy = policy
        self.send = send
        self.settings = settings  # concurrency, period, dry-run: read when used, a reload swaps them
        self.attempts = attempts
        self.retry_wait = retry_wait  # the first retry's wait, doubling up to 2 s
        self.read_actual = read_actual
        self.sync = sync
        self.runtime_resources = runtime_resources
        self.totals = Totals()
        self._sending: dict[str, int] = {}  # container id -> updates in flight
        # containers this process created whose cgroup has what their create set, no update sent to
        # them since: nothing can have landed around their start (`verify_started`); oldest first
        self._fresh: dict[str, None] = {}
        self._sent = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        self._overlaps: frozenset[str] = frozenset()
        self._not_taken: dict[str, int] = {}  # container id -> updates in a row its cgroup did not take
        # container id -> (the cpuset, the error) of its last update that failed: the same failure
        # again, pass after pass (a pod cgroup without the CPUs), is not written out again
        self._failing: dict[str, tuple[str, str]] = {}
        self._requested = 0
        self._completed = 0
        self._refresh = False
        self._wake = asyncio.Event()
        self._done = asyncio.Condition()
        self._seen_plan: Plan | None = None  # the plan `pending` last looked at
        self._cursor = 0  # where in the state's changes it was then
        self._open: set[str] = set()  # what it found pending then

    @property
    def concurrency(self) -> int:
        return self.settings().reconcile_concurrency

    @property
    def period(self) -> float:
        return self.settings().reconcile_period_seconds

    @property
    def dry_run(self) -> bool:
        return self.settings().dry_run

    def request(self, refresh: bool = False) -> int:
        """Ask for a pass (`refresh`: read every container's real cpuset first, as the periodic
        pass does, e.g. after recovery) and return its ticket."""
        self._requested += 1
        self._refresh = self._refresh or refresh
        self._wake.set()
        return self._requested

    async def wait_for(self, ticket: int, timeout: float) -> bool:
        """True once a pass that started after `ticket` was requested has finished."""

        async def done() -> None:
            async with self._done:
                await self._done.wait_for(lambda: self._completed >= ticket)

        try:
            await asyncio.wait_for(done(), timeout)
        except TimeoutError:
            return False
        return True

    async def run(self) -> None:
        """Passes forever: on request, and every `period` seconds. Cancelled, it cancels the
        container checks it began too."""
        try:
            await self._passes()
        finally:
            for task in list(self._tasks):
                task.cancel()

    async def _passes(self) -> None:
        """The periodic pass comes `period` after the last one, requested passes or not: requests
        that come more often than that (a busy node's creates, a container whose cgroup keeps
        refusing its set, asked again every period) must not put the listing and the drift
        repair off for good."""
        last = time.monotonic()  # the last periodic pass (the start's recovery stood for one)
        while True:
            period = self.period
            if period > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(0.0, last + period - time.monotonic()))
            else:
                await self._wake.wait()
            periodic = period > 0 and time.monotonic() >= last + period
            if periodic:
                last = time.monotonic()
            self._wake.clear()
            ticket = self._requested
            refresh, self._refresh = self._refresh, False
            try:
                if periodic and self.sync is not None:
                    await self.sync()
                if periodic or refresh:
                    await self.refresh_applied()
                await self.pass_once(everything=periodic or refresh)
            except Exception as exc:  # a bug in one pass must not stop reconciliation for good
                logger.opt(exception=exc).error("reconcile pass failed: {}", exc)
            async with self._done:
                self._completed = max(self._completed, ticket)
                self._done.notify_all()

    async def refresh_applied(self) -> int:
        """Drift repair: read the cpuset each live container really has (its cgroup where the
        proxy can read it), so the pass that follows corrects what differs from what was applied.
        Returns how many differed."""
        gate = asyncio.Semaphore(self.concurrency)
        drifted = 0

        async def one(c: ContainerRecord) -> None:
            nonlocal drifted
            async with gate:
                reading = await self.observe(c)
            if reading is not None and self._differs(reading.cpuset, c.applied):
                drifted += 1
                self._drifted(c, reading, "drift")

        await asyncio.gather(*(one(c) for c in self.state.containers() if c.state in UPDATABLE_STATES))
        return drifted

    async def observe(self, c: ContainerRecord, status_too: bool = True) -> Reading | None:
        """Read what `c` really has and record it on its record; a container gone is forgotten."""
        if self.read_actual is None:
            return None
        try:
            reading = await self.read_actual(c, status_too)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.NOT_FOUND and self.state.remove_container(c.id) is not None:
                self.totals.dropped += 1
                log, who = about(self.state, c)
                log.info("{}: gone from the runtime; forgotten", who)
            return None
        if reading is not None:
            self.state.observe_container(c.id, reading.cpuset, reading.source, time.time())
        return reading

    def _differs(self, actual: str, applied: str | None) -> bool:
        """A real cpuset differs from the applied one ("" = none set = every online CPU)."""
        if applied is None:
            return False
        online = str(self.policy.topology.online)
        return (actual or online) != (applied or online)

    def _drifted(self, c: ContainerRecord, reading: Reading, why: str) -> None:
        """`c` really has another cpuset than applied: take it as applied, so it is sent again."""
        self.totals.repaired += 1
        log, who = about(self.state, c)
        log.warning(
            "{}: {} has cpuset {!r}, not {!r} as applied ({}); repairing",
            who,
            "its cgroup" if reading.source == ACTUAL_CGROUP else "the runtime",
            reading.cpuset,
            c.applied,
            why,
        )
        self.state.update_container(c.id, applied=reading.cpuset)

    def created(self, container_id: str) -> None:
        """The container was created with its cpuset (the create's own, no update): its start needs
        no check. At most FRESH_KEPT are remembered; one forgotten is checked, as any other."""
        fresh = self._fresh
        fresh[container_id] = None
        if len(fresh) > FRESH_KEPT:
            del fresh[next(iter(fresh))]

    def updating(self, container_id: str) -> None:
        """An update is going to the container (ours or a client's): its start is checked."""
        self._fresh.pop(container_id, None)

    def verify_started(self, container_id: str) -> None:
        """After StartContainer: once no update to it is in flight, check the container's cgroup
        took the applied cpuset (containerd 1.6 drops an update that lands around a start). Not
        for a container no update went to since its create (`created`): the check would read a
        cgroup and the runtime's status while the kubelet's next call comes, for nothing."""
        if container_id in self._fresh:
            del self._fresh[container_id]
            return
        self.totals.start_checks += 1
        self._spawn(self._verify(container_id))

    async def _verify(self, container_id: str, timeout: float = 10.0) -> None:
        async with self._sent:
            with contextlib.suppress(TimeoutError):
                idle = self._sent.wait_for(lambda: container_id not in self._sending)
                await asyncio.wait_for(idle, timeout)
        c = self.state.container(container_id)
        if c is None or c.state not in UPDATABLE_STATES:
            return
        reading = await self.observe(c)
        if reading is not None and self._differs(reading.cpuset, c.applied):
            self._drifted(c, reading, "update around its start not taken")
            self.request()

    async def checks_done(self) -> None:
        """Wait until the checks `verify_started` began have finished (for tests and shutdown)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, job: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(job)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            logger.opt(exception=exc).error("container check failed: {}", exc)

    def _report_overlaps(self) -> None:
        """Log each overlap of an exclusive container's CPUs once, when it appears."""
        now = {p.message for p in self.policy.plan().problems if p.kind is ProblemKind.EXCLUSIVE_OVERLAP}
        for message in sorted(now - self._overlaps):
            logger.warning("exclusivity not held: {}", message)
        for message in sorted(self._overlaps - now):
            logger.info("exclusivity restored: {}", message)
        self._overlaps = frozenset(now)

    def pending(self, everything: bool = False) -> list[tuple[ContainerRecord, str]]:
        """(container, decided cpuset) for every live container whose applied set differs.

        Only the containers whose record or decision changed since the last call are looked at
        again (and those still pending then), unless `everything` or what changed is not known:
        a pass after one CreateContainer costs that container, not the node."""
        plan = self.policy.plan()
        decided = plan.containers
        seen, self._seen_plan = self._seen_plan, plan
        changed, self._cursor = self.state.changes(self._cursor)
        moved = self.policy.changed_since(seen) if seen is not None else None
        records: list[ContainerRecord]
        if everything or changed is None or moved is None:
            records = self.state.containers()
        else:
            look = changed | moved | self._open
            found = (self.state.container(cid) for cid in look)
            records = [c for c in found if c is not None]
        texts: dict[int, str | None] = {}  # id(decision) -> its cpuset as text (pods share decisions)
        out = []
        for c in records:
            state = c.state
            if state is not ContainerState.RUNNING and state is not ContainerState.CREATED:
                continue  # (UPDATABLE_STATES, without hashing an enum per container)
            if not c.resources and c.applied is None:
                continue  # nothing known of its resources: a cpuset-only update could reset the rest
            decision = decided.get(c.id)
            if decision is None:
                continue
            key = id(decision)
            if key in texts:
                want = texts[key]
            else:
                managed = decision.cpuset is not None and decision.qos is not None
                want = texts[key] = str(decision.cpuset) if managed else None
            if want is not None and want != c.applied:
                out.append((c, want))
        self._open = {c.id for c, _ in out}
        return out

    async def pass_once(self, everything: bool = False) -> PassResult:
        result = PassResult()
        todo = self.pending(everything)
        self.totals.passes += 1
        self._not_taken = {k: n for k, n in self._not_taken.items() if self.state.container(k) is not None}
        self._failing = {k: f for k, f in self._failing.items() if self.state.container(k) is not None}
        if not todo:
            self._report_overlaps()
            return result
        if self.dry_run:
            for c, want in todo:
                log, who = about(self.state, c)
                log.info("dry-run: would update {} cpuset {!r} -> {!r}", who, c.applied, want)
            result.would_update = len(todo)
            return result
        gate, asks = asyncio.Semaphore(self.concurrency), asyncio.Semaphore(ASKS)

        async def one(c: ContainerRecord, want: str) -> None:
            async with asks:
                asked = self.state.container(c.id)
                if asked is None:
                    return  # removed meanwhile
                held = await self._ask(asked)
            async with gate:
                now = self.state.container(c.id)  # an update through the proxy may have come meanwhile
                if now is None:
                    return  # removed meanwhile
                if now.resources != asked.resources:
                    held = None  # the copy is newer than the runtime's answer
                await self._update(now, want, result, held)

        await asyncio.gather(*(one(c, want) for c, want in todo))
        self.totals.updated += result.updated
        self.totals.failed += result.failed
        self.totals.dropped += result.dropped
        logger.info(
            "reconciled: {} updated, {} failed, {} gone", result.updated, result.failed, result.dropped
        )
        self._report_overlaps()
        return result

    async def _update(self, c: ContainerRecord, want: str, result: PassResult, held: Held) -> None:
        log, who = about(self.state, c)
        self.updating(c.id)
        self._sending[c.id] = self._sending.get(c.id, 0) + 1
        try:
            resources = self._resources_now(c, held)
            resources.cpuset_cpus = want
            body = resources.SerializeToString()
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self.attempts),
                wait=wait_exponential(multiplier=self.retry_wait, max=2.0),
                retry=retry_if_exception(_transient),
                reraise=True,
            ):
                with attempt:
                    await self.send(c, body)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.NOT_FOUND:
                if self.state.remove_container(c.id) is not None:  # not already forgotten by a check
                    result.dropped += 1
                    log.info("{}: gone from the runtime; forgotten", who)
                return
            result.failed += 1
            failure = (want, f"{exc.code().name} {exc.details()}")
            again = self._failing.get(c.id) == failure
            self._failing[c.id] = failure
            level = "DEBUG" if again else "WARNING"
            log.log(
                level,
                "{}: update to cpuset {} failed{}: {}",
                who,
                want,
                " again" if again else "",
                failure[1],
            )
            return
        finally:
            await self._done_sending(c.id)
        self.state.update_container(c.id, applied=want, resources=body)
        result.updated += 1
        failed = self._failing.pop(c.id, None)
        after = " (after failing)" if failed is not None else ""
        log.info("{}: cpuset {!r} -> {!r}{}", who, c.applied, want, after)
        done = self.state.container(c.id)
        if done is not None:
            reading = await self.observe(done, status_too=False)  # the status only echoes the update
            taken = reading is None or not self._differs(reading.cpuset, want)
            if not taken and reading is not None and reading.source == ACTUAL_CGROUP:
                self._drifted(done, reading, "the update did not reach the cgroup")
                self._retry_later(c.id)
            else:
                self._not_taken.pop(c.id, None)

    async def _ask(self, c: ContainerRecord) -> Held:
        """What the runtime holds for `c` now, or its error (the update handles it)."""
        if self.runtime_resources is None:
            return None
        try:
            return await self.runtime_resources(c)
        except grpc.aio.AioRpcError as exc:
            return exc

    async def resources_held(self, c: ContainerRecord) -> Any:
        """`c`'s resources as the runtime holds them now where it says, else the proxy's copy: what
        an update through the proxy (the kubelet's) is merged into. The runtime's error is left to
        that update's own answer."""
        held = await self._ask(c)
        return self._resources_now(c, None if isinstance(held, grpc.aio.AioRpcError) else held)

    def _resources_now(self, c: ContainerRecord, held: Held) -> Any:
        """The proxy's copy of `c`'s resources, what the runtime `held` winning where it says: a
        limit changed at the runtime directly (`crictl update --memory` on its socket) is sent as
        it is there, not put back. Raises NOT_FOUND; any other error leaves the copy as it is."""
        resources = c.linux_resources()
        if isinstance(held, grpc.aio.AioRpcError):
            if held.code() is grpc.StatusCode.NOT_FOUND:
                raise held
            return resources  # the update itself says what is wrong with the runtime
        if held is None:
            return resources
        theirs = v1.LinuxContainerResources.FromString(held)
        changed = [
            f"{fd.name} {getattr(resources, fd.name)} -> {value}"
            for fd, value in theirs.ListFields()
            if fd.message_type is None
            and not fd.is_repeated
            and fd.name != "cpuset_cpus"
            and getattr(resources, fd.name) not in (0, "", value)
        ]
        if changed:
            log, who = about(self.state, c)
            log.info("{}: changed at the runtime directly, kept: {}", who, ", ".join(changed))
        merge_linux_resources(resources, theirs)
        return resources

    def _retry_later(self, container_id: str) -> None:
        """Ask for another pass soon, backing off per container (0.5 s, 1 s, ... up to the period),
        so a cgroup that keeps refusing a set is not hammered."""
        n = self._not_taken.get(container_id, 0)
        self._not_taken[container_id] = n + 1
        delay = min(0.5 * 2**n, max(self.period, 1.0))
        asyncio.get_running_loop().call_later(delay, self.request)

    async def _done_sending(self, container_id: str) -> None:
        async with self._sent:
            left = self._sending.get(container_id, 1) - 1
            if left > 0:
                self._sending[container_id] = left
            else:
                self._sending.pop(container_id, None)
            self._sent.notify_all()


def channel_sender(channel: grpc.aio.Channel, timeout: float = 10.0) -> SendUpdate:
    """UpdateContainerResources over the relay's runtime channel, in the container's API version."""
    calls = {
        version: channel.unary_unary(
            f"/runtime.{version}.RuntimeService/UpdateContainerResources", None, None
        )
        for version in ("v1", "v1alpha2")
    }

    async def send(c: ContainerRecord, linux: bytes) -> None:
        request = v1.UpdateContainerResourcesRequest(
            container_id=c.id, linux=v1.LinuxContainerResources.FromString(linux)
        )
        await calls.get(c.api_version, calls["v1"])(request.SerializeToString(), timeout=timeout)

    return send
