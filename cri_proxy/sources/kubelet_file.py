"""kubelet's `cpu_manager_state`, re-read when it changes; the last good contents are kept.

A cheap poll of (inode, size, mtime) instead of inotify: kubelet rewrites the file by rename, and
a poll also sees a file that appears, disappears or is replaced while the proxy was down.

The file is read in a daemon thread of its own, never on the event loop (a read from a disk that
stopped answering waits in the kernel: it must not hold the proxy's exit), and only when it is a
regular file of at most `MAX_BYTES`: it is opened non-blocking and checked with fstat before a
byte is read, so a FIFO, a device such as /dev/zero (also behind a symlink), a directory or a
runaway file becomes a reported problem instead of a frozen or bloated proxy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cri_proxy.cpu import KubeletState, Problem, ProblemKind, parse_kubelet_state_text
from cri_proxy.errors import KubeletStateError
from cri_proxy.files import read_small
from cri_proxy.threads import in_daemon_thread

MAX_BYTES = 1024 * 1024
"""1 MiB: a real file is a few KiB (a 256-CPU node with hundreds of pinned containers stays far below)."""

Signature = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class Missing:
    """No file: as if the kubelet had no static policy."""


@dataclass(frozen=True, slots=True)
class Unchanged:
    """Same inode, size and mtime as the last read."""


@dataclass(frozen=True, slots=True)
class Read:
    signature: Signature
    state: KubeletState


@dataclass(frozen=True, slots=True)
class Unusable:
    signature: Signature | None
    message: str


Outcome = Missing | Unchanged | Read | Unusable


def _signature(st: os.stat_result) -> Signature:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def load(path: Path, seen: Signature | None) -> Outcome:
    """One poll's I/O and parse, for a worker thread: touches nothing shared."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return Missing()
    except OSError as exc:
        return Unusable(None, f"cannot stat {path}: {exc.strerror}")
    signature = _signature(st)
    if signature == seen:
        return Unchanged()
    try:
        text = read_small(path, MAX_BYTES)
    except ValueError as exc:  # not a regular file, or too big: the message says which
        return Unusable(signature, str(exc))
    except OSError as exc:
        return Unusable(signature, f"cannot read {path}: {exc.strerror}")
    try:
        return Read(signature, parse_kubelet_state_text(text))
    except KubeletStateError as exc:
        return Unusable(signature, f"{path}: {exc}")


class KubeletStateFile:
    """`state`: the last good parse (None: no file). `problem`: why the current file is not used."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.state: KubeletState | None = None
        self.problem: Problem | None = None
        self._seen: Signature | None = None

    async def refresh(self) -> bool:
        """Re-read (in a daemon thread) when the file changed; True when `state` or `problem` changed."""
        seen = self._seen
        return self.take(await in_daemon_thread(lambda: load(self.path, seen), name="kubelet-state"))

    def take(self, outcome: Outcome) -> bool:
        """Apply one poll's outcome; True when `state` or `problem` changed."""
        if isinstance(outcome, Unchanged):
            return False
        if isinstance(outcome, Missing):
            changed = self._seen is not None or self.state is not None or self.problem is not None
            self._seen, self.state, self.problem = None, None, None
            return changed
        if isinstance(outcome, Unusable):
            self._seen = outcome.signature
            return self._bad(outcome.message)
        self._seen = outcome.signature
        changed = outcome.state != self.state or self.problem is not None
        self.state, self.problem = outcome.state, None
        return changed

    def _bad(self, message: str) -> bool:
        kept = " (last good contents kept)" if self.state is not None else ""
        problem = Problem(None, ProblemKind.BAD_KUBELET_STATE, message + kept)
        changed = problem != self.problem
        self.problem = problem
        return changed
