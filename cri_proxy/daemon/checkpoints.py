"""Keeping the checkpoint: loaded once at start, written (off the event loop) whenever state changed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from loguru import logger

from cri_proxy.errors import CheckpointError
from cri_proxy.state import checkpoint
from cri_proxy.state.checkpoint import Records
from cri_proxy.state.model import NodeState

CHECKPOINT_NAME = "checkpoint.json"


class CheckpointKeeper:
    """`<state_dir>/checkpoint.json` for `state`: `load()` at start, `run()` as a loop, `save()` at stop."""

    def __init__(self, state_dir: str | Path, state: NodeState, interval: float = 0.5) -> None:
        self.path = Path(state_dir) / CHECKPOINT_NAME
        self.state = state
        self.interval = interval
        self.encoder = checkpoint.Encoder()  # re-encodes only the records changed since the last save
        self._saved_generation = -1
        self._last_error = ""

    def load(self) -> Records | None:
        """The saved records put into `state` (None: no usable checkpoint; the runtime will tell)."""
        try:
            loaded = checkpoint.load(self.path)
        except CheckpointError as exc:
            logger.warning("checkpoint unusable, rebuilding from the runtime: {}", exc)
            return None
        if loaded is not None:
            pods, containers = loaded
            self.state.replace_all(pods, containers)
            logger.info("checkpoint: {} pods, {} containers", len(pods), len(containers))
        return loaded

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.save()

    async def save(self) -> None:
        """Write when the state changed since the last write; a failure is logged once, not raised:
        the proxy keeps working in memory."""
        generation = self.state.generation
        if generation == self._saved_generation:
            return
        try:
            await asyncio.to_thread(checkpoint.save, self.path, self.state, encoder=self.encoder)
        except CheckpointError as exc:
            if str(exc) != self._last_error:
                logger.error("checkpoint not written (working in memory): {}", exc)
                self._last_error = str(exc)
            return
        self._saved_generation = generation
        self._last_error = ""
