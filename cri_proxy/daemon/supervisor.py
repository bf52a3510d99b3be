"""One owner for every background task: started by name, restarted with back-off when it fails,
reported (health, metrics, a log line with the traceback), and stopped together.

Two kinds of work: a *loop* (reconciler, watches, checkpoint keeper, runtime probe) runs for the
life of the proxy, so returning is as wrong as raising and both restart it; a *job* (recovery,
a reload) runs until it completes, and only raising restarts it. Before this, a task that raised
died with nobody told, and recovery retried any exception in silence, "not ready" forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from loguru import logger

from cri_proxy.cancels import cancelled_from_outside

Work = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before restart n (1-based): first * factor**(n-1), at most `most`. A task that ran
    fine for `healthy_after` seconds starts again from `first`."""

    first: float = 0.5
    factor: float = 2.0
    most: float = 30.0
    healthy_after: float = 60.0

    def delay(self, failures: int) -> float:
        return min(self.most, self.first * self.factor ** max(0, failures - 1))


@dataclass(slots=True)
class TaskStatus:
    """What health and metrics say about one task."""

    name: str
    loop: bool
    up: bool = True
    restarts: int = 0
    last_error: str = ""
    retry_at: float | None = None  # monotonic time of the next start while it is down


@dataclass(slots=True)
class _Entry:
    status: TaskStatus
    task: asyncio.Task[None] | None = None
    failures: int = 0  # in a row, for the back-off
    done: asyncio.Event = field(default_factory=asyncio.Event)


class Supervisor:
    """Runs named loops and jobs; `stop()` cancels them all and waits for each."""

    def __init__(self, backoff: Backoff | None = None) -> None:
        self.backoff = backoff or Backoff()
        self._entries: dict[str, _Entry] = {}
        self._stopping = False

    # -- starting ---------------------------------------------------------------------------
    def loop(self, name: str, work: Work) -> None:
        """Run `work` for the life of the proxy; restart it whenever it raises or returns."""
        self._start(name, work, loop=True)

    def job(self, name: str, work: Work) -> None:
        """Run `work` until it completes; restart it when it raises. A job of the same name still
        running is left alone (one reload or one recovery at a time)."""
        entry = self._entries.get(name)
        if entry is not None and entry.task is not None and not entry.task.done():
            return
        self._start(name, work, loop=False)

    def _start(self, name: str, work: Work, loop: bool) -> None:
        if self._stopping:
            return
        entry = self._entries.get(name)
        if entry is not None and entry.task is not None and not entry.task.done():
            raise ValueError(f"background task {name!r} is already running")
        entry = _Entry(TaskStatus(name, loop))
        self._entries[name] = entry
        entry.task = asyncio.get_running_loop().create_task(self._run(entry, work), name=f"cri-proxy {name}")

    async def _run(self, entry: _Entry, work: Work) -> None:
        status = entry.status
        while True:
            started = time.monotonic()
            status.up, status.retry_at = True, None
            failed: BaseException | None
            try:
                await work()
            except asyncio.CancelledError as exc:
                if cancelled_from_outside():
                    raise
                # not this task's cancel: a call cancelled under it (grpc.aio raises CancelledError
                # in the caller when its channel is closed), which would end the task unseen
                status.last_error = "CancelledError: cancelled from within (not stopped)"
                failed = exc
            except Exception as exc:  # anything: a bug in a loop must not end the loop for good
                status.last_error = f"{type(exc).__name__}: {exc}"
                failed = exc
            else:
                if not status.loop:
                    entry.done.set()
                    return
                status.last_error = "returned (a loop must run until stopped)"
                failed = None
            if self._stopping:  # the proxy closes what the tasks use before it cancels them
                logger.debug("background {!r} ended while stopping: {}", status.name, status.last_error)
                entry.done.set()
                return
            if time.monotonic() - started >= self.backoff.healthy_after:
                entry.failures = 0
            entry.failures += 1
            delay = self.backoff.delay(entry.failures)
            status.up, status.restarts = False, status.restarts + 1
            status.retry_at = time.monotonic() + delay
            logger.opt(exception=failed).error(
                "background {} {!r} failed: {}; restarting in {:.1f} s (restart {})",
                "loop" if status.loop else "job",
                status.name,
                status.last_error,
                delay,
                status.restarts,
            )
            await asyncio.sleep(delay)

    # -- reporting --------------------------------------------------------------------------
    def statuses(self) -> list[TaskStatus]:
        """Every task started, finished jobs excluded, by name."""
        return [e.status for _, e in sorted(self._entries.items()) if not e.done.is_set()]

    def restarts(self) -> dict[str, int]:
        """Restarts so far by task name (finished jobs included): the metric's counter."""
        return {name: e.status.restarts for name, e in sorted(self._entries.items())}

    def down(self) -> list[TaskStatus]:
        return [s for s in self.statuses() if not s.up]

    def health(self) -> tuple[bool, str]:
        """For /healthz: not healthy while any task waits to be restarted after a failure."""
        down = self.down()
        if not down:
            return True, "ok"
        now = time.monotonic()
        return False, "; ".join(
            f"background {s.name} failed ({s.last_error}), restart {s.restarts} in "
            f"{max(0.0, (s.retry_at or now) - now):.1f} s"
            for s in down
        )

    # -- stopping ---------------------------------------------------------------------------
    def stopping(self) -> None:
        """The proxy begins to stop: a task that ends from now on (a call under it ended by the
        stop: the runtime gone with it, a socket closed) is not a failure, nor restarted, nor
        logged as an error; nothing new starts."""
        self._stopping = True

    async def stop(self) -> None:
        """Cancel every task and wait for each to end: nothing is left pending."""
        self._stopping = True
        tasks = [e.task for e in self._entries.values() if e.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
