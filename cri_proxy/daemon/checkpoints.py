"""Keeping the checkpoint: loaded once at start, written (off the event loop) whenever state changed.

One write at a time, in a daemon thread of its own: an fsync on a stalled disk (a volume that stops
answering, a throttled device) never returns and no signal interrupts it. Meanwhile the proxy works
in memory, says so once the write has taken `stalled_after` seconds, and `unsaved_seconds()` (a
metric) counts how long the checkpoint has lacked a change. The stop waits a bounded time for it.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from pathlib import Path

from loguru import logger

from cri_proxy.errors import CheckpointError
from cri_proxy.state import checkpoint
from cri_proxy.state.checkpoint import Records
from cri_proxy.state.model import NodeState
from cri_proxy.threads import in_daemon_thread

CHECKPOINT_NAME = "checkpoint.json"
STALLED_AFTER = 10.0
"""Seconds a write may take before it is said (a healthy disk takes milliseconds)."""
STOP_WAIT = 5.0
"""Seconds the stop waits for the last writes: a stalled disk must not hold it until systemd's kill."""

Write = Callable[[Path, NodeState, checkpoint.Encoder], int]


def _write(path: Path, state: NodeState, encoder: checkpoint.Encoder) -> int:
    return checkpoint.save(path, state, encoder=encoder)


class CheckpointKeeper:
    """`<state_dir>/checkpoint.json` for `state`: `load()` at start, `run()` as a loop, `flush()` at stop."""

    def __init__(
        self,
        state_dir: str | Path,
        state: NodeState,
        interval: float = 0.5,
        *,
        stalled_after: float = STALLED_AFTER,
        write: Write = _write,
    ) -> None:
        self.path = Path(state_dir) / CHECKPOINT_NAME
        self.state = state
        self.interval = interval
        self.stalled_after = stalled_after
        self.write = write
        self.encoder = checkpoint.Encoder()  # re-encodes only the records changed since the last save
        self._saved_generation = -1
        self._last_error = ""
        self._writing: asyncio.Future[int] | None = None  # the write under way (one at a time)
        self._began = 0.0  # monotonic: when it began
        self._stall_said = False
        self._unsaved_since: float | None = None  # monotonic: the oldest change the file lacks

    def load(self) -> Records | None:
        """The saved records put into `state` (None: no usable checkpoint; the runtime will tell)."""
        try:
            loaded = checkpoint.load(self.path)
        except CheckpointError as exc:
            logger.warning("checkpoint unusable, rebuilding from the runtime: {}", exc)
            return None
        if loaded is not None:
            pods, containers = loaded
            self.state.replace_all(pods, containers)
            logger.info("checkpoint: {} pods, {} containers", len(pods), len(containers))
        return loaded

    def unsaved_seconds(self) -> float:
        """How long the checkpoint has lacked a change of the state (0: it holds them all)."""
        since = self._unsaved_since
        return 0.0 if since is None else time.monotonic() - since

    def describe(self) -> str:
        """One line for `ctl status`: whether the checkpoint holds the state, and if not, why."""
        behind = self.unsaved_seconds()
        took = time.monotonic() - self._began
        if self._writing is not None and not self._writing.done() and took >= self.stalled_after:
            return f"{behind:.0f} s behind: a write under way for {took:.0f} s (disk stalled?)"
        if self._last_error:
            return f"{behind:.0f} s behind: {self._last_error}"
        return "up to date" if behind == 0.0 else f"{behind:.1f} s behind (its write is due)"

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.save()

    async def flush(self, wait: float = STOP_WAIT) -> None:
        """At stop: the write under way (it may hold an older state), then one of the state now,
        within `wait` seconds in all; past it the write is left to its thread, and said."""
        deadline = time.monotonic() + wait
        if await self.save(deadline) and self.state.generation != self._saved_generation:
            await self.save(deadline)
        if self._writing is not None:
            logger.warning(
                "checkpoint {}: stopping without it, the write under way for {:.1f} s has not "
                "ended; the next start rebuilds what it lacks from the runtime",
                self.path,
                time.monotonic() - self._began,
            )

    async def save(self, deadline: float | None = None) -> bool:
        """Write when the state changed since the last write, or wait for the write under way.
        A failure is logged once, not raised: the proxy keeps working in memory. `deadline`
        (monotonic): return then even if the write has not ended. Whether no write is under way."""
        if self._writing is None:
            if self.state.generation == self._saved_generation:
                self._unsaved_since = None
                return True
            if self._unsaved_since is None:
                self._unsaved_since = time.monotonic()
            self._began, self._stall_said = time.monotonic(), False
            write = functools.partial(self.write, self.path, self.state, self.encoder)
            self._writing = asyncio.ensure_future(in_daemon_thread(write, name="checkpoint"))
        writing = self._writing
        while not writing.done():
            now = time.monotonic()
            stall = None if self._stall_said else self._began + self.stalled_after
            until = [t for t in (deadline, stall) if t is not None]
            await asyncio.wait({writing}, timeout=max(0.0, min(until) - now) if until else None)
            if writing.done():
                break
            now = time.monotonic()
            if not self._stall_said and now >= self._began + self.stalled_after:
                self._stall_said = True
                logger.warning(
                    "checkpoint {}: the write has not ended in {:.1f} s (is the disk stalled?); "
                    "working in memory meanwhile",
                    self.path,
                    now - self._began,
                )
            if deadline is not None and now >= deadline:
                return False
        self._writing = None
        self._ended(writing)
        return True

    def _ended(self, writing: asyncio.Future[int]) -> None:
        exc = writing.exception()
        if exc is not None:
            if not isinstance(exc, CheckpointError):
                raise exc
            if str(exc) != self._last_error:
                logger.error("checkpoint not written (working in memory): {}", exc)
                self._last_error = str(exc)
            return
        if self._stall_said:
            logger.info("checkpoint {} written after {:.1f} s", self.path, time.monotonic() - self._began)
        self._saved_generation = writing.result()
        self._last_error = ""
        # what changed after the write took its snapshot is unsaved since (at most) then
        self._unsaved_since = None if self._saved_generation == self.state.generation else self._began
