"""What every thread and every asyncio task is doing, as text: `kill -USR1` on the proxy.

Why: containerd answers SIGUSR1 with its goroutines' stacks, and an operator chasing a node that
hangs sends it to each daemon on the path. Without a handler, SIGUSR1 ends a Python process: the
proxy (and every call in flight) would go. Bounded: a node's proxy has some tens of tasks, but
a dump must not become a megabyte of log, so past `TASKS_SHOWN` tasks are only counted by what
they run.
"""

from __future__ import annotations

import asyncio
import io
import sys
import threading
from collections import Counter
from types import FrameType

TASKS_SHOWN = 100
"""Tasks whose stacks are written out; the rest are counted by coroutine."""
FRAMES_SHOWN = 12
"""Innermost frames written per thread or task."""


def stacks_text(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """Every thread's stack and the stacks of the tasks of `loop` (the running one by default)."""
    out = io.StringIO()
    frames = sys._current_frames()  # documented in `sys`; how faulthandler-like dumps are made
    names = {t.ident: t.name for t in threading.enumerate()}
    tasks = sorted(asyncio.all_tasks(loop), key=_order)
    out.write(f"=== stacks (SIGUSR1): {len(frames)} threads, {len(tasks)} asyncio tasks ===\n")
    for ident, frame in frames.items():
        out.write(f"--- thread {names.get(ident, '?')} ({ident})\n")
        out.writelines(_lines(_outward(frame)))
    for task in tasks[:TASKS_SHOWN]:
        state = "done" if task.done() else "pending"
        out.write(f"--- task {task.get_name()} ({_coro_name(task)}), {state}\n")
        out.writelines(_lines(_awaiting(task.get_coro())[::-1]))
    rest = Counter(_coro_name(task) for task in tasks[TASKS_SHOWN:])
    if rest:
        counts = ", ".join(f"{name} x{n}" for name, n in rest.most_common())
        out.write(f"--- {sum(rest.values())} more tasks, not shown: {counts}\n")
    out.write("=== end of stacks ===")
    return out.getvalue()


def _outward(frame: FrameType | None) -> list[FrameType]:
    """The innermost `FRAMES_SHOWN` frames of a thread, innermost first."""
    found: list[FrameType] = []
    while frame is not None and len(found) < FRAMES_SHOWN:
        found.append(frame)
        frame = frame.f_back
    return found


def _awaiting(coro: object) -> list[FrameType]:
    """A task's frames down the chain of what each awaits, outermost first (`Task.get_stack`
    gives only the outermost: a suspended coroutine's frame has no `f_back`)."""
    found: list[FrameType] = []
    while coro is not None and len(found) < FRAMES_SHOWN:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        found.append(frame)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return found


def _lines(innermost_first: list[FrameType]) -> list[str]:
    """One line a frame, innermost last as in a traceback; no source text (read from disk, and
    a frame's line may be unknown: `asyncio.Task.print_stack` fails on such a frame)."""
    out = []
    for f in reversed(innermost_first):
        line = f.f_lineno if f.f_lineno is not None else "?"
        out.append(f"  {f.f_code.co_filename}:{line} in {f.f_code.co_qualname}\n")
    return out


def _order(task: asyncio.Task[object]) -> tuple[int, int, str]:
    """Named tasks first (the proxy's loops: what one looks for), then the rest as created."""
    name = task.get_name()
    number = name.removeprefix("Task-")
    return (1, int(number), "") if number.isdigit() and number != name else (0, 0, name)


def _coro_name(task: asyncio.Task[object]) -> str:
    coro = task.get_coro()
    return getattr(coro, "__qualname__", type(coro).__name__)
