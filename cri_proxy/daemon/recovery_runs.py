"""Driving recovery from the runtime: a short first try at start, then a supervised job until done.

Only a runtime that does not answer (a gRPC error, a socket error, a timeout) is "not ready yet"
and retried quietly with back-off; anything else is a fault, raised to the supervisor, which logs
it with its traceback, reports it in health and metrics, and restarts the job with back-off.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc.aio
from loguru import logger
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, stop_never, wait_exponential

NOT_ANSWERING = (grpc.aio.AioRpcError, OSError, TimeoutError)
"""What a runtime that is down or restarting raises."""


class RecoveryRuns:
    """`attempt()` learns everything the runtime has (raises when it cannot); `done` is set after
    the first one that completed."""

    def __init__(self, attempt: Callable[[], Awaitable[None]], endpoint: str) -> None:
        self.attempt = attempt
        self.endpoint = endpoint
        self.done = asyncio.Event()

    async def _retrying(self, give_up_after: float | None) -> None:
        async for attempt in AsyncRetrying(
            wait=wait_exponential(multiplier=0.2, max=5.0),
            retry=retry_if_exception_type(NOT_ANSWERING),
            stop=stop_after_delay(give_up_after) if give_up_after is not None else stop_never,
            before_sleep=self._not_yet,
            reraise=True,
        ):
            with attempt:
                await self.attempt()
        self.done.set()

    def _not_yet(self, state: object) -> None:
        outcome = getattr(state, "outcome", None)
        exc = outcome.exception() if outcome is not None else None
        logger.debug("recovery from runtime {} not done yet: {}", self.endpoint, _why(exc))

    async def first(self, give_up_after: float) -> bool:
        """At start: try for `give_up_after` seconds; False (never raises) when not done."""
        try:
            await self._retrying(give_up_after)
        except NOT_ANSWERING as exc:
            logger.warning("recovery from runtime {} not done yet: {}", self.endpoint, _why(exc))
            return False
        except Exception as exc:
            logger.opt(exception=exc).error("recovery from runtime {} failed: {}", self.endpoint, exc)
            return False
        return True

    async def until_done(self) -> None:
        """As a supervised job: retry a silent runtime forever; raise any other fault."""
        await self._retrying(None)


def _why(exc: BaseException | None) -> str:
    """One line: a gRPC error's repr spans five (status, details, debug string)."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc)
