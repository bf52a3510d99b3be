"""Log set-up with loguru: human lines on a terminal, plain lines elsewhere."""

from __future__ import annotations

import sys

from loguru import logger


def setup_logging(level: str = "INFO") -> None:
    logger.remove()
    logger.add(
        sys.stderr,
        level=level.upper(),
        colorize=sys.stderr.isatty(),
        backtrace=False,
        diagnose=False,
        format="{time:YYYY-MM-DD HH:mm:ss.SSS} {level: <7} {message}",
    )
