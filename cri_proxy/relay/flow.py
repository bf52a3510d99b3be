"""Connection-level flow control as the relay sees it, and the buffer budgets. No I/O.

The relay forwards both peers' WINDOW_UPDATEs, so each peer's window is mostly the other's to
keep. Two things are the relay's own: request bytes it holds for a hook are credited to the
client by the relay, in batches (the runtime has not seen them and will not credit them), and the
request it then sends in their place takes the runtime's window, whose later credit the client must
not get twice (`withheld`). `client_allowance` is what the client may still send: the client that
sends more ignores flow control and is cut off, as the runtime cuts it off (FLOW_CONTROL_ERROR).
"""

from __future__ import annotations

from collections import deque

from cri_proxy.relay import wire
from cri_proxy.relay.wire import Buf


class Budget:
    """Bytes the relay may hold across every connection (held requests, frames waiting for window)."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def room(self, size: int) -> bool:
        """Whether `take(size)` would succeed."""
        return self.used + size <= self.limit

    def take(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used = max(0, self.used - size)


class Windows:
    """The runtime's connection window, the client's allowance, and frames waiting for window."""

    __slots__ = (
        "backlog",
        "client_allowance",
        "initial_window",
        "max_frame",
        "queued",
        "runtime_window",
        "withheld",
    )

    def __init__(self) -> None:
        self.runtime_window = wire.DEFAULT_WINDOW  # what the runtime lets us send on the connection
        self.client_allowance = wire.DEFAULT_WINDOW  # what the client may send on the connection
        self.initial_window = wire.DEFAULT_WINDOW  # the runtime's SETTINGS_INITIAL_WINDOW_SIZE
        self.max_frame = wire.DEFAULT_MAX_FRAME_SIZE  # the runtime's SETTINGS_MAX_FRAME_SIZE
        self.withheld = 0  # runtime credit for bytes of our own: not the client's to get
        self.backlog: deque[tuple[Buf, int]] = deque()  # frames for the runtime, in order, with their flow
        self.queued = 0  # bytes in the backlog

    def send(self, chunk: Buf, flow: int, out: list[Buf]) -> None:
        """A chunk for the runtime taking `flow` bytes of its window: now, or after what waits."""
        if self.backlog or (flow and flow > self.runtime_window):
            self.backlog.append((chunk, flow))
            self.queued += len(chunk)
        else:
            self.runtime_window -= flow
            out.append(chunk)

    def credited(self, increment: int, out: list[Buf]) -> int:
        """The runtime's WINDOW_UPDATE on the connection: drain what waits; the part the client gets."""
        self.runtime_window += increment
        while self.backlog and self.backlog[0][1] <= self.runtime_window:
            chunk, flow = self.backlog.popleft()
            self.runtime_window -= flow
            self.queued -= len(chunk)
            out.append(chunk)
        passed = max(0, increment - self.withheld)
        self.withheld -= increment - passed
        self.client_allowance += passed
        return passed
