"""HTTP/2 edges of the frame relay, tried with a raw client (the `h2` library) on real sockets
against the fake runtime: handshake from the first byte, limits, flow control, hooked requests
that come compressed, padded or with trailers, and a runtime lost mid-call."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import select
import socket
import struct
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import pytest
from google.protobuf.message import Message
from hpack import Encoder

from cri_api.v1 import api_pb2 as v1
from cri_proxy.relay import wire
from cri_proxy.relay.hooks import HookTable
from cri_proxy.relay.methods import MethodInfo
from tests import h2raw
from tests.h2raw import request_headers
from tests.unit.relay_support import RawRuntime, bed, run

VERSION = "/runtime.v1.RuntimeService/Version"
CREATE = "/runtime.v1.RuntimeService/CreateContainer"


class RawClient:
    """An HTTP/2 client that shows every event and can also write frames h2 would never send."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.events: list[h2.events.Event] = []
        self.closed = False

    @classmethod
    async def open(cls, endpoint: str, settings: dict[int, int] | None = None) -> RawClient:
        reader, writer = await asyncio.open_unix_connection(endpoint.removeprefix("unix://"))
        client = cls(reader, writer)
        client.conn.initiate_connection()
        if settings:
            client.conn.update_settings(settings)
        client.flush()
        return client

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)

    def raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def until(self, found: Callable[[list[h2.events.Event]], Any], timeout: float = 5.0) -> Any:
        """Read until `found(events)` is truthy (its value is returned) or the deadline passes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            hit = found(self.events)
            if hit:
                return hit
            left = deadline - loop.time()
            if left <= 0 or self.closed:
                raise AssertionError(f"not seen within {timeout}s; events: {self.events[-10:]}")
            try:
                data = await asyncio.wait_for(self.reader.read(65536), left)
            except TimeoutError:
                continue
            if not data:
                self.closed = True
                continue
            try:
                self.events += self.conn.receive_data(data)
            except h2.exceptions.ProtocolError as exc:
                self.events.append(exc)  # type: ignore[arg-type]
            self.flush()

    def request(
        self, path: str, body: bytes | None, extra: list[tuple[str, str]] | None = None, end: bool = True
    ) -> int:
        sid: int = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, request_headers(path, extra or ()), end_stream=body is None)
        if body is not None:
            self.conn.send_data(sid, body, end_stream=end)
        self.flush()
        return sid

    def close(self) -> None:
        self.writer.close()


def grpc_body(message: Message, compressed: bool = False) -> bytes:
    data = message.SerializeToString()
    if compressed:
        data = gzip.compress(data)
    return struct.pack(">BI", int(compressed), len(data)) + data


def of(kind: type, **match: Any) -> Callable[[list[Any]], Any]:
    def found(events: list[Any]) -> Any:
        for event in events:
            if isinstance(event, kind) and all(getattr(event, k) == v for k, v in match.items()):
                return event
        return None

    return found


def status_of(sid: int) -> Callable[[list[Any]], Any]:
    """The grpc-status of stream `sid`, once its trailers (or trailers-only answer) arrived."""

    def found(events: list[Any]) -> Any:
        for event in events:
            if (
                isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived)
                and event.stream_id == sid
            ):
                for name, value in event.headers:
                    if name == b"grpc-status":
                        return value.decode()
        return None

    return found


def test_the_handshake_is_answered_from_the_first_byte() -> None:
    """SETTINGS and their ACKs, and a PING, pass before any request is made."""

    async def main() -> None:
        async with bed() as b:
            client = await RawClient.open(b.proxy_endpoint)
            client.conn.ping(b"12345678")
            client.flush()
            await client.until(of(h2.events.RemoteSettingsChanged))
            await client.until(of(h2.events.SettingsAcknowledged))
            await client.until(of(h2.events.PingAckReceived))
            sid = client.request(VERSION, grpc_body(v1.VersionRequest(version="v1")))
            assert await client.until(status_of(sid)) == "0"
            client.close()

    run(main())


def test_a_header_list_over_the_limit_resets_only_its_stream() -> None:
    """A small block that decodes past SETTINGS_MAX_HEADER_LIST_SIZE: RST_STREAM FRAME_SIZE_ERROR for
    that stream (as grpc-go does); HPACK stays in sync and the next call on the connection works."""

    async def main() -> None:
        async with bed() as b:
            client = await RawClient.open(b.proxy_endpoint)
            await client.until(of(h2.events.SettingsAcknowledged))
            big = [("x-big", "v" * 4000)] * 4300  # ~17 MB decoded, ~13 KB encoded (indexed)
            sid = client.request(VERSION, grpc_body(v1.VersionRequest()), extra=big)
            reset = await client.until(of(h2.events.StreamReset, stream_id=sid))
            assert reset.error_code == h2.errors.ErrorCodes.FRAME_SIZE_ERROR
            again = client.request(VERSION, grpc_body(v1.VersionRequest()), extra=[("x-big", "v" * 4000)])
            assert await client.until(status_of(again)) == "0"
            client.close()

    run(main())


def test_a_header_block_over_the_cap_ends_the_connection_with_protocol_error() -> None:
    async def main() -> None:
        async with bed() as b:
            client = await RawClient.open(b.proxy_endpoint)
            await client.until(of(h2.events.SettingsAcknowledged))
            # raw frames: an endless CONTINUATION run (h2 would refuse to send it)
            sid = 1
            block = b"\x00" + wire.hpack_string(b"x-a") + wire.hpack_string(b"b" * 16000)
            client.raw(wire.frame(wire.HEADERS, 0, sid, block))
            for _ in range(140):  # past the 2 MiB cap
                client.raw(wire.frame(wire.CONTINUATION, 0, sid, block))
            ended = await client.until(of(h2.events.ConnectionTerminated))
            assert ended.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
            client.close()

    run(main())


def _request_block() -> bytes:
    """A request header block for an unknown method, literal fields only (no dynamic table)."""
    fields = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/test.Unknown/Flood"),
        (b":authority", b"x"),
        (b"content-type", b"application/grpc"),
    ]
    return b"".join(wire.literal_new_name(name, value) for name, value in fields)


def _hooks(pre_seen: list[Message], failed: list[grpc.StatusCode] | None = None) -> HookTable:
    async def pre(request: Message, info: MethodInfo) -> Message:
        pre_seen.append(request)
        request.config.linux.resources.cpuset_cpus = "3"  # type: ignore[attr-defined]
        return request

    async def on_failed(request: Message, code: grpc.StatusCode, info: MethodInfo) -> None:
        if failed is not None:
            failed.append(code)

    table = HookTable()
    table.register("CreateContainer", pre=pre, failed=on_failed)
    return table


async def _sandbox(b: Any) -> str:
    async with b.channel() as ch:
        run_pod = ch.unary_unary(
            "/runtime.v1.RuntimeService/RunPodSandbox",
            request_serializer=v1.RunPodSandboxRequest.SerializeToString,
            response_deserializer=v1.RunPodSandboxResponse.FromString,
        )
        return str((await run_pod(v1.RunPodSandboxRequest(config=v1.PodSandboxConfig()))).pod_sandbox_id)


def _create(sandbox: str, name: str = "app") -> v1.CreateContainerRequest:
    return v1.CreateContainerRequest(
        pod_sandbox_id=sandbox, config=v1.ContainerConfig(metadata=v1.ContainerMetadata(name=name))
    )


def test_a_gzip_request_to_a_hooked_method_is_hooked() -> None:
    seen: list[Message] = []

    async def main() -> None:
        async with bed(_hooks(seen)) as b:
            assert b.fake is not None
            sandbox = await _sandbox(b)
            async with b.channel() as ch:
                create = ch.unary_unary(
                    CREATE,
                    request_serializer=v1.CreateContainerRequest.SerializeToString,
                    response_deserializer=v1.CreateContainerResponse.FromString,
                )
                reply = await create(_create(sandbox), compression=grpc.Compression.Gzip)
            assert len(seen) == 1
            assert b.fake.store.containers[reply.container_id].resources.cpuset_cpus == "3"

    run(main())


def test_a_hooked_request_with_padding_and_client_trailers_is_hooked() -> None:
    """Padded DATA (padding not counted toward the message limit) and trailers from the client:
    the request is hooked and answered, never left hanging."""
    seen: list[Message] = []

    async def main() -> None:
        async with bed(_hooks(seen), max_recv_message_bytes=4096, max_send_message_bytes=4096) as b:
            assert b.fake is not None
            sandbox = await _sandbox(b)
            client = await RawClient.open(b.proxy_endpoint)
            await client.until(of(h2.events.SettingsAcknowledged))
            request = _create(sandbox)
            request.config.labels["fill"] = "x" * 3000  # under 4096; with padding well over it
            body = grpc_body(request)
            sid = client.conn.get_next_available_stream_id()
            client.conn.send_headers(
                sid,
                [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", CREATE),
                    (":authority", "x"),
                    ("content-type", "application/grpc"),
                    ("te", "trailers"),
                ],
            )
            for at in range(0, len(body), 1000):
                client.conn.send_data(sid, body[at : at + 1000], pad_length=255)
            client.conn.send_headers(sid, [("x-trailer", "1")], end_stream=True)
            client.flush()
            status = await client.until(status_of(sid))
            assert seen, "the pre hook ran"
            assert status == "0"
            created = [c for c in b.fake.store.containers.values() if c.resources.cpuset_cpus == "3"]
            assert len(created) == 1
            client.close()

    run(main())


def test_an_over_limit_request_is_refused_as_soon_as_its_length_prefix_says_so() -> None:
    seen: list[Message] = []

    async def main() -> None:
        async with bed(_hooks(seen), max_recv_message_bytes=4096, max_send_message_bytes=4096) as b:
            client = await RawClient.open(b.proxy_endpoint)
            await client.until(of(h2.events.SettingsAcknowledged))
            sid = client.request(CREATE, struct.pack(">BI", 0, 1 << 20) + b"\0" * 100, end=False)
            assert await client.until(status_of(sid)) == str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
            assert not seen
            client.close()

    run(main())


def test_a_table_size_change_binds_only_once_acknowledged() -> None:
    """SETTINGS_HEADER_TABLE_SIZE=0 from the client, then calls at once: every call answers, no
    COMPRESSION_ERROR (the proxy's decoder takes the size when the runtime ACKs it)."""

    async def main() -> None:
        async with bed() as b:
            client = await RawClient.open(b.proxy_endpoint, {h2.settings.SettingCodes.HEADER_TABLE_SIZE: 0})
            sids = [
                client.request(VERSION, grpc_body(v1.VersionRequest()), extra=[("x-n", str(i))])
                for i in range(20)
            ]
            for sid in sids:
                assert await client.until(status_of(sid)) == "0"
            assert not any(isinstance(e, h2.events.ConnectionTerminated) for e in client.events)
            client.close()

    run(main())


class CrashingRuntime(RawRuntime):
    """A raw HTTP/2 runtime that takes requests, answers none, and drops the connection when told
    (`crash`): no GOAWAY, no trailers, as a runtime that was killed."""

    def __init__(self) -> None:
        super().__init__()
        self.ended: list[int] = []  # streams whose request it read whole
        self.writer: asyncio.StreamWriter | None = None

    def __repr__(self) -> str:
        return f"CrashingRuntime(ended={self.ended})"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        conn.initiate_connection()
        self.writer = writer
        writer.write(conn.data_to_send())
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.StreamEnded):
                        self.ended.append(event.stream_id)
                writer.write(conn.data_to_send())
                self.changed.set()

    def crash(self) -> None:
        assert self.writer is not None
        self.writer.transport.abort()


def test_calls_open_when_the_runtime_is_lost_run_their_failed_hooks() -> None:
    """Issue 13: the runtime connection drops with CreateContainer calls open: each is answered
    UNAVAILABLE and its failed hook runs (UNAVAILABLE), so no record stays pending."""
    failed: list[grpc.StatusCode] = []
    seen: list[Message] = []

    async def main() -> None:
        runtime = CrashingRuntime()
        async with (
            bed(_hooks(seen, failed), start_runtime=False) as b,
            runtime.serving(b),
            b.channel() as ch,
        ):
            create = ch.unary_unary(CREATE, request_serializer=v1.CreateContainerRequest.SerializeToString)
            calls = [asyncio.ensure_future(create(_create("s", f"c{i}"), timeout=10)) for i in range(3)]
            await runtime.until(lambda: len(runtime.ended) == 3)
            assert len(seen) == 3
            runtime.crash()
            results = await asyncio.gather(*calls, return_exceptions=True)
            assert all(isinstance(r, grpc.aio.AioRpcError) for r in results), results
            assert {r.code() for r in results if isinstance(r, grpc.aio.AioRpcError)} == {
                grpc.StatusCode.UNAVAILABLE
            }
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while len(failed) < 3 and loop.time() < deadline:
                await asyncio.sleep(0.01)
            assert failed == [grpc.StatusCode.UNAVAILABLE] * 3

    run(main())


def test_a_runtime_that_reads_nothing_is_let_go_when_the_client_leaves() -> None:
    """The relay holds requests for a runtime that stopped reading; once their client has gone they
    are dropped and the runtime connection closed at once, not kept (with its socket) while the
    relay waits to write them to a runtime that never reads again."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with bed(start_runtime=False) as b:
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(b.runtime_endpoint.removeprefix("unix://"))
            listener.listen()
            listener.setblocking(False)
            client = socket.socket(socket.AF_UNIX)
            client.setblocking(False)
            await loop.sock_connect(client, b.proxy_endpoint.removeprefix("unix://"))
            runtime, _ = await asyncio.wait_for(loop.sock_accept(listener), 5)
            block = bytes(Encoder().encode(request_headers(VERSION), huffman=False))
            start = (
                h2raw.PREFACE
                + h2raw.settings_frame()
                + h2raw.frame(h2raw.HEADERS, h2raw.END_HEADERS, 1, block)
            )
            await loop.sock_sendall(client, start)
            piece = h2raw.frame(h2raw.DATA, 0, 1, bytes(16384)) * 64  # 1 MiB, windows or not
            for _ in range(8):  # until the relay stops taking them: the runtime reads nothing
                try:
                    await asyncio.wait_for(loop.sock_sendall(client, piece), 1)
                except TimeoutError:
                    break
            assert b.relay.frames is not None
            [link] = b.relay.frames.links
            assert link.runtime is not None and link.runtime.get_write_buffer_size() > 0
            client.close()
            poller = select.poll()
            poller.register(runtime, select.POLLRDHUP)
            deadline = loop.time() + 3
            while not poller.poll(0):  # the runtime's end sees the close without reading a byte
                assert loop.time() < deadline, "the relay kept the runtime connection of a client that left"
                await asyncio.sleep(0.01)
            runtime.close()
            listener.close()

    run(main())


@pytest.mark.parametrize("relay_mode", ["frames"])
def test_runtime_unreachable_stand_in_is_well_formed(relay_mode: str) -> None:
    async def main() -> None:
        async with bed(start_runtime=False, relay_mode=relay_mode) as b:
            client = await RawClient.open(b.proxy_endpoint)
            client.conn.ping(b"abcdefgh")
            client.flush()
            await client.until(of(h2.events.PingAckReceived))
            sid = client.request(VERSION, grpc_body(v1.VersionRequest()))
            assert await client.until(status_of(sid)) == str(grpc.StatusCode.UNAVAILABLE.value[0])
            client.close()

    run(main())


@pytest.mark.parametrize("runtime", ["up", "unreachable"])
def test_the_proxys_own_answers_honour_a_smaller_header_table(runtime: str) -> None:
    """The client shrank its HPACK table (SETTINGS_HEADER_TABLE_SIZE=0, acknowledged); the next
    header block it receives must start with the size update. The proxy's own answers (a refusal,
    the stand-in's UNAVAILABLE) may be that block: they carry the update, and the proxy's view of
    the client's table follows, so the runtime's later blocks still decode."""
    seen: list[Message] = []
    limits = {"max_recv_message_bytes": 4096, "max_send_message_bytes": 4096}

    async def main() -> None:
        async with bed(_hooks(seen), start_runtime=runtime == "up", **limits) as b:
            client = await RawClient.open(b.proxy_endpoint, {h2.settings.SettingCodes.HEADER_TABLE_SIZE: 0})
            await client.until(of(h2.events.SettingsAcknowledged))
            if runtime == "up":
                sid = client.request(CREATE, struct.pack(">BI", 0, 1 << 20) + b"\0" * 100, end=False)
                expected = grpc.StatusCode.RESOURCE_EXHAUSTED
            else:
                sid = client.request(VERSION, grpc_body(v1.VersionRequest()))
                expected = grpc.StatusCode.UNAVAILABLE
            assert await client.until(status_of(sid)) == str(expected.value[0])
            if runtime == "up":  # the runtime's own blocks after ours
                later = client.request(VERSION, grpc_body(v1.VersionRequest()), extra=[("x-a", "b")])
                assert await client.until(status_of(later)) == "0"
            errors = [e for e in client.events if isinstance(e, Exception | h2.events.ConnectionTerminated)]
            assert not errors, errors
            client.close()

    run(main())
