"""Running `cri-proxy` as a real process in tests: start it, wait for its socket, wait for a state."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CLI = str(Path(sys.executable).parent / "cri-proxy")


def wait_until(predicate: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll `predicate` every 50 ms; fail the test naming `what` when it stays false."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def socket_answers(path: Path) -> bool:
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def wait_for_socket(path: Path, proc: subprocess.Popen[Any], timeout: float = 15) -> None:
    """Until a server answers on `path`; fail at once if `proc` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"process exited early: {proc.communicate()}")
        if socket_answers(path):
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never answered")
