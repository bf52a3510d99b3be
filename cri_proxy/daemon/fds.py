"""File descriptors: the limit raised to what the system allows, and a warning well before it is hit.

Each client connection costs the proxy two descriptors (the client's and its own to the runtime).
At the limit nothing says so by itself: uvloop closes a connection it cannot accept before the
proxy sees it, a checkpoint cannot be written, the kubelet state file cannot be read. So the start
raises the soft limit to the hard one (as every Go program does since Go 1.19, containerd
included: a shell's 1,024 is easily reached), and `FdWatch` looks every few seconds and says, once,
when the descriptors in use near the limit and when they are back.
"""

from __future__ import annotations

import asyncio
import errno
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass

from loguru import logger

WARN_AT = 0.9  # of the limit
CLEAR_AT = 0.8  # below this, a warned state is over (no line for each crossing back and forth)
EVERY = 2.0  # seconds between looks


def raise_limit() -> tuple[int, int] | None:
    """The soft RLIMIT_NOFILE raised to the hard one: (was, now), or None when nothing changed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == hard:
        return None  # nothing to raise (an infinite hard limit is not Linux's: nr_open bounds it)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        return None
    return soft, hard


def limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def count_open(fd_dir: str = "/proc/self/fd") -> int | None:
    """Descriptors open now (the listing's own not counted); the limit itself when the listing
    cannot be opened for want of one; None where there is no such directory."""
    try:
        return len(os.listdir(fd_dir)) - 1
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return limit()
        return None


@dataclass
class FdGauge:
    """Pure: fed (in use, limit), answers the line to log, if any. A warning once at `WARN_AT` of
    the limit; the all-clear once below `CLEAR_AT`; nothing in between."""

    warned: bool = False

    def feed(self, used: int, limit: int, connections: int | None = None) -> tuple[str, str] | None:
        if limit <= 0:
            return None
        who = f" ({connections:,} client connections)" if connections is not None else ""
        if not self.warned and used >= WARN_AT * limit:
            self.warned = True
            return "WARNING", (
                f"file descriptors: {used:,} of the limit {limit:,} in use{who}; at the limit new "
                "connections are closed unanswered and files cannot be opened (raise LimitNOFILE, "
                "or find the client that leaves connections open)"
            )
        if self.warned and used < CLEAR_AT * limit:
            self.warned = False
            return "INFO", f"file descriptors: {used:,} of the limit {limit:,} in use again{who}"
        return None


class FdWatch:
    """The supervised loop around `FdGauge`: counts in a worker thread (a listing of tens of
    thousands of entries is not the event loop's to wait for)."""

    def __init__(self, connections: Callable[[], int | None] = lambda: None, every: float = EVERY) -> None:
        self.gauge = FdGauge()
        self.connections = connections
        self.every = every

    async def look(self) -> None:
        used = await asyncio.to_thread(count_open)
        if used is None:
            return
        line = self.gauge.feed(used, limit(), self.connections())
        if line is not None:
            logger.log(line[0], "{}", line[1])

    async def run(self) -> None:
        while True:
            await self.look()
            await asyncio.sleep(self.every)
