"""Blocking work awaited from the event loop in a daemon thread of its own.

Not the loop's default executor: a call that never returns (an API server that hangs, an fsync on
a stalled disk, which no signal interrupts) would hold the proxy's exit there, as the loop's
shutdown and the interpreter's both wait for every executor thread. A daemon thread is left
behind instead. Nothing here imports the rest of the package, so every layer may use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["in_daemon_thread"]

T = TypeVar("T")


async def in_daemon_thread(
    fn: Callable[[], T], on_orphan: Callable[[T], None] | None = None, name: str = "worker"
) -> T:
    """`fn()` in a new daemon thread named `name`, its result or exception awaited. Cancelling the
    await abandons the thread; its late result goes to `on_orphan` (to close what it opened)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def deliver(ok: bool, value: Any) -> None:
        if future.cancelled():
            if ok and on_orphan is not None:
                with contextlib.suppress(Exception):
                    on_orphan(value)
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def work() -> None:
        try:
            result: Any = fn()
            ok = True
        except BaseException as exc:
            result, ok = exc, False
        try:
            loop.call_soon_threadsafe(deliver, ok, result)
        except RuntimeError:  # the loop is gone
            if ok and on_orphan is not None:
                with contextlib.suppress(Exception):
                    on_orphan(result)

    threading.Thread(target=work, name=name, daemon=True).start()
    return await future
