"""A task's own cancel, told apart from a CancelledError it was merely handed.

grpc.aio raises CancelledError in the caller when the channel is closed under the call, and a
future cancelled by another party raises it in whoever awaits it. Neither means the awaiting task
is being stopped: taken as a stop, it ends a supervised loop unseen or leaves a call unanswered.
"""

from __future__ import annotations

import asyncio


def cancelled_from_outside() -> bool:
    """The running task was asked to stop (its `cancel()`). False outside any task: a coroutine
    stepped in a callback (`relay.inline`) has no cancel of its own."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def why(exc: BaseException) -> str:
    """An exception for a log line or a status message: a bare CancelledError says what it was."""
    if isinstance(exc, asyncio.CancelledError):
        return "a call under it was cancelled"
    return str(exc) or type(exc).__name__
