"""Metrics and health over HTTP on a loopback address: /metrics, /healthz, /readyz.

A tiny asyncio HTTP/1.1 responder: three GET paths, no threads, nothing else to configure. Its
port is open to every local user, so it is bounded against its clients: the head's size and time,
the answer's time, the connections at once, and how often /metrics is built.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import time
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from cri_proxy.errors import EndpointError

Probe = Callable[[], Awaitable[tuple[bool, str]]]

HEAD_TIMEOUT = 10.0
"""Seconds a client has to send its request line and headers; a probe sends them at once."""
MAX_HEAD_BYTES = 16 * 1024
"""A probe's or Prometheus's request head is a few hundred bytes; a longer one gets 431."""
MAX_CONNECTIONS = 64
"""Connections served at once. The port is open to every local user; each connection holds a file
descriptor for up to HEAD_TIMEOUT, and descriptors run out for the CRI socket too: past this many a
new one is closed at once, so a flood of them costs metrics, never the kubelet's calls."""
MAX_EXPOSITIONS_PER_SECOND = 20
"""/metrics answers a second, at most. Each is built on the event loop the CRI calls share (0.3 ms
on an idle proxy, more with every series): Prometheus asks every 15-60 s, a loop of requests from
a local user gets 429 past this instead of slowing the kubelet's calls. Probes are not counted."""
TOO_MANY = ("429 Too Many Requests", "text/plain", b"/metrics asked too often: try again in a second\n")
TOO_BIG = ("431 Request Header Fields Too Large", "text/plain", b"request head too large\n")


class _HeadTooBig(Exception):
    """More than MAX_HEAD_BYTES before the blank line."""


async def _request_line(reader: asyncio.StreamReader) -> bytes:
    """The request line; the headers after it are read and dropped (none is needed), at most
    MAX_HEAD_BYTES of them in all. A line longer than the reader's own limit raises ValueError."""
    request_line = await reader.readline()
    size = len(request_line)
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        size += len(line)
        if size > MAX_HEAD_BYTES:
            raise _HeadTooBig
    if size > MAX_HEAD_BYTES:
        raise _HeadTooBig
    return request_line


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` or `[v6]:PORT`; the error names the text."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"metrics_address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9464")
    return host.strip("[]"), int(port)


class HttpEndpoint:
    def __init__(self, address: str, registry: CollectorRegistry, healthz: Probe, readyz: Probe) -> None:
        self.address = address
        self.host, self.port = parse_address(address)
        self.registry = registry
        self.probes = {"/healthz": healthz, "/readyz": readyz}
        self.head_timeout = HEAD_TIMEOUT
        self.max_connections = MAX_CONNECTIONS
        self.max_expositions_per_second = MAX_EXPOSITIONS_PER_SECOND
        self._expositions: collections.deque[float] = collections.deque()  # when, the last second's
        self.clock: Callable[[], float] = time.monotonic
        self._serving = 0
        self._server: asyncio.Server | None = None

    @property
    def serving(self) -> int:
        """Connections being served now (at most `max_connections`)."""
        return self._serving

    async def start(self) -> None:
        """Listen; EndpointError naming the address when it cannot (a port taken, an address not
        on this host)."""
        try:
            self._server = await asyncio.start_server(self._handle, self.host, self.port)
        except OSError as exc:
            why = os.strerror(exc.errno) if exc.errno else str(exc)  # uvloop's text repeats the address
            raise EndpointError(f"metrics_address {self.address}: cannot listen: {why}") from None
        sockname = self._server.sockets[0].getsockname()
        self.port = int(sockname[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._serving >= self.max_connections:
            writer.close()  # unread: the flood's own connections are the ones that wait
            return
        self._serving += 1
        try:
            try:  # the whole head within its deadline: a client trickling headers is cut off too
                request_line = await asyncio.wait_for(_request_line(reader), self.head_timeout)
            except (ValueError, _HeadTooBig):  # a line past the reader's limit, or too many of them
                method, (status, ctype, body) = "", TOO_BIG
            else:
                parts = request_line.decode("latin-1").split()
                method, path = (parts[0], parts[1].split("?")[0]) if len(parts) >= 2 else ("", "")
                status, ctype, body = await self._route(method, path)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode() + (body if method != "HEAD" else b""))
            await asyncio.wait_for(writer.drain(), self.head_timeout)
        except TimeoutError:  # a head never finished, or an answer never read: drop what is unsent
            writer.transport.abort()  # (a plain close would wait to send it, for good)
        except (ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._serving -= 1

    def _may_expose(self) -> bool:
        """Whether one more /metrics fits in the last second's budget (and count it if so)."""
        now = self.clock()
        recent = self._expositions
        while recent and now - recent[0] >= 1.0:
            recent.popleft()
        if len(recent) >= self.max_expositions_per_second:
            return False
        recent.append(now)
        return True

    async def _route(self, method: str, path: str) -> tuple[str, str, bytes]:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"only GET\n"
        if path == "/metrics":
            if not self._may_expose():
                return TOO_MANY
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.registry)
        probe = self.probes.get(path)
        if probe is None:
            return "404 Not Found", "text/plain", b"/metrics, /healthz, /readyz\n"
        ok, why = await probe()
        return ("200 OK" if ok else "503 Service Unavailable"), "text/plain", (why + "\n").encode()
