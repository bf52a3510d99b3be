"""Polling kubelet's CPU manager state file: read off the event loop, a change or problem told once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from loguru import logger

from cri_proxy.config import Config
from cri_proxy.sources.kubelet_file import KubeletStateFile


class KubeletWatch:
    def __init__(
        self, file: KubeletStateFile, settings: Callable[[], Config], changed: Callable[[], None]
    ) -> None:
        self.file = file
        self.settings = settings
        self.changed = changed

    async def refresh(self) -> None:
        if await self.file.refresh():
            if self.file.problem is not None:
                logger.warning("{}", self.file.problem.message)
            else:
                logger.info("kubelet state file {} read", self.file.path)
            self.changed()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.settings().kubelet_poll_seconds)
            await self.refresh()
