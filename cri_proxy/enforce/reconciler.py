"""Desired vs applied: send UpdateContainerResources where the decision moved.

One pass at a time; requests that arrive during a pass coalesce into one more pass. Each update
carries the container's full last-known resources with only `cpuset_cpus` replaced. Bounded
concurrency, retries with back-off for transient errors, NOT_FOUND drops the container, and a
periodic pass repairs drift (an update that failed, a change made behind the proxy's back).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
import grpc.aio
from loguru import logger
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from cri_api.v1 import api_pb2 as v1
from cri_proxy.config import Config
from cri_proxy.enforce.policy import Policy
from cri_proxy.enforce.recovery import canonical_cpuset
from cri_proxy.state.model import UPDATABLE_STATES, ContainerRecord, NodeState

SendUpdate = Callable[[ContainerRecord, bytes], Awaitable[None]]
"""Send UpdateContainerResources(container id, linux=<these LinuxContainerResources bytes>)."""

ReadCpuset = Callable[[ContainerRecord], Awaitable[str | None]]
"""The cpuset the runtime reports for a container now (None: it does not say)."""

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
        read_actual: ReadCpuset | None = None,
    ) -> None:
        self.state = state
        self.policy = policy
        self.send = send
        self.settings = settings  # concurrency, period, dry-run: read when used, a reload swaps them
        self.attempts = attempts
        self.read_actual = read_actual
        self.totals = Totals()
        self._requested = 0
        self._completed = 0
        self._wake = asyncio.Event()
        self._done = asyncio.Condition()

    @property
    def concurrency(self) -> int:
        return self.settings().reconcile_concurrency

    @property
    def period(self) -> float:
        return self.settings().reconcile_period_seconds

    @property
    def dry_run(self) -> bool:
        return self.settings().dry_run

    def request(self) -> int:
        self._requested += 1
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
        """Passes forever: on request, and every `period` seconds."""
        while True:
            periodic = False
            try:
                await asyncio.wait_for(self._wake.wait(), self.period if self.period > 0 else None)
            except TimeoutError:
                periodic = True
            self._wake.clear()
            ticket = self._requested
            try:
                if periodic:
                    await self.refresh_applied()
                await self.pass_once()
            except Exception as exc:  # a bug in one pass must not stop reconciliation for good
                logger.opt(exception=exc).error("reconcile pass failed: {}", exc)
            async with self._done:
                self._completed = max(self._completed, ticket)
                self._done.notify_all()

    async def refresh_applied(self) -> int:
        """Drift repair: take the cpuset each live container really has from the runtime, so the
        pass that follows corrects what was changed behind the proxy's back. Returns how many differed."""
        if self.read_actual is None:
            return 0
        read = self.read_actual
        gate = asyncio.Semaphore(self.concurrency)
        drifted = 0

        async def one(c: ContainerRecord) -> None:
            nonlocal drifted
            async with gate:
                try:
                    actual = await read(c)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() is grpc.StatusCode.NOT_FOUND:
                        self.state.remove_container(c.id)
                    return
            if actual is not None and actual != c.applied:
                drifted += 1
                logger.warning(
                    "container {} ({}) has cpuset {!r}, not {!r}: drift, repairing",
                    c.name,
                    c.id[:13],
                    actual,
                    c.applied,
                )
                self.state.update_container(c.id, applied=actual)

        await asyncio.gather(*(one(c) for c in self.state.containers() if c.state in UPDATABLE_STATES))
        return drifted

    def pending(self) -> list[tuple[ContainerRecord, str]]:
        """(container, decided cpuset) for every live container whose applied set differs."""
        plan = self.policy.plan()
        out = []
        for c in self.state.containers():
            if c.state not in UPDATABLE_STATES:
                continue
            if not c.resources and c.applied is None:
                continue  # nothing known of its resources: a cpuset-only update could reset the rest
            decision = plan.containers.get(c.id)
            if decision is None or decision.cpuset is None or decision.qos is None:
                continue
            want = str(decision.cpuset)
            if want != c.applied:
                out.append((c, want))
        return out

    async def pass_once(self) -> PassResult:
        result = PassResult()
        todo = self.pending()
        self.totals.passes += 1
        if not todo:
            return result
        if self.dry_run:
            for c, want in todo:
                logger.info(
                    "dry-run: would update {} ({}) cpuset {!r} -> {!r}", c.name, c.id[:13], c.applied, want
                )
            result.would_update = len(todo)
            return result
        gate = asyncio.Semaphore(self.concurrency)

        async def one(c: ContainerRecord, want: str) -> None:
            async with gate:
                await self._update(c, want, result)

        await asyncio.gather(*(one(c, want) for c, want in todo))
        self.totals.updated += result.updated
        self.totals.failed += result.failed
        self.totals.dropped += result.dropped
        logger.info(
            "reconciled: {} updated, {} failed, {} gone", result.updated, result.failed, result.dropped
        )
        return result

    async def _update(self, c: ContainerRecord, want: str, result: PassResult) -> None:
        resources = c.linux_resources()
        resources.cpuset_cpus = want
        body = resources.SerializeToString()
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self.attempts),
                wait=wait_exponential(multiplier=0.1, max=2.0),
                retry=retry_if_exception(_transient),
                reraise=True,
            ):
                with attempt:
                    await self.send(c, body)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.NOT_FOUND:
                self.state.remove_container(c.id)
                result.dropped += 1
                logger.info("container {} ({}) is gone from the runtime; forgotten", c.name, c.id[:13])
                return
            result.failed += 1
            logger.warning(
                "update of {} ({}) to cpuset {} failed: {} {}",
                c.name,
                c.id[:13],
                want,
                exc.code().name,
                exc.details(),
            )
            return
        self.state.update_container(c.id, applied=want, resources=body)
        result.updated += 1
        logger.info("container {} ({}) cpuset {!r} -> {!r}", c.name, c.id[:13], c.applied, want)


def channel_reader(channel: grpc.aio.Channel, timeout: float = 10.0) -> ReadCpuset:
    """ContainerStatus over the runtime channel: the cpuset the runtime has (CRI >= 1.25)."""
    status = channel.unary_unary("/runtime.v1.RuntimeService/ContainerStatus", None, None)

    async def read(c: ContainerRecord) -> str | None:
        reply = v1.ContainerStatusResponse.FromString(
            await status(v1.ContainerStatusRequest(container_id=c.id).SerializeToString(), timeout=timeout)
        )
        if not reply.status.HasField("resources") or not reply.status.resources.HasField("linux"):
            return None
        return canonical_cpuset(reply.status.resources.linux.cpuset_cpus)

    return read


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
