"""The proxy's socket files, looked at every few seconds: one removed under a running proxy is
bound again, one replaced is said, and left alone.

A cleanup script or an `rm -rf /run/...` can remove a socket file while its server runs. Nothing
else notices: the listening socket stays open with no file to reach it, every new connection of
the kubelet fails (ENOENT), and the proxy looks healthy (containerd does not notice either). A
file another server bound there since is its own: this proxy says so, and `/healthz` with it,
and its stop no longer removes that file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from loguru import logger

from cri_proxy.errors import CriProxyError

EVERY = 5.0  # seconds between looks (an lstat each)


class Served(Protocol):
    """A server on a socket file of its own: the relay on the CRI socket, the admin server."""

    def socket_gone(self) -> str | None: ...

    async def remake_socket(self) -> bool: ...


class SocketWatch:
    """`problem`: what is wrong with the socket files now (None: nothing), for /healthz."""

    def __init__(self, sockets: Sequence[tuple[str, Path, Served]], every: float = EVERY) -> None:
        self.sockets = sockets  # (what it is, its path, its server)
        self.every = every
        self.problem: str | None = None
        self._said: dict[str, str] = {}  # what -> the problem last said about it

    async def look(self) -> None:
        problems = []
        for what, path, server in self.sockets:
            gone = server.socket_gone()
            if gone is None:
                self._said.pop(what, None)
                continue
            if gone == "removed":
                try:
                    if await server.remake_socket():
                        logger.error(
                            "{} socket {} was removed while serving (no client could connect): bound again",
                            what,
                            path,
                        )
                        self._said.pop(what, None)
                        continue
                    why = ": it cannot be bound again while running (grpc mode); restart the proxy"
                except (CriProxyError, OSError) as exc:
                    why = f": not bound again: {exc}"
            else:
                why = ": another server's socket or a file is there, which clients reach, not this proxy"
            problem = f"{what} socket {path} was {gone} while serving{why}"
            problems.append(problem)
            if self._said.get(what) != problem:
                logger.error("{}", problem)
                self._said[what] = problem
        self.problem = "; ".join(problems) or None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            await self.look()
