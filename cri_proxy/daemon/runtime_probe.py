"""Is the runtime answering? A Version call every few seconds, for health and for outage recovery."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import grpc.aio
from loguru import logger

VERSION = "/runtime.v1.RuntimeService/Version"


class RuntimeProbe:
    """`up`: the last answer. `on_back()` is called when the runtime answers again after an outage."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        endpoint: str,
        on_back: Callable[[], None],
        period_up: float = 2.0,
        period_down: float = 0.5,
    ) -> None:
        self.endpoint = endpoint
        self.on_back = on_back
        self.period_up, self.period_down = period_up, period_down
        self.up = False
        self._seen_down = False
        self._version = channel.unary_unary(VERSION, None, None)

    async def check(self) -> bool:
        try:
            await self._version(b"", timeout=2.0)
            return True
        except grpc.aio.AioRpcError as exc:
            return exc.code() is grpc.StatusCode.UNIMPLEMENTED  # a v1alpha2-only runtime still answers

    async def run(self) -> None:
        while True:
            up = await self.check()
            if up != self.up:
                self.up = up
                level = "INFO" if up else "WARNING"
                logger.log(level, "runtime {} is {}", self.endpoint, "up" if up else "not answering")
                if up and self._seen_down:
                    self.on_back()
                self._seen_down = self._seen_down or not up
            await asyncio.sleep(self.period_up if up else self.period_down)
