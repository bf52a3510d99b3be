"""One proxy per state directory: an flock held for the life of the process."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from cri_proxy.errors import StateLockedError


class StateDirLock:
    """Exclusive lock on `<state_dir>/lock`; a second proxy on the same directory refuses to start."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / "lock"
        self._fd: int | None = None

    def acquire(self) -> str | None:
        """Take the lock; raise when another proxy holds it. A directory that cannot be written is
        not fatal (the proxy then works in memory): the reason is returned for the log."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            return f"cannot lock {self.path}: {exc.strerror}"
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateLockedError(f"another cri-proxy holds {self.path}; refusing to start") from None
        self._fd = fd
        return None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
