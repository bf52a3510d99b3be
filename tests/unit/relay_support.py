"""In-process fixtures for relay tests: a fake runtime and the relay, on real Unix sockets."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio

from cri_proxy.config import Config
from cri_proxy.fake_runtime.server import FakeOptions, FakeRuntime
from cri_proxy.relay.hooks import HookTable
from cri_proxy.relay.server import Relay

T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def eventually(check: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    """Poll `check` every 10 ms until it holds; fail naming `what` after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.01)


@dataclass
class Bed:
    dir: Path
    runtime_endpoint: str
    proxy_endpoint: str
    relay: Relay
    fake: FakeRuntime | None

    def channel(self, endpoint: str | None = None) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(
            endpoint or self.proxy_endpoint,
            options=[
                ("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 64 << 20),
            ],
        )


@contextlib.asynccontextmanager
async def bed(
    hooks: HookTable | None = None,
    upstream: Callable[[str], Awaitable[grpc.aio.Server]] | None = None,
    start_runtime: bool = True,
    **config: Any,
) -> AsyncIterator[Bed]:
    """A runtime (the fake, or `upstream(endpoint)`) and a relay in front of it."""
    with tempfile.TemporaryDirectory(prefix="cri-proxy-test-") as tmp:
        d = Path(tmp)
        runtime_ep = f"unix://{d}/runtime.sock"
        proxy_ep = f"unix://{d}/run/proxy.sock"
        fake: FakeRuntime | None = None
        server: grpc.aio.Server | None = None
        if start_runtime:
            if upstream is None:
                fake = FakeRuntime(FakeOptions(listen=runtime_ep))
                await fake.start()
            else:
                server = await upstream(runtime_ep)
        relay = Relay(Config(listen=proxy_ep, runtime_endpoint=runtime_ep, **config), hooks)
        await relay.start()
        try:
            yield Bed(d, runtime_ep, proxy_ep, relay, fake)
        finally:
            await relay.stop(0)
            if fake is not None:
                await fake.stop(0)
            if server is not None:
                await server.stop(0)


async def raw_server(endpoint: str, handler: grpc.GenericRpcHandler) -> grpc.aio.Server:
    """An upstream that answers with a hand-written generic handler (for metadata/status tests)."""
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(endpoint)
    await server.start()
    return server


class RawRuntime:
    """A runtime written by hand on the bed's runtime socket (`serving`): what it saw is kept by its
    `serve`, and `until` waits for it."""

    def __init__(self) -> None:
        self.changed = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def serving(self, bed: Bed) -> AsyncIterator[None]:
        server = await asyncio.start_unix_server(self.serve, bed.runtime_endpoint.removeprefix("unix://"))
        try:
            yield
        finally:
            server.close()

    async def until(self, found: Callable[[], Any], timeout: float = 5.0) -> Any:
        """`found()` once it is truthy (`serve` sets `changed` after each read), or an AssertionError."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not (hit := found()):
            left = deadline - loop.time()
            assert left > 0, f"not seen within {timeout}s: {self!r}"
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)
        return hit
