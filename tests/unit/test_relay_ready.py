"""A hooked request whose hooks have their answer ready (`Hooks.ready`) goes on from the core's
own read: after its HEADERS, with the patch appended, no pre hook asked for; the hooks after the
call get the request as sent."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import pytest
from google.protobuf.message import Message
from loguru import logger

from cri_api.v1 import api_pb2 as v1
from cri_proxy.relay.core import Limits, LinkCore, Readied, RunPost, RunPre
from cri_proxy.relay.hookrun import HookRunner
from cri_proxy.relay.hooks import FailPolicy, Hooks, Ready
from cri_proxy.relay.methods import KNOWN

CREATE = "/runtime.v1.RuntimeService/CreateContainer"
PATCH = v1.CreateContainerRequest(
    config=v1.ContainerConfig(
        linux=v1.LinuxContainerConfig(resources=v1.LinuxContainerResources(cpuset_cpus="2-3"))
    )
).SerializeToString()


async def _pre(request, info):  # type: ignore[no-untyped-def]
    return request


async def _post(request, response, info):  # type: ignore[no-untyped-def]
    return None


def _framed(body: bytes) -> bytes:
    return struct.pack(">BI", 0, len(body)) + body


def _call(
    ready_for: bool | None, trailers: bool = False, decoded: str = "", core_out: list[LinkCore] | None = None
) -> tuple[list[h2.events.Event], list[object], bytes]:
    """One create through a core between two h2 peers: (the runtime's events, the core's events,
    the request the client sent). `decoded`: what the adapter hands back for a ready request
    before the answer comes (`request_decoded`): "" nothing, "message" the request decoded,
    "none" that it did not decode."""

    def ready(message: bytes, info: object) -> Ready | None:
        if ready_for is None:
            raise RuntimeError("a bug in the ready hook")
        return Ready(PATCH, lambda sent: None) if ready_for else None

    core = LinkCore(
        lambda path: Hooks(pre=_pre, post=_post, ready=ready) if path == CREATE else None, Limits()
    )
    if core_out is not None:
        core_out.append(core)
    cfg = dict(header_encoding=None)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, **cfg))
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, **cfg))
    client.initiate_connection()
    server.initiate_connection()
    core.receive_from_client(client.data_to_send())
    core.receive_from_runtime(server.data_to_send())
    client.receive_data(b"".join(core.take_client()))
    server.receive_data(b"".join(core.take_runtime()))
    request = v1.CreateContainerRequest(
        pod_sandbox_id="p1",
        config=v1.ContainerConfig(
            metadata=v1.ContainerMetadata(name="c", attempt=1),
            linux=v1.LinuxContainerConfig(resources=v1.LinuxContainerResources(cpuset_cpus="0-7")),
        ),
    ).SerializeToString()
    client.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", CREATE), (":authority", "x")])
    client.send_data(1, _framed(request), end_stream=not trailers)
    if trailers:
        client.send_headers(1, [("x-t", "1")], end_stream=True)
    core.receive_from_client(client.data_to_send())
    events = core.take_events()
    for event in events:
        if isinstance(event, Readied) and decoded:
            message = v1.CreateContainerRequest.FromString(event.request) if decoded == "message" else None
            core.request_decoded(event.stream, message)
    got = server.receive_data(b"".join(core.take_runtime()))
    # the runtime answers; the core then asks for the hooks after the call
    server.send_headers(1, [(":status", "200"), ("content-type", "application/grpc")])
    server.send_data(1, _framed(v1.CreateContainerResponse(container_id="c1").SerializeToString()))
    server.send_headers(1, [("grpc-status", "0")], end_stream=True)
    core.receive_from_runtime(server.data_to_send())
    core.take_client()
    core.read_answers()
    events += core.take_events()
    return got, events, request


def test_a_ready_request_goes_on_at_once_with_its_patch() -> None:
    got, events, request = _call(ready_for=True)
    kinds = [type(e) for e in got if not isinstance(e, h2.events.SettingsAcknowledged)]
    assert kinds[0] is h2.events.RequestReceived  # its HEADERS first, then the patched DATA
    body = b"".join(e.data for e in got if isinstance(e, h2.events.DataReceived))
    assert body == _framed(request + PATCH)
    assert any(isinstance(e, h2.events.StreamEnded) for e in got)
    assert not any(isinstance(e, RunPre) for e in events)
    (readied,) = [e for e in events if isinstance(e, Readied)]
    assert readied.stream == 1 and readied.request == request + PATCH
    (post,) = [e for e in events if isinstance(e, RunPost)]
    sent = v1.CreateContainerRequest.FromString(post.request)  # as sent: the patch merged in
    assert sent.config.linux.resources.cpuset_cpus == "2-3" and sent.config.metadata.name == "c"


def test_the_hooks_after_the_call_get_the_request_decoded_after_the_write_or_none() -> None:
    _, events, _ = _call(ready_for=True, decoded="message")
    (post,) = [e for e in events if isinstance(e, RunPost)]
    assert isinstance(post.request, v1.CreateContainerRequest)  # not decoded twice
    assert post.request.config.linux.resources.cpuset_cpus == "2-3"
    _, events, _ = _call(ready_for=True, decoded="none")  # it did not decode: no hook sees it
    assert not [e for e in events if isinstance(e, RunPost)]


def test_a_request_not_ready_waits_for_its_pre_hook() -> None:
    got, events, _ = _call(ready_for=False)
    assert [e for e in events if isinstance(e, RunPre)]
    assert not any(isinstance(e, h2.events.DataReceived) for e in got)


def test_a_ready_hook_that_raises_leaves_the_request_to_the_pre_hook() -> None:
    cores: list[LinkCore] = []
    got, events, _ = _call(ready_for=None, core_out=cores)
    assert [e for e in events if isinstance(e, RunPre)]
    assert not [e for e in events if isinstance(e, Readied)]
    assert not any(isinstance(e, h2.events.DataReceived) for e in got)
    assert any("ready hook failed" in w and "a bug" in w for w in cores[0].warnings), cores[0].warnings


def test_a_request_with_trailers_takes_the_pre_hook() -> None:
    _, events, _ = _call(ready_for=True, trailers=True)
    assert [e for e in events if isinstance(e, RunPre)]
    assert not [e for e in events if isinstance(e, Readied)]


# -- after the write: the hook runner decodes what went on ---------------------------------------
INFO = KNOWN[CREATE]
SENT = v1.CreateContainerRequest(
    pod_sandbox_id="p1", config=v1.ContainerConfig(metadata=v1.ContainerMetadata(name="c"))
).SerializeToString()
UNDECODABLE = b"\x0a\x02\xff\xfe" + PATCH  # a sandbox id that is not UTF-8, then the patch


@pytest.fixture
def lines() -> Iterator[list[str]]:
    """What the runner logs, WARNING and up."""
    got: list[str] = []
    sink = logger.add(lambda m: got.append(str(m)), level="WARNING", format="{message}")
    yield got
    logger.remove(sink)


def _runner() -> HookRunner:
    return HookRunner(lambda: FailPolicy.IGNORE)


def test_a_ready_request_is_decoded_as_sent_for_its_after_and_counted_ready() -> None:
    runner = _runner()
    seen: list[Message] = []
    returned = runner.readied(INFO, Ready(PATCH, seen.append), SENT + PATCH)
    (sent,) = seen
    assert returned is sent  # for the hooks after the call, through the core
    assert isinstance(sent, v1.CreateContainerRequest)
    assert sent.pod_sandbox_id == "p1" and sent.config.linux.resources.cpuset_cpus == "2-3"
    assert runner.runs == {("CreateContainer", "pre", "ready"): 1}


def test_a_ready_request_that_does_not_decode_is_counted_logged_and_seen_by_no_hook(
    lines: list[str],
) -> None:
    runner = _runner()
    seen: list[object] = []

    async def post(request: Any, response: Any, info: Any) -> None:
        seen.append(("post", request))

    async def failed(request: Any, code: grpc.StatusCode, info: Any) -> None:
        seen.append(("failed", request))

    hooks = Hooks(post=post, failed=failed)
    assert runner.readied(INFO, Ready(PATCH, seen.append), UNDECODABLE) is None
    response = v1.CreateContainerResponse(container_id="c1").SerializeToString()
    asyncio.run(runner.post(INFO, hooks, UNDECODABLE, response))
    asyncio.run(runner.failed(INFO, hooks, UNDECODABLE, grpc.StatusCode.INTERNAL.value[0]))
    assert seen == []
    assert runner.runs == {("CreateContainer", "pre", "undecodable"): 1}
    assert any("does not decode" in line and "forwarded without hooks" in line for line in lines), lines
    # and the hooks after the call decode a ready request that does
    asyncio.run(runner.post(INFO, hooks, SENT + PATCH, response))
    asyncio.run(runner.failed(INFO, hooks, SENT + PATCH, grpc.StatusCode.INTERNAL.value[0]))
    assert [kind for kind, _ in seen] == ["post", "failed"]  # type: ignore[misc]
    assert all(r.config.linux.resources.cpuset_cpus == "2-3" for _, r in seen)  # type: ignore[misc]


def test_an_after_that_raises_is_counted_and_logged_the_call_goes_on(lines: list[str]) -> None:
    runner = _runner()

    def after(sent: Message) -> None:
        raise RuntimeError("boom")

    runner.readied(INFO, Ready(PATCH, after), SENT)
    assert runner.runs == {("CreateContainer", "pre", "error"): 1}
    assert any("boom" in line for line in lines), lines
