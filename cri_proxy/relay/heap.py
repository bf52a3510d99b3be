"""Freed memory given back to the system after a connection closes and leaves the heap grown.

After a client that made the proxy hold much at once (a flood of calls, a client that never reads)
has gone, nothing of what it cost is live, yet the proxy's RSS stayed 8 to 16 MiB up: the C heap
keeps freed blocks, and the interpreter's free lists keep some of its arenas in use. A full
collection (which empties those lists), then glibc's `malloc_trim` on a worker thread (ctypes lets
go of the interpreter lock), brought it back to within 3 MiB (the trim alone: 4 MiB of the 15).
What it cannot give back is the interpreter's own arenas (1 MiB each, kept whole while one object
in them lives): a few objects made during the flood and still alive pin some, more under CPU load
(0.5-9 MiB seen after floods of 60,000 calls; floods in a row level off under 10 MiB). Both
run only when the RSS, `WAIT` after a connection closed, is more than `SLACK` above where the last
trim left it, and at most once every `EVERY` seconds: a proxy whose clients come and go without
leaving anything behind never pays for it. In relay mode "grpc" the connections are grpcio's and
their ends are not seen: the RSS is looked at every `EVERY` seconds instead.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import os
from collections.abc import Callable

from loguru import logger

SLACK = 4 << 20  # RSS above the last trim's that calls for another
WAIT = 1.0  # seconds after a connection closed: what it held is freed by then
EVERY = 10.0  # seconds between two trims at least
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def malloc_trim() -> Callable[[], int] | None:
    """glibc's `malloc_trim(0)`, or None where the C library has none (musl)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def run() -> int:
        released: int = trim(0)
        return released

    return run


def rss_bytes() -> int:
    """This process's resident set (0 where /proc cannot tell)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


class HeapTrim:
    """Trims the heap after connections close, when the RSS says something is left to give back."""

    def __init__(
        self,
        trim: Callable[[], int] | None,
        rss: Callable[[], int] = rss_bytes,
        slack: int = SLACK,
        wait: float = WAIT,
        every: float = EVERY,
    ) -> None:
        self.trim = trim
        self.rss = rss
        self.slack = slack
        self.wait = wait
        self.every = every
        self.floor = rss()  # the RSS the last trim left (at first: the relay's start)
        self.last = float("-inf")  # loop time the last trim ended
        self.pending: asyncio.TimerHandle | asyncio.Future[int] | None = None
        self.trims = 0

    def look(self) -> None:
        """Something that held memory has ended (a connection closed; in relay mode "grpc", whose
        connections are grpcio's, every `EVERY` seconds): look at the RSS `wait` later, one look at
        a time."""
        if self.trim is None or self.pending is not None:
            return
        loop = asyncio.get_running_loop()
        self.pending = loop.call_at(max(loop.time() + self.wait, self.last + self.every), self._measure)

    def _measure(self) -> None:
        self.pending = None
        before = self.rss()
        self.floor = min(self.floor, before)  # what was given back on its own counts too
        if self.trim is None or before - self.floor <= self.slack:
            return
        gc.collect()  # a full collection also empties the free lists
        future = asyncio.get_running_loop().run_in_executor(None, self.trim)
        self.pending = future
        future.add_done_callback(lambda done: self._ended(done, before))

    def _ended(self, future: asyncio.Future[int], before: int) -> None:
        self.pending = None
        self.last = asyncio.get_running_loop().time()
        if future.cancelled():
            return
        if future.exception() is not None:
            logger.debug("heap trim failed: {}", future.exception())
            return
        self.trims += 1
        self.floor = self.rss()
        # rare (10 s apart at least, and only after a connection that left the heap grown): an
        # operator watching the RSS sees why it fell, and what stays (the interpreter's arenas
        # that a few live objects pin: the allocator keeps each one whole)
        logger.info(
            "heap trimmed: RSS {:.1f} -> {:.1f} MiB",
            before / 2**20,
            self.floor / 2**20,
        )

    def cancel(self) -> None:
        """Start nothing more (the relay stops); a trim already running ends on its own."""
        if isinstance(self.pending, asyncio.TimerHandle):
            self.pending.cancel()
        self.pending = None
        self.trim = None

    async def look_every(self, period: float = EVERY) -> None:
        """`look()` every `period` seconds, until cancelled: where no connection's end is seen."""
        while True:
            await asyncio.sleep(period)
            self.look()
