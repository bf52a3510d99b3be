"""kubelet's `cpu_manager_state`, re-read when it changes; the last good contents are kept.

A cheap poll of (inode, size, mtime) instead of inotify: kubelet rewrites the file by rename, and
a poll also sees a file that appears, disappears or is replaced while the proxy was down.
"""

from __future__ import annotations

import os
from pathlib import Path

from cri_proxy.cpu import KubeletState, Problem, ProblemKind, parse_kubelet_state_text
from cri_proxy.errors import KubeletStateError

MAX_BYTES = 4 * 1024 * 1024  # a real file is a few KiB; never read a runaway one whole


class KubeletStateFile:
    """`state`: the last good parse (None: no file). `problem`: why the current file is not used."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.state: KubeletState | None = None
        self.problem: Problem | None = None
        self._seen: tuple[int, int, int] | None = None

    def poll(self) -> bool:
        """Re-read when the file changed; True when `state` or `problem` changed."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            changed = self._seen is not None or self.state is not None or self.problem is not None
            self._seen, self.state, self.problem = None, None, None  # missing: as if no static policy
            return changed
        except OSError as exc:
            return self._bad(f"cannot stat {self.path}: {exc.strerror}")
        signature = (st.st_ino, st.st_size, st.st_mtime_ns)
        if signature == self._seen:
            return False
        self._seen = signature
        if st.st_size > MAX_BYTES:
            return self._bad(f"{self.path} is {st.st_size} bytes, more than {MAX_BYTES}")
        try:
            text = self.path.read_bytes()
        except OSError as exc:
            return self._bad(f"cannot read {self.path}: {exc.strerror}")
        try:
            state = parse_kubelet_state_text(text)
        except KubeletStateError as exc:
            return self._bad(f"{self.path}: {exc}")
        changed = state != self.state or self.problem is not None
        self.state, self.problem = state, None
        return changed

    def _bad(self, message: str) -> bool:
        kept = " (last good contents kept)" if self.state is not None else ""
        problem = Problem(None, ProblemKind.BAD_KUBELET_STATE, message + kept)
        changed = problem != self.problem
        self.problem = problem
        return changed
