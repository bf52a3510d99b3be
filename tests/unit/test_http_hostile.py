"""The metrics and health listener (`cri_proxy/daemon/http.py`) against clients that are not
Prometheus nor a probe: a head too long, a line past the reader's limit, headers trickled forever,
more connections than it serves, an answer never read, /metrics asked in a loop. Each gets an
answer or is cut off, the listener logs no traceback, and a probe still answers afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

from prometheus_client import CollectorRegistry

from cri_proxy.daemon.http import MAX_HEAD_BYTES, HttpEndpoint


async def _ok() -> tuple[bool, str]:
    return True, "ok"


async def _exchange(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


def _run_with_endpoint(body: Any) -> list[dict[str, Any]]:
    """`body(endpoint)` against a started endpoint; what the loop's exception handler saw."""
    seen: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: seen.append(context))
        endpoint = HttpEndpoint("127.0.0.1:0", CollectorRegistry(), _ok, _ok)
        endpoint.head_timeout = 0.5
        await endpoint.start()
        try:
            await body(endpoint)
            assert (await _exchange(endpoint.port, b"GET /healthz HTTP/1.1\r\n\r\n")).startswith(
                b"HTTP/1.1 200 OK"
            )
        finally:
            await endpoint.stop()

    asyncio.run(main())
    return seen


def test_a_request_line_past_the_readers_limit_gets_431() -> None:
    async def body(endpoint: HttpEndpoint) -> None:
        reply = await _exchange(endpoint.port, b"GET /" + b"a" * 200_000 + b" HTTP/1.1\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")

    assert _run_with_endpoint(body) == []


def test_headers_past_the_head_cap_get_431() -> None:
    async def body(endpoint: HttpEndpoint) -> None:
        many = b"".join(b"X-%d: %s\r\n" % (i, b"v" * 100) for i in range(MAX_HEAD_BYTES // 100))
        reply = await _exchange(endpoint.port, b"GET /metrics HTTP/1.1\r\n" + many + b"\r\n")
        assert reply.startswith(b"HTTP/1.1 431 ")
        one_long = b"GET /metrics HTTP/1.1\r\nX: " + b"b" * 100_000 + b"\r\n\r\n"
        assert (await _exchange(endpoint.port, one_long)).startswith(b"HTTP/1.1 431 ")
        within = b"GET /healthz HTTP/1.1\r\n" + b"X: " + b"c" * (MAX_HEAD_BYTES // 2) + b"\r\n\r\n"
        assert (await _exchange(endpoint.port, within)).startswith(b"HTTP/1.1 200 OK")

    assert _run_with_endpoint(body) == []


def test_a_client_trickling_headers_is_cut_off_at_the_head_deadline() -> None:
    async def body(endpoint: HttpEndpoint) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
        writer.write(b"GET /metrics HTTP/1.1\r\n")
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            while not reader.at_eof():  # one header line every 0.1 s: each line well within any gap
                writer.write(b"X: y\r\n")
                await writer.drain()
                try:
                    if await asyncio.wait_for(reader.read(1), 0.1) == b"":
                        break
                except TimeoutError:
                    pass
                assert loop.time() - began < 5.0, "still connected long after the head deadline"
        except ConnectionError:
            pass  # cut off while writing
        finally:
            writer.close()

    assert _run_with_endpoint(body) == []


def test_connections_past_the_cap_are_closed_at_once_and_probes_come_back_after() -> None:
    async def body(endpoint: HttpEndpoint) -> None:
        endpoint.max_connections = 8
        endpoint.head_timeout = 1.0
        held = [await asyncio.open_connection("127.0.0.1", endpoint.port) for _ in range(8)]
        deadline = asyncio.get_running_loop().time() + 5.0
        while endpoint.serving < 8:  # the listener has taken all eight
            assert asyncio.get_running_loop().time() < deadline, f"serving {endpoint.serving} of 8"
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
        writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
        with contextlib.suppress(ConnectionResetError):  # closed with the request unread
            assert await asyncio.wait_for(reader.read(), 5.0) == b""  # closed unread: over the cap
        writer.close()
        assert endpoint.serving == 8
        for _, w in held:  # the flood leaves (or its head deadline ends it): probes answer again
            w.close()
        while endpoint.serving:
            assert asyncio.get_running_loop().time() < deadline + 5.0, f"still serving {endpoint.serving}"
            await asyncio.sleep(0.01)

    assert _run_with_endpoint(body) == []


def test_a_client_that_never_reads_its_answer_is_let_go_at_the_deadline() -> None:
    async def body(endpoint: HttpEndpoint) -> None:
        endpoint.registry.register(_Big())  # an exposition far larger than the sockets' buffers
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # loopback's buffers hold megabytes
        sock.connect(("127.0.0.1", endpoint.port))
        sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")  # and never a recv
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while not endpoint.serving:  # taken up
            assert loop.time() < deadline, "the connection was never served"
            await asyncio.sleep(0.01)
        while endpoint.serving:  # the listener gives up on the write within its deadline
            assert loop.time() < deadline + 5.0, "still writing to a client that never reads"
            await asyncio.sleep(0.05)
        sock.close()

    assert _run_with_endpoint(body) == []


def test_metrics_asked_too_often_get_429_and_probes_do_not() -> None:
    now = [100.0]

    async def status(endpoint: HttpEndpoint, path: bytes) -> bytes:
        reply = await _exchange(endpoint.port, b"GET " + path + b" HTTP/1.1\r\n\r\n")
        return reply.split(b"\r\n", 1)[0]

    async def body(endpoint: HttpEndpoint) -> None:
        endpoint.max_expositions_per_second = 3
        endpoint.clock = lambda: now[0]
        statuses = [await status(endpoint, b"/metrics") for _ in range(6)]
        assert statuses == [b"HTTP/1.1 200 OK"] * 3 + [b"HTTP/1.1 429 Too Many Requests"] * 3
        assert [await status(endpoint, b"/healthz") for _ in range(10)] == [b"HTTP/1.1 200 OK"] * 10
        now[0] += 0.9  # the same second still
        assert await status(endpoint, b"/metrics") == b"HTTP/1.1 429 Too Many Requests"
        now[0] += 0.2  # the budget comes back once the second has passed
        assert [await status(endpoint, b"/metrics") for _ in range(4)] == [b"HTTP/1.1 200 OK"] * 3 + [
            b"HTTP/1.1 429 Too Many Requests"
        ]

    assert _run_with_endpoint(body) == []


class _Big:
    """A collector whose exposition is ~10 MB."""

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily("big", "padding", labels=["n"])
        for n in range(100_000):
            family.add_metric([f"{n:080d}"], n)
        yield family
