"""Log lines written to stderr by a thread of their own, through a bounded buffer.

Why: a write to stderr blocks once its pipe or socket is full, and under systemd stderr is a
stream to journald. A journald that stalls (a flood from another unit, a slow disk, a restart)
used to freeze the whole proxy at its next log line: every CRI call, `Version` included, hung
until journald read again (and a kubelet whose relists hang reports the node not ready). Now the
event loop only hands a line over; the thread waits on stderr. What stderr has not taken is held
up to `HELD_BYTES`; lines past that are dropped, counted (`dropped`, a metric), and named in one
warning once stderr takes lines again. Nothing that serves a call ever waits on the log.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import threading
import time
from collections.abc import Callable

HELD_BYTES = 1 << 20
"""Bytes of lines stderr has not taken yet, at most (~7,000 lines of ~150 bytes)."""


class LineWriter:
    """`put(line)` never blocks; a daemon thread writes the lines to `fd` in order.

    `say_dropped(count, first, last)` is called on the writer's thread, with the wall-clock times
    of the first and last line dropped, once the lines after a gap have been written: the
    caller logs it (through the same format as every line). `drain(timeout)` waits for what is
    held to be written (at exit)."""

    def __init__(
        self,
        fd: int = 2,
        held_bytes: int = HELD_BYTES,
        say_dropped: Callable[[int, float, float], None] | None = None,
    ) -> None:
        self.fd = fd
        self.held_bytes = held_bytes
        self.say_dropped = say_dropped
        self.dropped = 0  # lines dropped since the start, for the metric
        self.broken: str | None = None  # why stderr takes nothing any more (closed), once it is so
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # lines came, or a batch was written
        self._lines: list[str] = []
        self._held = 0  # bytes put and not yet written (the batch being written included)
        self._gap = 0  # lines dropped since the last warning about it
        self._gap_times = (0.0, 0.0)
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def held(self) -> int:
        return self._held

    def put(self, line: str) -> None:
        """Hand `line` (one or more whole lines) over to be written; drop it when too much is held."""
        if type(line) is not str:  # loguru's Message: keep the text, not the record it carries
            line = str(line)
        size = len(line)  # characters: a bound on memory, close enough to the bytes written
        with self._lock:
            if self._held + size > self.held_bytes or self.broken is not None:
                self.dropped += 1
                now = time.time()
                self._gap_times = (now if not self._gap else self._gap_times[0], now)
                self._gap += 1
                return
            self._held += size
            self._lines.append(line)
            if len(self._lines) == 1:  # the writer sleeps only when there was nothing to write
                self._changed.notify_all()
        if self._thread is None:
            self._start()

    def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for every line held to be written; whether they were."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._held:  # (a closed stderr's batch is let go at once: not waited out)
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def close(self) -> None:
        """Let the thread end once what is held is written (tests: one writer per example)."""
        with self._lock:
            self._closed = True
            self._changed.notify_all()

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._lines:
                    if self._closed:
                        return
                    self._changed.wait()
                lines, self._lines = self._lines, []
            size = sum(len(line) for line in lines)
            written = self._write("".join(lines).encode("utf-8", "replace"))
            with self._lock:
                self._held -= size
                if not written:
                    self.dropped += len(lines)
                gap, self._gap = self._gap, 0
                first, last = self._gap_times
                self._changed.notify_all()
            if gap and self.say_dropped is not None and self.broken is None:
                with contextlib.suppress(Exception):  # the writer outlives a notice that failed
                    self.say_dropped(gap, first, last)

    def _write(self, data: bytes) -> bool:
        """Write all of `data`, waiting as long as stderr takes; False once it never will."""
        view = memoryview(data)
        while view:
            if self.broken is not None:
                return False
            try:
                view = view[os.write(self.fd, view) :]
            except BlockingIOError:  # a non-blocking stderr we were handed: wait until it takes more
                poll = select.poll()
                poll.register(self.fd, select.POLLOUT)
                poll.poll(1000)
            except OSError as exc:  # EPIPE, EBADF: nothing will ever be read from it again
                self.broken = errno.errorcode.get(exc.errno or 0, str(exc))
        return True
