"""The frame relay (relay_mode "frames"): frame/HPACK helpers, rewrites and flow control, failures.

Behaviour shared with the grpc relay is pinned by test_relay_forwarding.py and test_relay_hooks.py,
which run against both relays; this file covers what is specific to relaying frames.
"""

from __future__ import annotations

import asyncio
import os
import stat
from typing import Any

import grpc
import grpc.aio
import hpack
import pytest
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from cri_api.v1 import api_pb2 as v1
from cri_proxy.config import Config
from cri_proxy.errors import ConfigError, EndpointError
from cri_proxy.relay import messages
from cri_proxy.relay import wire as h2
from cri_proxy.relay.hooks import HookError, HookTable
from cri_proxy.relay.methods import MethodInfo
from cri_proxy.relay.server import Relay
from tests.unit.relay_support import bed, run

CREATE = "/runtime.v1.RuntimeService/CreateContainer"
VERSION = "/runtime.v1.RuntimeService/Version"


# -- pure helpers ------------------------------------------------------------------------------
def test_frame_header_round_trip_and_reserved_bit() -> None:
    raw = h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 0x7FFFFFFF, b"x" * 70000)
    assert h2.read_head(raw, 0) == (70000, h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 0x7FFFFFFF)
    reserved = bytearray(h2.frame(h2.DATA, 0, 5, b"ab"))
    reserved[5] |= 0x80  # the R bit must be ignored
    assert h2.read_head(bytes(reserved), 0) == (2, h2.DATA, 0, 5)


def test_padding_and_priority_are_removed_from_fragments() -> None:
    assert h2.unpad(h2.PADDED, b"\x02abcXX") == b"abc"
    assert h2.unpad(0, b"\x02abc") == b"\x02abc"
    with pytest.raises(h2.FrameError):
        h2.unpad(h2.PADDED, b"\x05ab")
    payload = b"\x01" + b"\x00\x00\x00\x03\x10" + b"block" + b"P"
    assert h2.header_fragment(h2.PADDED | h2.PRIORITY_FLAG, payload) == b"block"
    assert h2.header_fragment(h2.PRIORITY_FLAG, b"\x00\x00\x00\x03\x10block") == b"block"


def test_hpack_integers_follow_rfc7541_examples() -> None:
    assert h2.hpack_int(10, 5) == b"\x0a"
    assert h2.hpack_int(1337, 5) == b"\x1f\x9a\x0a"
    assert h2.hpack_int(42, 8) == b"\x2a"


def test_status_blocks_decode_and_leave_the_dynamic_table_alone() -> None:
    decoder = hpack.Decoder()
    block = h2.status_block(14, "runtime unix:///x is not reachable: 100% gone \u2013 naïve\n", True)
    headers = decoder.decode(block)
    assert headers == [
        (":status", "200"),
        ("content-type", "application/grpc"),
        ("grpc-status", "14"),
        ("grpc-message", "runtime unix:///x is not reachable: 100%25 gone %E2%80%93 na%C3%AFve%0A"),
    ]
    assert len(decoder.header_table.dynamic_entries) == 0
    assert decoder.decode(h2.status_block(8, "", False)) == [("grpc-status", "8")]


def test_long_status_is_split_into_continuation_frames() -> None:
    raw = h2.status_frames(3, 13, "m" * 40000, True, h2.DEFAULT_MAX_FRAME_SIZE)
    off, kinds, block = 0, [], b""
    while off < len(raw):
        length, ftype, flags, sid = h2.read_head(raw, off)
        kinds.append((ftype, flags, sid))
        block += raw[off + 9 : off + 9 + length]
        off += 9 + length
    assert kinds[0] == (h2.HEADERS, h2.END_STREAM, 3)
    assert kinds[-1] == (h2.CONTINUATION, h2.END_HEADERS, 3)
    assert dict(hpack.Decoder().decode(block))["grpc-message"] == "m" * 40000


def test_grpc_message_prefix() -> None:
    assert messages.single(h2.grpc_message(b"abc")) == b"abc"
    assert messages.single(b"\x01\x00\x00\x00\x01z") is None  # compressed
    assert messages.single(h2.grpc_message(b"a") + h2.grpc_message(b"b")) is None
    assert messages.single(b"\x00\x00") is None
    assert list(h2.settings_pairs(h2.settings(((4, 1 << 20), (5, 32768)))[9:])) == [(4, 1 << 20), (5, 32768)]


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    cuts=st.lists(st.integers(0, 300), max_size=8),
    limit=st.integers(0, 40),
)
def test_message_boundaries_are_followed_across_any_cuts(
    sizes: list[int], cuts: list[int], limit: int
) -> None:
    """Messages in DATA payloads cut anywhere (prefixes too): the first one over the limit is
    named by its declared size as soon as its prefix is whole; under it, none is."""
    stream = b"".join(h2.grpc_message(bytes([i]) * size) for i, size in enumerate(sizes))
    bounds, frame_at, found = messages.Boundaries(), 0, 0
    for cut in [*sorted({c % (len(stream) + 1) for c in cuts}), len(stream)]:
        padded = b"junk" + stream[frame_at:cut] + b"tail"  # a payload within a bigger buffer
        found = bounds.feed(padded, 4, 4 + cut - frame_at, limit)
        frame_at = cut
        if found:
            break
    assert found == next((size for size in sizes if size > limit), 0)


def test_config_and_wiring_refuse_what_frames_mode_cannot_do(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="relay_mode"):
        Config(relay_mode="fast").validate()
    assert Config().relay_mode == "frames"  # the default

    tcp = Config(listen="localhost:0", runtime_endpoint=f"unix://{tmp_path}/r.sock", relay_mode="frames")

    async def build() -> None:
        Relay(tcp)

    with pytest.raises(EndpointError, match="frames"):
        run(build())


# -- rewrites and flow control -----------------------------------------------------------------
class Recorder(grpc.GenericRpcHandler):
    """Upstream CreateContainer that answers with the size of the padding annotation it received."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            if details.method == VERSION:  # type: ignore[attr-defined]
                return v1.VersionResponse(runtime_name="recorder").SerializeToString()
            got = v1.CreateContainerRequest.FromString(request)
            size = len(got.config.annotations.get("pad", ""))
            self.sizes.append(size)
            return v1.CreateContainerResponse(
                container_id=f"{got.config.metadata.name}:{size}"
            ).SerializeToString()

        return grpc.unary_unary_rpc_method_handler(unary)


# The runtime keeps HTTP/2 windows at 64 KiB (as containerd's grpc-go starts): rewritten requests
# then have to wait for its WINDOW_UPDATEs, and any drift in the relay's accounting shows quickly.
SMALL_WINDOWS = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 65535)]


def _recorder_bed(recorder: Recorder, hooks: HookTable, **config: Any) -> Any:
    async def upstream(endpoint: str) -> grpc.aio.Server:
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20), *SMALL_WINDOWS])
        server.add_generic_rpc_handlers((recorder,))
        server.add_insecure_port(endpoint)
        await server.start()
        return server

    return bed(hooks, upstream=upstream, relay_mode="frames", **config)


def _resize_hook(change: int) -> HookTable:
    async def pre(request: Message, info: MethodInfo) -> Message:
        annotations = request.config.annotations  # type: ignore[attr-defined]
        size = len(annotations.get("pad", "")) + change
        annotations["pad"] = "p" * max(size, 0)
        return request

    table = HookTable()
    table.register("CreateContainer", pre=pre)
    return table


def _create(ch: grpc.aio.Channel) -> Any:
    return ch.unary_unary(
        CREATE,
        request_serializer=v1.CreateContainerRequest.SerializeToString,
        response_deserializer=v1.CreateContainerResponse.FromString,
    )


def _request(name: str, pad: int) -> v1.CreateContainerRequest:
    config = v1.ContainerConfig(metadata=v1.ContainerMetadata(name=name), annotations={"pad": "p" * pad})
    return v1.CreateContainerRequest(pod_sandbox_id="s", config=config)


@pytest.mark.parametrize("change", [300, -300])
def test_two_thousand_rewritten_calls_on_one_connection_keep_flow_control_in_step(change: int) -> None:
    recorder = Recorder()

    async def main() -> None:
        async with _recorder_bed(recorder, _resize_hook(change)) as b, b.channel() as ch:
            create = _create(ch)
            for i in range(2000):
                reply = await create(_request(f"c{i}", 400), timeout=10)
                assert reply.container_id == f"c{i}:{400 + change}"
            assert b.relay.frames is not None and len(b.relay.frames.links) == 1  # one connection throughout
            # The client's idea of the runtime's window is still right: a burst of plain requests
            # (3 MiB) hardly has to wait in the relay. Had the +600 kB of rewrites been credited to
            # the client, it would run that far ahead of the runtime's real window.
            link = next(iter(b.relay.frames.links))
            version = ch.unary_unary(VERSION)
            await asyncio.gather(*(version(b"v" * 100_000, timeout=10) for _ in range(30)))
            assert link.core.win.queued == 0

    run(main())
    assert recorder.sizes == [400 + change] * 2000


@pytest.mark.parametrize("change", [300, -200_000])
def test_requests_near_one_mebibyte_are_rewritten_in_frames_the_runtime_accepts(change: int) -> None:
    recorder = Recorder()
    big = 1024 * 1024 - 2048

    async def main() -> None:
        async with _recorder_bed(recorder, _resize_hook(change)) as b, b.channel() as ch:
            create = _create(ch)
            version = ch.unary_unary(VERSION)
            for i in range(12):
                reply = await create(_request(f"big{i}", big), timeout=20)
                assert reply.container_id == f"big{i}:{big + change}"
                assert await version(b"", timeout=5)
            link = next(iter(b.relay.frames.links)) if b.relay.frames else None
            assert link is not None and link.core.win.initial_window == 65535  # small windows held

    run(main())
    assert recorder.sizes == [big + change] * 12


def test_hooked_and_passthrough_calls_interleave_while_a_hook_waits() -> None:
    recorder = Recorder()
    release = asyncio.Event()
    passed: list[int] = []

    async def pre(request: Message, info: MethodInfo) -> Message:
        await release.wait()  # held until plain calls on the same connection got through
        request.config.annotations["pad"] = "q" * 1000  # type: ignore[attr-defined]
        return request

    hooks = HookTable()
    hooks.register("CreateContainer", pre=pre)

    async def plain(ch: grpc.aio.Channel, i: int) -> None:
        reply = await ch.unary_unary(VERSION)(b"", timeout=10)
        assert v1.VersionResponse.FromString(reply).runtime_name == "recorder"
        passed.append(i)
        if len(passed) == 100:
            release.set()

    async def main() -> None:
        async with _recorder_bed(recorder, hooks) as b, b.channel() as ch:
            create = _create(ch)
            hooked = [create(_request(f"h{i}", 10 * i), timeout=10) for i in range(50)]
            replies = await asyncio.gather(*hooked, *(plain(ch, i) for i in range(100)))
            assert [r.container_id for r in replies[:50]] == [f"h{i}:1000" for i in range(50)]
            assert b.relay.frames is not None and len(b.relay.frames.links) == 1

    run(main())
    assert len(passed) == 100


def test_refusal_message_is_percent_encoded_and_the_connection_stays_usable() -> None:
    recorder = Recorder()

    async def pre(request: Message, info: MethodInfo) -> Message:
        raise HookError(grpc.StatusCode.FAILED_PRECONDITION, "pod ü/web: 100% of CPUs taken\nretry")

    hooks = HookTable()
    hooks.register("CreateContainer", pre=pre)

    async def main() -> None:
        async with _recorder_bed(recorder, hooks) as b, b.channel() as ch:
            for _ in range(300):  # refused requests must not eat the client's connection window
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await _create(ch)(_request("x", 4000), timeout=5)
                assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
                assert err.value.details() == "pod ü/web: 100% of CPUs taken\nretry"
            assert await ch.unary_unary(VERSION)(b"", timeout=5)

    run(main())
    assert recorder.sizes == []


def test_client_cancel_of_a_stream_reaches_the_runtime_with_hooks_active() -> None:
    hooks = _resize_hook(10)

    async def main() -> None:
        async with bed(hooks, relay_mode="frames") as b, b.channel() as ch:
            assert b.fake is not None
            events = ch.unary_stream(
                "/runtime.v1.RuntimeService/GetContainerEvents",
                request_serializer=v1.GetEventsRequest.SerializeToString,
                response_deserializer=v1.ContainerEventResponse.FromString,
            )
            streams = [events(v1.GetEventsRequest()) for _ in range(3)]
            for _ in range(100):
                if len(b.fake.store.subscribers) == 3:
                    break
                await asyncio.sleep(0.02)
            assert len(b.fake.store.subscribers) == 3
            for stream in streams:
                stream.cancel()
            for _ in range(100):
                if not b.fake.store.subscribers:
                    break
                await asyncio.sleep(0.02)
            assert not b.fake.store.subscribers

    run(main())


# -- failures ----------------------------------------------------------------------------------
@pytest.mark.parametrize("respond", [False, True], ids=["before-headers", "after-headers"])
def test_runtime_lost_mid_call_ends_open_calls_with_unavailable_naming_it(respond: bool) -> None:
    """A runtime that dies (its socket just closes) mid-call: not a status of its own, but ours."""

    async def dying_runtime(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(h2.settings())
        data = await reader.readexactly(len(h2.PREFACE))
        while True:  # find the call's HEADERS, answer with response headers if asked, then die
            head = await reader.readexactly(9)
            length, ftype, _, sid = h2.read_head(head, 0)
            data = await reader.readexactly(length)
            if ftype == h2.HEADERS:
                break
        if respond:
            block = b"\x88" + h2.hpack_int(31, 4) + h2.hpack_string(b"application/grpc")
            writer.write(h2.frame(h2.HEADERS, h2.END_HEADERS, sid, block))
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.transport.abort()
        del data

    servers: list[asyncio.AbstractServer] = []

    async def upstream(endpoint: str) -> Any:
        servers.append(await asyncio.start_unix_server(dying_runtime, endpoint[len("unix://") :]))
        return _Closing(servers[0])

    async def main() -> None:
        async with bed(upstream=upstream, relay_mode="frames") as b, b.channel() as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await ch.unary_unary(VERSION)(b"", timeout=10)
            assert err.value.code() is grpc.StatusCode.UNAVAILABLE
            assert b.runtime_endpoint in (err.value.details() or "")

    run(main())


class _Closing:
    """Gives an asyncio server the `stop(grace)` the test bed calls."""

    def __init__(self, server: asyncio.AbstractServer) -> None:
        self.server = server

    async def stop(self, grace: float | None) -> None:
        self.server.close()


def test_socket_mode_grace_and_removal_match_grpc_mode() -> None:
    recorder = Recorder()

    async def pre(request: Message, info: MethodInfo) -> Message:
        await asyncio.sleep(0.3)
        return request

    hooks = HookTable()
    hooks.register("CreateContainer", pre=pre)

    async def main() -> None:
        async with _recorder_bed(recorder, hooks) as b, b.channel() as ch:
            path = b.proxy_endpoint[len("unix://") :]
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
            call = _create(ch)(_request("graceful", 1), timeout=10)
            await asyncio.sleep(0.1)
            await b.relay.stop(5)  # the call in its hook completes within the grace
            assert (await call).container_id == "graceful:1"
            assert not os.path.exists(path)

    run(main())


def test_under_uvloop_as_cri_proxy_serve_runs_it() -> None:
    """`serve` runs on uvloop, whose transports differ from asyncio's (not Transport subclasses)."""
    uvloop = pytest.importorskip("uvloop")
    recorder = Recorder()

    async def main() -> None:
        async with _recorder_bed(recorder, _resize_hook(5)) as b, b.channel() as ch:
            for i in range(20):
                assert (await _create(ch)(_request(f"u{i}", 1), timeout=5)).container_id == f"u{i}:6"
                assert await ch.unary_unary(VERSION)(b"", timeout=5)

    uvloop.run(main())


def test_calls_are_measured_like_the_grpc_relay_does_when_an_observer_is_set() -> None:
    recorder = Recorder()
    seen: list[tuple[str, grpc.StatusCode, float, float]] = []

    class Observer:
        def observe(self, path: str, code: grpc.StatusCode, total: float, upstream: float) -> None:
            seen.append((path, code, total, upstream))

    async def pre(request: Message, info: MethodInfo) -> Message:
        if request.config.metadata.name == "no":  # type: ignore[attr-defined]
            raise HookError(grpc.StatusCode.FAILED_PRECONDITION, "refused")
        return request

    hooks = HookTable()
    hooks.register("CreateContainer", pre=pre)

    async def main() -> None:
        async with _recorder_bed(recorder, hooks) as b:
            b.relay.forwarder.observer = Observer()  # as serve.py sets it, before clients connect
            async with b.channel() as ch:
                await ch.unary_unary(VERSION)(b"", timeout=5)
                await _create(ch)(_request("yes", 1), timeout=5)
                with pytest.raises(grpc.aio.AioRpcError):
                    await _create(ch)(_request("no", 1), timeout=5)

    run(main())
    assert [(p, c) for p, c, _, _ in seen] == [
        (VERSION, grpc.StatusCode.OK),
        (CREATE, grpc.StatusCode.OK),
        (CREATE, grpc.StatusCode.FAILED_PRECONDITION),
    ]
    assert all(total >= upstream >= 0 for _, _, total, upstream in seen)
    assert seen[2][3] == 0.0  # refused: the runtime never had it


def test_oversized_hooked_request_is_refused_with_resource_exhausted() -> None:
    recorder = Recorder()

    async def main() -> None:
        limited = _recorder_bed(recorder, _resize_hook(1), max_recv_message_bytes=1024 * 1024)
        async with limited as b, b.channel() as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _create(ch)(_request("huge", 2 * 1024 * 1024), timeout=10)
            assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (await _create(ch)(_request("small", 1), timeout=5)).container_id == "small:2"

    run(main())
    assert recorder.sizes == [2]


async def _read_frames(reader: asyncio.StreamReader, sid: int) -> list[tuple[int, int, bytes]]:
    """Frames for stream `sid` until it ends (answering the relay's SETTINGS/PING as a client must)."""
    got: list[tuple[int, int, bytes]] = []
    while True:
        head = await asyncio.wait_for(reader.readexactly(9), 10)
        length, ftype, flags, stream = h2.read_head(head, 0)
        payload = await reader.readexactly(length)
        if stream == sid:
            got.append((ftype, flags, payload))
            if flags & h2.END_STREAM:
                return got


def test_a_hand_written_client_with_padding_priority_and_continuation() -> None:
    """What gRPC libraries rarely send: PRIORITY on HEADERS, CONTINUATION, padded DATA (held, unpadded).

    (Padded HEADERS are forwarded as they are, and grpc-c, the test runtime, cannot parse them: the
    relay's side of that is covered by test_padding_and_priority_are_removed_from_fragments.)
    """
    recorder = Recorder()
    encoder = hpack.Encoder()
    decoder = hpack.Decoder()

    def request_block(i: int) -> bytes:
        return bytes(
            encoder.encode(
                [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", CREATE),
                    (":authority", "localhost"),
                    ("content-type", "application/grpc"),
                    ("te", "trailers"),
                    ("x-big", str(i) + "b" * 3000),  # in 1,000-byte frames: CONTINUATION
                    ("x-call", "same"),  # indexed: later blocks refer to the dynamic table
                ]
            )
        )

    async def call(writer: asyncio.StreamWriter, reader: asyncio.StreamReader, sid: int) -> str:
        block = request_block(sid)
        first, rest = block[:1000], block[1000:]
        flags = h2.PRIORITY_FLAG | (0 if rest else h2.END_HEADERS)
        writer.write(h2.frame(h2.HEADERS, flags, sid, b"\x00\x00\x00\x00\x10" + first))
        while rest:
            piece, rest = rest[:1000], rest[1000:]
            writer.write(h2.frame(h2.CONTINUATION, 0 if rest else h2.END_HEADERS, sid, piece))
        body = h2.grpc_message(_request(f"raw{sid}", 3000).SerializeToString())
        half = len(body) // 2
        writer.write(h2.frame(h2.DATA, h2.PADDED, sid, b"\x03" + body[:half] + b"\x00\x00\x00"))
        writer.write(h2.frame(h2.DATA, h2.END_STREAM, sid, body[half:]))
        await writer.drain()
        frames = await _read_frames(reader, sid)
        headers: dict[str, str] = {}
        message = b""
        for ftype, flags, payload in frames:
            if ftype == h2.HEADERS:
                headers.update(decoder.decode(h2.header_fragment(flags, payload)))
            elif ftype == h2.DATA:
                message += h2.unpad(flags, payload)
        assert headers.get("grpc-status") == "0", headers
        framed = h2.single_grpc_message(message)
        assert framed is not None
        return str(v1.CreateContainerResponse.FromString(framed[1]).container_id)

    async def main() -> None:
        async with _recorder_bed(recorder, _resize_hook(100)) as b:
            reader, writer = await asyncio.open_unix_connection(b.proxy_endpoint[len("unix://") :])
            writer.write(h2.PREFACE + h2.settings() + h2.window_update(0, 1 << 24))
            for sid in (1, 3, 5):
                assert await call(writer, reader, sid) == f"raw{sid}:3100"
            writer.close()

    run(main())
    assert recorder.sizes == [3100] * 3
