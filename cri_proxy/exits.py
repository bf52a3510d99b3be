"""The process's exit, past the daemon threads it leaves behind (`cri_proxy.threads`: blocking
work on a disk or an API that may never answer; `ctl`'s stdin pumps). Imports nothing heavy: the
console script calls it after every command."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import NoReturn


def exit_process(code: int) -> NoReturn:
    """Exit with `code`; while a daemon thread still runs, at once, past the interpreter's
    finalization (standard streams flushed first).

    Python before 3.14 ends a daemon thread that wakes up during finalization (its API answer,
    its disk or its stdin came back just then) with `pthread_exit`, and glibc's unwinding of that
    thread's stack can end in `abort()`: a clean stop then exited by SIGABRT, with a core dump,
    and systemd marked the unit failed. Nothing is left for finalization to do by then: the
    state is written and the log drained before."""
    if any(t.daemon and t.is_alive() for t in threading.enumerate()):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    sys.exit(code)
