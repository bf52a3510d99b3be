"""Keep the node state true to the runtime: list it and merge, never replace.

At start (after the checkpoint), after a runtime outage (full: every status asked again) and in
every periodic reconcile pass (cheap: the two lists, and statuses only of what is new). One merge
at a time; the merge itself runs under the state's lock, so CRI events that arrive meanwhile are
never lost (`cri_proxy.state.merge`). Problems are logged when they first appear.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc.aio
from loguru import logger

from cri_proxy.enforce.recovery import read_runtime
from cri_proxy.state.merge import Merged
from cri_proxy.state.model import NodeState

LEARN_EVERY = 1.0
"""Seconds between on-demand listings (`learn`): a client naming unknown ids cannot make more."""

PENDING_GRACE = 20.0
"""Seconds an unanswered CreateContainer keeps its pending record against listings without it."""


class Syncer:
    """Merges the runtime's listing into `state`; `sync()` is one listing and one merge."""

    def __init__(
        self,
        state: NodeState,
        channel: grpc.aio.Channel,
        timeout: float = 10.0,
        pending_grace: float = PENDING_GRACE,
    ) -> None:
        self.state = state
        self.channel = channel
        self.timeout = timeout
        self.pending_grace = pending_grace
        self._one = asyncio.Lock()
        self._reported: frozenset[str] = frozenset()
        self._learning: asyncio.Future[Merged] | None = None
        self._learned_at: float | None = None  # when the last on-demand listing began

    async def learn(self, within: float) -> None:
        """A call names a container the state lacks (created behind the proxy's back, or not yet
        re-listed after a restart): list the runtime now rather than at the next period. Callers
        share one listing; at most one a `LEARN_EVERY`; waits at most `within` seconds, and a
        failed listing only means the caller goes on with what is known."""
        if self._learning is None:
            if self._learned_at is not None and time.monotonic() - self._learned_at < LEARN_EVERY:
                return
            self._learned_at = time.monotonic()
            self._learning = asyncio.ensure_future(self.sync(full=False))
            self._learning.add_done_callback(self._learned)
        with contextlib.suppress(Exception):  # timed out or not listed: the periodic pass will tell
            await asyncio.wait_for(asyncio.shield(self._learning), within)

    def _learned(self, done: asyncio.Future[Merged]) -> None:
        self._learning = None
        if not done.cancelled() and done.exception() is not None:
            logger.debug("on-demand runtime listing failed: {}", done.exception())

    async def sync(self, full: bool = False) -> Merged:
        """List the runtime and merge; raises when the runtime cannot be listed."""
        async with self._one:
            started = self.state.begin_listing()
            pods = {p.sandbox_id: p for p in self.state.pods()}
            containers = {c.id: c for c in self.state.containers()}
            try:
                view = await read_runtime(self.channel, pods, containers, full=full, timeout=self.timeout)
            except BaseException:
                self.state.abandon_listing()
                raise
            merged = self.state.merge_listing(view.listing(started), self.pending_grace)
        problems = frozenset(view.problems)
        for problem in sorted(problems - self._reported):
            logger.warning("runtime listing: {}", problem)
        self._reported = problems
        self._log(merged)
        return merged

    async def periodic(self) -> None:
        """The reconciler's periodic pass: a failed listing is logged, the pass goes on."""
        try:
            await self.sync(full=False)
        except grpc.aio.AioRpcError as exc:
            logger.warning("runtime listing failed: {} {}", exc.code().name, exc.details())
        except Exception as exc:  # a bad reply must not stop drift repair: log it, go on
            logger.opt(exception=exc).error("runtime listing not merged: {}", exc)

    @staticmethod
    def _log(merged: Merged) -> None:
        parts = [
            f"{len(ids)} {what}"
            for what, ids in (
                ("pods adopted", merged.adopted_pods),
                ("pods dropped", merged.dropped_pods),
                ("containers adopted", merged.adopted),
                ("containers dropped", merged.dropped),
                ("containers exited", merged.exited),
            )
            if ids
        ]
        resolved = [f"{pid} -> {cid or 'dropped'}" for pid, cid in sorted(merged.resolved.items())]
        if resolved:
            parts.append("pending resolved: " + ", ".join(resolved))
        if parts:
            logger.info("merged the runtime's listing: {}", "; ".join(parts))
