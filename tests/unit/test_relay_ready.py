"""A hooked request whose hooks have their answer ready (`Hooks.ready`) goes on from the core's
own read: after its HEADERS, with the patch appended, no pre hook asked for; the hooks after the
call get the request as sent. So does, as it came, one whose method is hooked only after its call
(`HookRunner.as_is`: not under the `fail` policy)."""

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
START = "/runtime.v1.RuntimeService/StartContainer"
PATCH = v1.CreateContainerRequest(
    config=v1.ContainerConfig(
        linux=v1.LinuxContainerConfig(resources=v1.LinuxContainerResources(cpuset_cpus="2-3"))
    )
).SerializeToString()


async def _pre(request, info):  # type: ignore[no-untyped-def]
    return request


async def _post(request, response, info):  # type: ignore[no-untyped-def]
    return None


async def _failed(request, code, info):  # type: ignore[no-untyped-def]
    return None


def _framed(body: bytes) -> bytes:
    return struct.pack(">BI", 0, len(body)) + body


def _call(
    ready_for: bool | None,
    trailers: bool = False,
    decoded: str = "",
    core_out: list[LinkCore] | None = None,
    start_as_is: bool | None = None,
) -> tuple[list[h2.events.Event], list[object], bytes]:
    """One create through a core between two h2 peers: (the runtime's events, the core's events,
    the request the client sent). `decoded`: what the adapter hands back for a ready request
    before the answer comes (`request_decoded`): "" nothing, "message" the request decoded,
    "none" that it did not decode. `start_as_is` not None: a StartContainer instead, hooked only
    after the call, and what the core's `as_is` answers for it."""

    def ready(message: bytes, info: object) -> Ready | None:
        if ready_for is None:
            raise RuntimeError("a bug in the ready hook")
        return Ready(PATCH, lambda sent: None) if ready_for else None

    path = CREATE if start_as_is is None else START
    hooks = Hooks(pre=_pre, post=_post, ready=ready) if start_as_is is None else Hooks(post=_post)
    core = LinkCore(
        lambda asked: hooks if asked == path else None,
        Limits(),
        as_is=None if start_as_is is None else lambda hooks: start_as_is,
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
    if start_as_is is not None:
        request = v1.StartContainerRequest(container_id="c1").SerializeToString()
    client.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x")])
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
    answer = v1.CreateContainerResponse(container_id="c1") if path == CREATE else v1.StartContainerResponse()
    server.send_data(1, _framed(answer.SerializeToString()))
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


def test_a_request_hooked_only_after_its_call_goes_on_as_it_came_and_is_decoded_after_it() -> None:
    got, events, request = _call(ready_for=None, start_as_is=True)
    assert not [e for e in events if isinstance(e, RunPre | Readied)]  # no turn of a hook on its path
    body = b"".join(e.data for e in got if isinstance(e, h2.events.DataReceived))
    assert body == _framed(request)  # from the client's read, as it came
    assert any(isinstance(e, h2.events.StreamEnded) for e in got)
    (post,) = [e for e in events if isinstance(e, RunPost)]
    assert post.request == request  # bytes: the runner decodes them for the hook (`_sent`)


def test_a_request_hooked_only_after_its_call_waits_for_the_runner_when_as_is_says_no() -> None:
    """As under the `fail` policy (`HookRunner.as_is`): decoded on its path, refused if it does not."""
    got, events, _ = _call(ready_for=None, start_as_is=False)
    assert [e for e in events if isinstance(e, RunPre)]
    assert not any(isinstance(e, h2.events.DataReceived) for e in got)


def test_the_runner_sends_as_is_only_what_has_hooks_after_the_call_alone_and_may_go_undecoded() -> None:
    ignore, fail = HookRunner(lambda: FailPolicy.IGNORE), HookRunner(lambda: FailPolicy.FAIL)
    ready: Any = lambda message, info: None  # noqa: E731
    assert ignore.as_is(Hooks(post=_post)) and ignore.as_is(Hooks(failed=_failed))
    assert not ignore.as_is(Hooks(pre=_pre, post=_post)) and not ignore.as_is(Hooks(post=_post, ready=ready))
    assert not fail.as_is(Hooks(post=_post))  # a request that does not decode is refused first
    assert fail.as_is(Hooks(post=_post, fail_policy=FailPolicy.IGNORE))  # the method's own policy
    assert not ignore.as_is(Hooks(post=_post, fail_policy=FailPolicy.FAIL))


def test_the_hooks_after_the_call_get_a_request_that_went_as_it_came_decoded(lines: list[str]) -> None:
    runner, seen = _runner(), []

    async def post(request: Any, response: Any, info: Any) -> None:
        seen.append(request)

    info = KNOWN[START]
    raw = v1.StartContainerRequest(container_id="c1").SerializeToString()
    asyncio.run(runner.post(info, Hooks(post=post), raw, b""))
    assert seen == [v1.StartContainerRequest(container_id="c1")]
    asyncio.run(runner.post(info, Hooks(post=post), b"\x0a\x02\xff\xfe", b""))  # an id not UTF-8
    assert len(seen) == 1 and runner.runs == {
        ("StartContainer", "post", "ok"): 1,
        ("StartContainer", "pre", "undecodable"): 1,
    }
    assert any("StartContainer" in line and "does not decode" in line for line in lines), lines


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
    # each decode that fails is counted: `readied`'s, and the hooks' after the call of bytes that
    # went as they came (`HookRunner.as_is`; in the relay a call gets one of the three)
    assert runner.runs == {("CreateContainer", "pre", "undecodable"): 3}
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
