"""systemd notify when PID 1 does not read: a real datagram socket whose queue is left to fill.
A send must never wait (it runs on the loop every CRI call shares): a ping that finds no room is
dropped, a change of state is sent again from the loop, in order, once there is room."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cri_proxy.daemon import notify as notify_mod
from cri_proxy.daemon.notify import held, notify


@pytest.fixture
def full(tmp_path: Path) -> Iterator[tuple[socket.socket, dict[str, str]]]:
    """A bound socket no one reads, its queue filled with pings (the filling must not block)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.setblocking(False)
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock")}
    sent: list[bool] = []

    def fill() -> None:
        for _ in range(100_000):
            sent.append(notify("WATCHDOG=1", env))
            if not sent[-1]:
                return

    filler = threading.Thread(target=fill, daemon=True)
    filler.start()
    filler.join(20)
    assert not filler.is_alive(), "a send waited for PID 1 to read"
    assert sent[-1] is False and len(sent) > 1
    assert held() == []  # a ping is not kept
    yield sock, env
    sock.close()


def _read(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_a_change_of_state_waits_its_turn_and_goes_once_there_is_room(
    full: tuple[socket.socket, dict[str, str]],
) -> None:
    sock, env = full

    async def main() -> list[str]:
        assert notify("RELOADING=1", env) is False
        assert notify("WATCHDOG=1", env) is False
        assert notify("READY=1", env) is False
        assert held() == ["RELOADING=1", "READY=1"]
        await asyncio.sleep(notify_mod.RETRY_EVERY * 3)
        assert held() == ["RELOADING=1", "READY=1"]  # still no room: still waiting, in order
        seen = _read(sock)  # PID 1 reads again
        deadline = time.monotonic() + 10
        while held() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert held() == []
        return seen + _read(sock)

    seen = asyncio.run(main())
    assert seen[-2:] == ["RELOADING=1", "READY=1"]
    assert set(seen[:-2]) == {"WATCHDOG=1"}


def test_at_most_held_changes_wait_and_none_without_a_loop(
    full: tuple[socket.socket, dict[str, str]],
) -> None:
    sock, env = full
    assert notify("READY=1", env) is False
    assert held() == []  # no loop to send it again from
    kept = [f"STATUS={n}" for n in range(10, notify_mod.HELD + 10)]

    async def main() -> list[str]:
        for n in range(notify_mod.HELD + 10):
            notify(f"STATUS={n}", env)
        assert held() == kept  # the oldest went
        seen = _read(sock)
        deadline = time.monotonic() + 10
        while held() and time.monotonic() < deadline:
            seen += _read(sock)
            await asyncio.sleep(0.01)
        return seen + _read(sock)

    seen = asyncio.run(main())
    assert [m for m in seen if m != "WATCHDOG=1"] == kept
    assert held() == []
