"""systemd's notify protocol: one datagram per message to the socket named in $NOTIFY_SOCKET.

No libsystemd needed: READY=1, STOPPING=1, RELOADING=1 (with MONOTONIC_USEC), STATUS=..., WATCHDOG=1
are plain text.
An address starting with '@' is in the abstract namespace.

A send never waits: it runs on the event loop the CRI calls share, and when PID 1 is not reading
(a long daemon-reload, a stuck manager) its socket's queue fills and a blocking send would hold
every call until PID 1 reads again. A ping that finds no room is dropped (the next one comes);
a change of state (READY, RELOADING, STOPPING) waits its turn and is sent again from the loop,
in order, until it goes.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

WATCHDOG = "WATCHDOG=1"
RETRY_EVERY = 0.1
"""Seconds between tries of a change of state PID 1 had no room for."""
HELD = 64
"""Changes of state waiting at most (a storm of reloads): past it the oldest goes."""


class _Held:
    """Changes of state not sent yet for want of room, oldest first, and the timer that tries again."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str]] = []  # (socket, message)
        self.timer: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the timer's (a test runs several)

    def add(self, target: str, message: str) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to try again from: as a failed send
            return
        self.messages.append((target, message))
        del self.messages[:-HELD]
        if self.timer is None or self.loop is not loop:
            self.loop, self.timer = loop, loop.call_later(RETRY_EVERY, self.retry)

    def retry(self) -> None:
        self.timer = None
        while self.messages:
            if _send(*self.messages[0]) is None:
                assert self.loop is not None
                self.timer = self.loop.call_later(RETRY_EVERY, self.retry)
                return
            del self.messages[0]


_held = _Held()


def notify(message: str, env: dict[str, str] | None = None) -> bool:
    """Send `message` now; False when not run under systemd (no $NOTIFY_SOCKET), when the send
    failed, or when it had to wait (then, a change of state is sent again later from the loop)."""
    address = (env if env is not None else os.environ).get("NOTIFY_SOCKET", "")
    if not address:
        return False
    target = "\0" + address[1:] if address.startswith("@") else address
    if message != WATCHDOG and _held.messages:  # after those waiting: in order
        _held.add(target, message)
        return False
    sent = _send(target, message)
    if sent is None and message != WATCHDOG:
        _held.add(target, message)
    return bool(sent)


def reloading() -> str:
    """RELOADING=1 with the CLOCK_MONOTONIC time in µs: systemd 253+ takes a reload under
    `Type=notify-reload` (`ReloadSignal=SIGHUP`) only with it, and otherwise fails the reload
    when its time-out ends; older ones ignore the field."""
    return f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"


def held() -> list[str]:
    """The changes of state waiting for room, oldest first (for tests)."""
    return [message for _, message in _held.messages]


def _send(target: str, message: str) -> bool | None:
    """True when sent, None when the queue had no room, False when it cannot go at all."""
    try:
        kind = socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
        with socket.socket(socket.AF_UNIX, kind) as sock:
            sock.connect(target)
            sock.send(message.encode())
    except BlockingIOError:
        return None
    except OSError:
        return False
    return True


def watchdog_interval(env: dict[str, str] | None = None) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WatchdogSec), or None when no watchdog is asked for."""
    environ = env if env is not None else os.environ
    usec = environ.get("WATCHDOG_USEC", "")
    pid = environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) <= 0:
        return None
    if pid and pid != str(os.getpid()):
        return None
    return int(usec) / 1_000_000 / 2
