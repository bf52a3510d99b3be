"""The relay forwards every method as raw bytes, with status, metadata and deadlines intact."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import grpc
import grpc.aio
import pytest

from cri_api.v1 import api_pb2 as v1
from cri_proxy.relay.methods import KNOWN, Shape
from tests.unit.relay_support import bed, raw_server, run


@pytest.fixture(autouse=True, params=["grpc", "frames"])
def relay_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs against both relays: this module's `bed` gets the relay_mode."""
    from tests.unit import relay_support

    monkeypatch.setitem(globals(), "bed", functools.partial(relay_support.bed, relay_mode=request.param))
    return str(request.param)


class Echo(grpc.GenericRpcHandler):
    """Upstream that records what reached it and answers with `path|request` bytes."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes, Any, float | None]] = []

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        path: str = details.method  # type: ignore[attr-defined]
        info = KNOWN.get(path)

        async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            self.seen.append((path, request, context.invocation_metadata(), context.time_remaining()))
            await context.send_initial_metadata((("x-initial", "i1"),))
            context.set_trailing_metadata((("x-trailing", "t1"), ("x-bin-bin", b"\x00\x01")))
            if request == b"fail":
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "upstream says no",
                    (("grpc-status-details-bin", b"\x08\x09"), ("x-why", "because")),
                )
            if request.startswith(b"big:"):
                return b"z" * int(request[4:])
            if request == b"deadline":
                left = context.time_remaining()
                return b"none" if left is None else f"{left:.3f}".encode()
            return path.encode() + b"|" + request

        async def stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            async for request in requests:
                self.seen.append((path, request, context.invocation_metadata(), context.time_remaining()))
                for i in range(3 if "/Stream" in path else 1):  # unary-shaped unknown calls get one
                    yield request + str(i).encode()

        if info is not None and info.shape is Shape.UNARY:
            return grpc.unary_unary_rpc_method_handler(unary)
        return grpc.stream_stream_rpc_method_handler(stream)


def _echo_bed(echo: Echo, **config: Any) -> Any:
    async def upstream(endpoint: str) -> grpc.aio.Server:
        return await raw_server(endpoint, echo)

    return bed(upstream=upstream, **config)


def test_every_known_unary_method_is_forwarded_byte_for_byte() -> None:
    echo = Echo()
    unary = sorted(p for p, i in KNOWN.items() if i.shape is Shape.UNARY)

    async def main() -> None:
        async with _echo_bed(echo) as b, b.channel() as ch:
            for path in unary:
                body = b"\x0a\x03abc\xf8\x07\x01"  # field 1 plus an unknown field 127
                assert await ch.unary_unary(path)(body) == path.encode() + b"|" + body

    run(main())
    assert [s[0] for s in echo.seen] == unary
    assert all(s[1] == b"\x0a\x03abc\xf8\x07\x01" for s in echo.seen)
    assert {p.split(".")[1] for p in unary} == {"v1", "v1alpha2"}
    assert len(unary) > 60


def test_unknown_and_streaming_methods_are_relayed_as_streams() -> None:
    echo = Echo()

    async def main() -> None:
        async with _echo_bed(echo) as b, b.channel() as ch:
            # a unary method from a newer kubelet, unknown to our proto
            future = ch.unary_unary("/runtime.v1.RuntimeService/SomeMethodFrom2030")
            assert await future(b"hi") == b"hi0"
            call = ch.stream_stream("/runtime.v1.RuntimeService/StreamSomething")(iter([b"a", b"b"]))
            assert [r async for r in call] == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]

    run(main())
    assert ("/runtime.v1.RuntimeService/SomeMethodFrom2030", b"hi") in [s[:2] for s in echo.seen]


def test_status_details_and_metadata_pass_through_both_ways() -> None:
    echo = Echo()

    async def main() -> None:
        async with _echo_bed(echo) as b, b.channel() as ch:
            call = ch.unary_unary("/runtime.v1.RuntimeService/Version")(b"x", metadata=(("x-client", "k1"),))
            assert await call == b"/runtime.v1.RuntimeService/Version|x"
            assert ("x-initial", "i1") in tuple(await call.initial_metadata())
            trailing = tuple(await call.trailing_metadata())
            assert ("x-trailing", "t1") in trailing and ("x-bin-bin", b"\x00\x01") in trailing
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await ch.unary_unary("/runtime.v1.RuntimeService/Version")(b"fail")
            assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert err.value.details() == "upstream says no"
            trailing = tuple(err.value.trailing_metadata())
            assert ("grpc-status-details-bin", b"\x08\x09") in trailing and ("x-why", "because") in trailing

    run(main())
    assert ("x-client", "k1") in tuple(echo.seen[0][2])


def test_deadline_is_propagated_only_when_the_caller_set_one() -> None:
    echo = Echo()

    async def main() -> tuple[bytes, bytes]:
        async with _echo_bed(echo) as b, b.channel() as ch:
            version = ch.unary_unary("/runtime.v1.RuntimeService/Version")
            return await version(b"deadline"), await version(b"deadline", timeout=30)

    without, with_deadline = run(main())
    assert without == b"none"
    assert 25.0 < float(with_deadline) <= 30.5  # grpc rounds deadlines up a little


def test_sixteen_mebibyte_messages_pass_and_the_limit_is_configurable() -> None:
    echo = Echo()
    ten_mib = 10 * 1024 * 1024

    async def main() -> None:
        async with _echo_bed(echo) as b, b.channel() as ch:
            list_containers = ch.unary_unary("/runtime.v1.RuntimeService/ListContainers")
            reply = await list_containers(f"big:{ten_mib}".encode())
            assert len(reply) == ten_mib
            big_request = b"q" * ten_mib
            echoed = await ch.unary_unary("/runtime.v1.RuntimeService/Version")(big_request)
            assert echoed.endswith(big_request)
        async with _echo_bed(echo, max_recv_message_bytes=1024 * 1024) as b, b.channel() as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                list_containers = ch.unary_unary("/runtime.v1.RuntimeService/ListContainers")
                await list_containers(f"big:{2 * 1024 * 1024}".encode())
            assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED

    run(main())


def test_runtime_down_gives_unavailable_naming_it_then_recovers_without_restart() -> None:
    from cri_proxy.fake_runtime.server import FakeOptions, FakeRuntime

    async def main() -> None:
        async with bed(start_runtime=False) as b, b.channel() as ch:
            version = ch.unary_unary(
                "/runtime.v1.RuntimeService/Version",
                request_serializer=v1.VersionRequest.SerializeToString,
                response_deserializer=v1.VersionResponse.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await version(v1.VersionRequest(), timeout=5)
            assert err.value.code() is grpc.StatusCode.UNAVAILABLE
            assert b.runtime_endpoint in (err.value.details() or "")
            fake = FakeRuntime(FakeOptions(listen=b.runtime_endpoint))
            await fake.start()
            try:
                for _ in range(100):  # the relay's channel reconnects on its own (back-off <= 1 s)
                    try:
                        reply = await version(v1.VersionRequest(), timeout=5)
                        break
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() is grpc.StatusCode.UNAVAILABLE
                        await asyncio.sleep(0.1)
                else:
                    pytest.fail("the relay never reached the runtime after it came back")
                assert reply.runtime_name == "cri-proxy-fake-runtime"
            finally:
                await fake.stop(0)

    run(main())


def test_container_events_stream_and_a_client_cancel_cancels_upstream() -> None:
    async def main() -> None:
        async with bed() as b, b.channel() as ch:
            assert b.fake is not None
            events = ch.unary_stream(
                "/runtime.v1.RuntimeService/GetContainerEvents",
                request_serializer=v1.GetEventsRequest.SerializeToString,
                response_deserializer=v1.ContainerEventResponse.FromString,
            )
            stream = events(v1.GetEventsRequest())
            for _ in range(50):
                if b.fake.store.subscribers:
                    break
                await asyncio.sleep(0.02)
            assert len(b.fake.store.subscribers) == 1
            rt = ch.unary_unary(
                "/runtime.v1.RuntimeService/RunPodSandbox",
                request_serializer=v1.RunPodSandboxRequest.SerializeToString,
                response_deserializer=v1.RunPodSandboxResponse.FromString,
            )
            create = ch.unary_unary(
                "/runtime.v1.RuntimeService/CreateContainer",
                request_serializer=v1.CreateContainerRequest.SerializeToString,
                response_deserializer=v1.CreateContainerResponse.FromString,
            )
            sandbox = (await rt(v1.RunPodSandboxRequest(config=v1.PodSandboxConfig()))).pod_sandbox_id
            cid = (await create(v1.CreateContainerRequest(pod_sandbox_id=sandbox))).container_id
            event = await asyncio.wait_for(stream.read(), 5)
            assert event.container_id == cid
            assert event.container_event_type == v1.CONTAINER_CREATED_EVENT
            stream.cancel()
            for _ in range(100):
                if not b.fake.store.subscribers:
                    break
                await asyncio.sleep(0.02)
            assert not b.fake.store.subscribers, "upstream stream still open after the client cancelled"

    run(main())
