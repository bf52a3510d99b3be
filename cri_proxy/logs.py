"""Log set-up with loguru: colour on a terminal, plain lines under journald, one-line JSON on request."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

from loguru import logger

from cri_proxy.logwriter import LineWriter


def _json_sink(message: Any) -> None:
    record = message.record
    line = {"time": record["time"].isoformat(), "level": record["level"].name, "msg": record["message"]}
    line.update({k: v for k, v in record["extra"].items() if isinstance(v, str | int | float | bool)})
    if record["exception"] is not None:
        line["exception"] = repr(record["exception"].value)
    stderr().put(json.dumps(line) + "\n")


def _say_dropped(count: int, first: float, last: float) -> None:
    when = time.strftime("%H:%M:%S", time.localtime(first))
    if int(last) != int(first):
        when += time.strftime("-%H:%M:%S", time.localtime(last))
    logger.warning("{} log lines dropped ({}): stderr did not take them (journald stalled?)", count, when)


_stderr: LineWriter | None = None


def stderr() -> LineWriter:
    """The one writer of log lines to stderr (`cri_proxy.logwriter`), made on first use."""
    global _stderr
    if _stderr is None:
        _stderr = LineWriter(2, say_dropped=_say_dropped)  # the fd: sys.stderr may be a test's stand-in
    return _stderr


def log_lines_dropped() -> int:
    """Log lines stderr did not take in time, since the start (a metric)."""
    return _stderr.dropped if _stderr is not None else 0


def drain_log(timeout: float = 5.0) -> None:
    """Before exit: give stderr up to `timeout` seconds to take the lines still held."""
    if _stderr is not None:
        _stderr.drain(timeout)


_debug = True  # until `setup_logging` says: another set-up (a test's sink) may want every level


def set_debug_enabled(enabled: bool) -> bool:
    """For a set-up of its own (a test's sinks), what `debug_enabled` answers; the last answer."""
    global _debug
    last, _debug = _debug, enabled
    return last


def debug_enabled() -> bool:
    """Whether DEBUG lines go anywhere (as `setup_logging` set the level): a line that costs even
    to put aside (a bound logger, a lazy record) is not made on a call's path when they do not."""
    return _debug


def soon(emit: Callable[..., object], *args: object) -> None:
    """`emit(*args)` once the event loop's current turn is done, its socket writes included: work
    no call waits on (a create's bookkeeping after its request went on). In order; with no running
    loop, at once."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        emit(*args)
        return
    loop.call_soon(emit, *args)


LINES_WAIT = 0.02
"""Seconds a line put off (`put_off`) waits at most. After a runtime's work the logging code is
cold (~0.2 ms for one line here, against ~0.015 ms warm): lines written together pay that once,
and not just as the caller's next call (often right after an answer) comes in."""
LINES_PUT_OFF = 256
"""Lines waiting at most: past it they are written at once."""


class _PutOff:
    """One event loop's lines put off, in order, and the timer that writes them."""

    def __init__(self) -> None:  # not the loop itself: the loop is the key it is kept under (weakly)
        self.lines: list[tuple[Callable[..., object], tuple[object, ...]]] = []
        self.timer: asyncio.TimerHandle | None = None

    def add(
        self, loop: asyncio.AbstractEventLoop, emit: Callable[..., object], args: tuple[object, ...]
    ) -> None:
        self.lines.append((emit, args))
        if len(self.lines) >= LINES_PUT_OFF:
            self.write()
        elif self.timer is None:
            self.timer = loop.call_later(LINES_WAIT, self.write)

    def write(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        lines, self.lines = self.lines, []
        for emit, args in lines:
            try:
                emit(*args)
            except Exception as exc:  # one line that cannot be written does not take the others along
                logger.opt(exception=exc).error("a log line could not be written: {}", exc)


_put_off: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _PutOff] = weakref.WeakKeyDictionary()


def put_off(emit: Callable[..., object], *args: object) -> None:
    """`emit(*args)` (a log call and its message) within `LINES_WAIT`, with the other lines put off
    meanwhile, in order: a line about a call must not delay that call nor the caller's next one.
    With no running loop, at once. `write_put_off` writes them now (at exit)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        emit(*args)
        return
    waiting = _put_off.get(loop)
    if waiting is None:
        waiting = _put_off[loop] = _PutOff()
    waiting.add(loop, emit, args)


def write_put_off() -> None:
    """Write the running loop's lines put off now (before the proxy exits; tests)."""
    try:
        waiting = _put_off.get(asyncio.get_running_loop())
    except RuntimeError:
        return
    if waiting is not None:
        waiting.write()


LIBRARY_LEVELS = {"": logging.WARNING, "urllib3": logging.ERROR}
"""What the libraries that log through `logging` may say. urllib3's warnings are the retries and
pool misses of the Kubernetes client, which the proxy says itself once, in its own words. Without
a handler of the proxy's, they were dropped until something installed `logging`'s default one (the
kubernetes client's first error does), then went to stderr as bare text, past the writer that
never blocks, every retry."""


class _ToLoguru(logging.Handler):
    """A `logging` record (urllib3, the kubernetes client, grpcio, asyncio) as one of the proxy's
    own lines: the same layout, level and writer, its logger (or module) named. A line its logger
    said last time too goes at DEBUG: the kubernetes client says a failing credential plugin at
    every try, and the proxy's own line already says the API is still unreachable."""

    def __init__(self) -> None:
        super().__init__()
        self.last: dict[str, str] = {}  # logger name -> its last message

    def emit(self, record: logging.LogRecord) -> None:
        try:
            name = record.module if record.name == "root" else record.name
            message = record.getMessage()
            level: str | int = "DEBUG"
            if self.last.get(name) != message:
                self.last[name] = message
                try:
                    level = logger.level(record.levelname).name
                except ValueError:
                    level = record.levelno
            logger.opt(exception=record.exc_info or None).log(level, "{}: {}", name, message)
        except Exception:  # as every logging handler: a bad record must not fail the library's call
            self.handleError(record)


def _route_library_logs() -> None:
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _ToLoguru)]:
        root.removeHandler(handler)
    root.addHandler(_ToLoguru())
    for name, limit in LIBRARY_LEVELS.items():
        logging.getLogger(name or None).setLevel(limit)


def setup_logging(level: str = "INFO", fmt: str = "auto") -> None:
    """`auto`: colour on a terminal; under journald (JOURNAL_STREAM set) plain lines without time
    or colour, journald adds its own; elsewhere plain lines with time. `json`: one JSON object a line."""
    global _debug
    logger.remove()
    _route_library_logs()
    level = level.upper()
    _debug = logger.level(level).no <= logger.level("DEBUG").no
    if fmt == "json":
        logger.add(_json_sink, level=level, backtrace=False, diagnose=False)
        return
    journald = fmt == "auto" and bool(os.environ.get("JOURNAL_STREAM"))
    tty = fmt == "auto" and sys.stderr.isatty()
    layout = "{level: <7} {message}" if journald else "{time:YYYY-MM-DD HH:mm:ss.SSS} {level: <7} {message}"
    logger.add(stderr().put, level=level, colorize=tty, backtrace=False, diagnose=False, format=layout)
