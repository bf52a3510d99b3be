"""systemd's notify protocol: one datagram per message to the socket named in $NOTIFY_SOCKET.

No libsystemd needed: READY=1, STOPPING=1, RELOADING=1, STATUS=..., WATCHDOG=1 are plain text.
An address starting with '@' is in the abstract namespace.
"""

from __future__ import annotations

import os
import socket


def notify(message: str, env: dict[str, str] | None = None) -> bool:
    """Send `message`; False when not run under systemd (no $NOTIFY_SOCKET) or the send failed."""
    address = (env if env is not None else os.environ).get("NOTIFY_SOCKET", "")
    if not address:
        return False
    target = "\0" + address[1:] if address.startswith("@") else address
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(target)
            sock.sendall(message.encode())
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
