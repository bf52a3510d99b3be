"""Stamps of a relay's reads and writes, for `bench/create_path.py`.

Each read (side, ns in, ns out, size) and each write (side, ns: when its bytes are taken for the
socket) is kept, on CLOCK_MONOTONIC (`time.perf_counter_ns`), the clock the bench's client times
its calls on; the bench places them by its calls' times. Written to `path` as JSON every two
seconds while it grows (the bench's relays carry a few thousand calls at most).
"""

from __future__ import annotations

import json
import threading
import time


class Recorder:
    def __init__(self, path: str) -> None:
        self.path = path
        self.rows: list[tuple[str, int, int, int]] = []
        threading.Thread(target=self._dump_loop, daemon=True).start()

    def read(self, side: str, size: int, t0: int, t1: int) -> None:
        """A read from the client ("c") or the runtime ("r"), from its start to its end."""
        self.rows.append((side, t0, t1, size))

    def wrote(self, side: str, t: int) -> None:
        """Bytes taken for the runtime's socket ("wr") or the client's ("wc")."""
        self.rows.append((side, t, t, 0))

    def dump(self) -> None:
        rows = list(self.rows)
        with open(self.path, "w") as f:
            json.dump(rows, f)

    def _dump_loop(self) -> None:
        written = 0
        while True:
            time.sleep(2)
            if len(self.rows) != written:
                written = len(self.rows)
                self.dump()
