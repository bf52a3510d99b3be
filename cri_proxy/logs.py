"""Log set-up with loguru: colour on a terminal, plain lines under journald, one-line JSON on request."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from loguru import logger


def _json_sink(message: Any) -> None:
    record = message.record
    line = {"time": record["time"].isoformat(), "level": record["level"].name, "msg": record["message"]}
    line.update({k: v for k, v in record["extra"].items() if isinstance(v, str | int | float | bool)})
    if record["exception"] is not None:
        line["exception"] = repr(record["exception"].value)
    sys.stderr.write(json.dumps(line) + "\n")


_debug = True  # until `setup_logging` says: another set-up (a test's sink) may want every level


def debug_enabled() -> bool:
    """Whether DEBUG lines go anywhere (as `setup_logging` set the level): a line that costs even
    to put aside (a bound logger, a lazy record) is not made on a call's path when they do not."""
    return _debug


def soon(emit: Callable[..., object], *args: object) -> None:
    """`emit(*args)` (a log call and its message) once the event loop's current turn is done, its
    socket writes included: a line about a call (formatted, then written to journald) must not
    delay the call it is about. Lines put off this way keep their order; with no running loop, at
    once."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        emit(*args)
        return
    loop.call_soon(emit, *args)


def setup_logging(level: str = "INFO", fmt: str = "auto") -> None:
    """`auto`: colour on a terminal; under journald (JOURNAL_STREAM set) plain lines without time
    or colour, journald adds its own; elsewhere plain lines with time. `json`: one JSON object a line."""
    global _debug
    logger.remove()
    level = level.upper()
    _debug = logger.level(level).no <= logger.level("DEBUG").no
    if fmt == "json":
        logger.add(_json_sink, level=level, backtrace=False, diagnose=False)
        return
    journald = fmt == "auto" and bool(os.environ.get("JOURNAL_STREAM"))
    tty = fmt == "auto" and sys.stderr.isatty()
    layout = "{level: <7} {message}" if journald else "{time:YYYY-MM-DD HH:mm:ss.SSS} {level: <7} {message}"
    logger.add(sys.stderr, level=level, colorize=tty, backtrace=False, diagnose=False, format=layout)
