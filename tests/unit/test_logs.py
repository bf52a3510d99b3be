"""Log set-up: whether DEBUG lines go anywhere follows the level `setup_logging` was given (a
create's debug line is not even put together on its call's path otherwise)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from loguru import logger

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
