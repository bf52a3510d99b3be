"""Log set-up: whether DEBUG lines go anywhere follows the level `setup_logging` was given (a
create's debug line is not even put together on its call's path otherwise)."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Iterator

import pytest
from loguru import logger

from cri_proxy import logs
from cri_proxy.logs import debug_enabled, setup_logging


@pytest.fixture
def restored() -> Iterator[None]:
    yield
    setup_logging("DEBUG")  # DEBUG lines wanted again, as before any set-up
    logger.remove()
    logger.add(sys.stderr)  # loguru's own default sink, as the other tests had it


@pytest.mark.parametrize(
    ("level", "wanted"), [("TRACE", True), ("debug", True), ("INFO", False), ("WARNING", False)]
)
def test_debug_lines_are_wanted_only_at_debug_or_below(restored: None, level: str, wanted: bool) -> None:
    setup_logging(level)
    assert debug_enabled() is wanted


def test_lines_put_off_come_in_order_within_their_wait_and_none_is_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`put_off`: lines are written together, in the order they were put off, once LINES_WAIT has
    passed since the first (not per line: a steady stream still gets written); at LINES_PUT_OFF
    waiting they go at once; one that cannot be written does not keep the others back;
    `write_put_off` writes them now; with no running loop, at once."""
    monkeypatch.setattr(logs, "LINES_PUT_OFF", 4)
    written: list[tuple[str, float]] = []
    errors: list[str] = []
    sink = logger.add(lambda m: errors.append(m.record["message"]), level="ERROR", format="{message}")

    def emit(text: str) -> None:
        if text == "bad":
            raise ValueError("no way")
        written.append((text, time.monotonic()))

    async def main() -> None:
        first = time.monotonic()
        logs.put_off(emit, "a")
        for text in ("b", "bad"):
            await asyncio.sleep(logs.LINES_WAIT / 4)
            logs.put_off(emit, text)
        assert written == []  # none yet: they wait together
        for _ in range(100):
            if written:
                break
            await asyncio.sleep(logs.LINES_WAIT / 4)
        assert [t for t, _ in written] == ["a", "b"]
        assert first + logs.LINES_WAIT <= written[0][1] < first + 1.0  # the wait runs from the first
        assert errors == ["a log line could not be written: no way"]
        written.clear()
        for text in ("c", "d", "e", "f"):  # LINES_PUT_OFF: written at once
            logs.put_off(emit, text)
        assert [t for t, _ in written] == ["c", "d", "e", "f"]
        logs.put_off(emit, "g")
        logs.write_put_off()
        assert [t for t, _ in written][-1] == "g"
        await asyncio.sleep(logs.LINES_WAIT * 2)  # the timer was stopped: nothing twice
        assert [t for t, _ in written] == ["c", "d", "e", "f", "g"]

    try:
        asyncio.run(main())
    finally:
        logger.remove(sink)
    logs.put_off(emit, "h")  # no running loop
    assert written[-1][0] == "h"


def test_library_lines_are_the_proxys_own_lines_and_urllib3_retries_are_left_to_it(restored: None) -> None:
    """urllib3, grpcio, asyncio and the kubernetes client log through `logging`; with no handler
    their warnings went to stderr as bare text past the writer that never blocks, and urllib3 said
    every retry of the Kubernetes client that the proxy says once itself."""
    setup_logging("DEBUG")
    lines: list[tuple[str, str]] = []
    sink = logger.add(lambda m: lines.append((m.record["level"].name, m.record["message"])), level="DEBUG")
    try:
        logging.getLogger("grpc._server").warning("a %s went wrong", "thing")
        logging.getLogger("grpc._server").warning("a %s went wrong", "thing")  # again: at DEBUG
        logging.getLogger("asyncio").error("Task exception was never retrieved")
        logging.getLogger("some.lib").info("chatter")  # libraries: warnings and up only
        logging.getLogger("urllib3.connectionpool").warning("Retrying (Retry(total=0)) after ...")
    finally:
        logger.remove(sink)
    assert lines == [
        ("WARNING", "grpc._server: a thing went wrong"),
        ("DEBUG", "grpc._server: a thing went wrong"),
        ("ERROR", "asyncio: Task exception was never retrieved"),
    ]
    setup_logging("INFO")  # again (a reload): still one route, not two
    assert sum(type(h).__name__ == "_ToLoguru" for h in logging.getLogger().handlers) == 1


def test_a_library_record_that_does_not_format_fails_no_call(
    restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library's bad format string goes to `logging`'s own error path, as with every handler,
    instead of raising into the library's call (a grpcio or urllib3 thread)."""
    setup_logging("INFO")
    monkeypatch.setattr(logging, "raiseExceptions", False)
    (route,) = [h for h in logging.getLogger().handlers if type(h).__name__ == "_ToLoguru"]
    record = logging.LogRecord("some.lib", logging.WARNING, __file__, 1, "bad %d format", ("x",), None)
    route.handle(record)  # no TypeError
