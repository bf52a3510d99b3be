"""Run a coroutine at once, up to its first wait: a hook that never waits needs no task.

A task starts on a later loop turn, behind whatever else is ready then (another call, a reconcile
pass), and costs its creation: a pre hook that decides from memory pays that on every hooked call.
`start` runs the coroutine in the caller's turn; only if it waits does a task go on with it, and a
cancel of that task reaches the coroutine even before the task's first step (so a hook's clean-up
on cancel runs). Python 3.12+ does this with an eagerly started task (code run before the first
wait then sees itself inside a task, as `asyncio.timeout` needs); on 3.11 the coroutine is stepped
here (3.11's `asyncio.wait_for`, which the hooks use, needs no current task).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

EAGER = sys.version_info >= (3, 12)
_FIRST_GIVEN = object()


@dataclass(frozen=True, slots=True)
class Finished(Generic[T]):
    """The coroutine ended without waiting: its result."""

    value: T


def start(coro: Coroutine[Any, Any, T]) -> Finished[T] | asyncio.Future[T]:
    """Run `coro` now up to its first wait: Finished when it ended there (an exception it raised
    there propagates, on 3.11), else the task that goes on with it."""
    if EAGER:
        # the loop given, not left to the task to find: 3.12 and 3.13 up to their fix of CPython
        # gh-154695 fail an eager task made without one ("'NoneType' object has no attribute
        # 'is_running'"), before the coroutine's first step
        eager: dict[str, Any] = {"eager_start": True, "loop": asyncio.get_running_loop()}
        task: asyncio.Task[T] = asyncio.Task(coro, **eager)
        if task.done() and not task.cancelled() and task.exception() is None:
            return Finished(task.result())
        return task
    try:
        waiting = coro.send(None)
    except StopIteration as stop:
        return Finished(stop.value)
    return asyncio.ensure_future(_Rest(coro, waiting))


class _Rest(Coroutine[Any, Any, T]):
    """A coroutine already stepped once (it waits on `waiting`), for a task to drive on: the task's
    first step gets what it waits on; everything after goes straight to the coroutine."""

    def __init__(self, coro: Coroutine[Any, Any, T], waiting: Any) -> None:
        self.coro = coro
        self.waiting = waiting

    def send(self, value: Any) -> Any:
        waiting, self.waiting = self.waiting, _FIRST_GIVEN
        if waiting is not _FIRST_GIVEN:
            return waiting
        return self.coro.send(value)

    def throw(self, *args: Any) -> Any:
        self.waiting = _FIRST_GIVEN
        return self.coro.throw(*args)

    def close(self) -> None:
        self.coro.close()

    def __await__(self) -> Generator[Any, Any, T]:
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            try:
                waiting = self.throw(thrown) if thrown is not None else self.send(sent)
            except StopIteration as stop:
                result: T = stop.value
                return result
            thrown = None
            try:
                sent = yield waiting
            except BaseException as exc:  # a cancel: into the coroutine, which may go on waiting
                thrown = exc
