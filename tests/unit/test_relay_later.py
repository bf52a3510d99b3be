"""The hooks after a call wait a moment after its answer (`transport.AFTER_WAIT`), so the caller
woken by the answer gets the CPU first; nothing later may see the state without them: any later
call's hook on any link (pre, ready, post-first), an admin view and the relay's stop run them
first, in the order their calls ended; a later call with no hook on its path goes on without
them. Tested with the moment made long (a minute), so only those can
have run them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h2.connection
import h2.events
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cri_api.v1 import api_pb2 as pb
from cri_proxy.config import Config
from cri_proxy.relay import transport
from cri_proxy.relay.hooks import HookTable, Ready
from cri_proxy.relay.transport import FrameRelay, Link
from tests.unit.enforce_support import node
from tests.unit.link_support import connected, send_call
from tests.unit.relay_support import bed, run, until

REMOVE = "/runtime.v1.RuntimeService/RemoveContainer"
START = "/runtime.v1.RuntimeService/StartContainer"
UPDATE = "/runtime.v1.RuntimeService/UpdateContainerResources"
CREATE = "/runtime.v1.RuntimeService/CreateContainer"


@pytest.fixture
def long_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "AFTER_WAIT", 60.0)


def _empty_answer(server: h2.connection.H2Connection, sid: int) -> bytes:
    server.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
    server.send_data(sid, b"\0\0\0\0\0")
    server.send_headers(sid, [("grpc-status", "0")], end_stream=True)
    return server.data_to_send()


class Node:
    """Links of one relay, each an h2 client and an h2 runtime on recording transports. Calls:
    RemoveContainer (a hook after the call that waits), StartContainer (post-first),
    UpdateContainerResources (a pre hook that notes which hooks after calls had run by then) and
    CreateContainer (a ready hook that notes the same, and a hook after the call that waits)."""

    def __init__(self, links: int) -> None:
        self.ran: list[str] = []  # hooks after calls, as they ran: the container id of each
        self.answered: list[str] = []  # calls with such hooks, in the order their answers came
        self.seen: list[tuple[list[str], list[str]]] = []  # per update's pre hook: (answered, ran)
        self.serial = 0
        self.received: list[str] = []  # the container id of each request the runtimes got, in order
        table = HookTable()
        table.register("RemoveContainer", post=self._after)
        table.register("StartContainer", post=self._after, post_first=True)
        table.register("UpdateContainerResources", pre=self._update)
        table.register("CreateContainer", ready=self._ready, post=self._after)
        self.relay = FrameRelay(Config(runtime_endpoint="unix:///nonexistent/runtime.sock"), table)
        self.logs: list[list[tuple[str, bytes]]] = []
        self.links: list[tuple[Link, h2.connection.H2Connection, h2.connection.H2Connection]] = []
        self.open: list[list[tuple[int, str]]] = []  # per link: (stream, id) sent, not answered
        for _ in range(links):
            log: list[tuple[str, bytes]] = []
            self.logs.append(log)
            self.links.append(connected(table, log, relay=self.relay))
            self.open.append([])

    async def _after(self, request: Any, response: Any, info: Any) -> None:
        self.ran.append(request.pod_sandbox_id if info.name == "CreateContainer" else request.container_id)

    async def _update(self, request: Any, info: Any) -> Any:
        self.seen.append((list(self.answered), list(self.ran)))
        return request

    def _ready(self, message: bytes, info: Any) -> Ready:
        self.seen.append((list(self.answered), list(self.ran)))
        return Ready(b"", lambda sent: None)

    def call(self, at: int, path: str) -> None:
        link, client, _ = self.links[at]
        self.serial += 1
        cid = f"{path.rsplit('/', 1)[1]}-{self.serial}"
        if path == UPDATE:
            body = pb.UpdateContainerResourcesRequest(container_id=cid, linux=pb.LinuxContainerResources())
        elif path == CREATE:  # its sandbox's id in the field where the others have the container's
            body = pb.CreateContainerRequest(pod_sandbox_id=cid)
        else:
            body = pb.RemoveContainerRequest(container_id=cid)
        sid = send_call(client, body.SerializeToString(), path)
        link.data_received(client.data_to_send())
        self._to_runtime(at)
        self.open[at].append((sid, cid))

    def _to_runtime(self, at: int) -> None:
        log, server = self.logs[at], self.links[at][2]
        for who, data in log:
            if who == "runtime":
                for event in server.receive_data(data):
                    if isinstance(event, h2.events.DataReceived) and event.data:
                        self.received.append(
                            pb.RemoveContainerRequest.FromString(event.data[5:]).container_id
                        )
        log.clear()

    def answer(self, at: int) -> None:
        """The runtime answers the oldest call it has on link `at`."""
        link, _, server = self.links[at]
        sid, cid = self.open[at].pop(0)
        if not cid.startswith("UpdateContainerResources"):
            self.answered.append(cid)
        link.runtime_data(_empty_answer(server, sid))
        self._to_runtime(at)

    def check(self) -> None:
        """The hooks ran in the order their calls' answers came, once each; every update's pre hook
        came after all the hooks of the calls answered before it."""
        assert self.ran == self.answered[: len(self.ran)]
        for answered, ran in self.seen:
            assert ran == answered


Step = tuple[str, int, str]
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("call"), st.integers(0, 1), st.sampled_from([REMOVE, START, UPDATE, CREATE])),
        st.tuples(st.just("answer"), st.integers(0, 1), st.just("")),
        st.tuples(st.just("due"), st.just(0), st.just("")),
    ),
    max_size=40,
)


@given(STEPS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_hooks_after_calls_run_in_order_and_before_anything_that_could_see_them(
    long_wait: None, steps: list[Step]
) -> None:
    """Random interleavings of calls and answers on two links of one relay, and the wait coming
    due: after each step the hooks that ran are those of the first calls answered, in that order;
    an update's pre hook and a create's ready hook always see every call answered before them; a
    post-first hook runs the ones waiting first; the relay's stop runs the rest; a start's or a
    remove's request (no hook on its path) leaves them waiting."""

    async def main() -> None:
        n = Node(2)
        for kind, at, path in steps:
            if kind == "call":
                waiting = len(n.relay.later)
                n.call(at, path)
                if path in (REMOVE, START):
                    assert len(n.relay.later) == waiting
            elif kind == "answer" and n.open[at]:
                n.answer(at)
                if n.answered and n.answered[-1].startswith("StartContainer"):
                    assert n.ran == n.answered  # post-first: all before it ran, then it
            elif kind == "due" and n.relay.later_due is not None:
                n.relay.later_due._run()  # the timer's callback, as the loop runs it when due
            n.check()
        await n.relay.stop(0)
        assert n.ran == n.answered and not n.relay.later and n.relay.later_due is None

    run(main())


def test_the_hooks_after_a_call_run_on_their_own_a_moment_after_its_answer() -> None:
    """With no other call to run them first, the wait's timer does, once."""

    async def main() -> None:
        n = Node(1)
        n.call(0, REMOVE)
        n.answer(0)
        assert n.ran == [] and n.relay.later_due is not None
        await until(lambda: n.ran == n.answered, "the hook after the call ran")
        assert n.relay.later_due is None and not n.relay.later

    run(main())


def test_a_start_goes_on_at_once_and_runs_the_hooks_waiting_before_its_own(long_wait: None) -> None:
    """A start has no hook on its request's path: its request goes to the runtime without the
    hooks after the calls answered before it (they run while runc works, or when its answer comes,
    before its post-first hook)."""

    async def main() -> None:
        n = Node(2)
        n.call(0, REMOVE)
        n.answer(0)
        n.call(1, START)
        assert n.received[-1] == "StartContainer-2"  # its request reached the runtime
        assert n.ran == [] and len(n.relay.later) == 1
        n.answer(1)
        assert n.ran == n.answered == ["RemoveContainer-1", "StartContainer-2"]

    run(main())


def test_the_relays_stop_runs_the_hooks_still_waiting(long_wait: None) -> None:
    """On real sockets: a call answered right before the relay stops has its hook after the call
    run by the stop, not dropped."""
    ran: list[str] = []

    async def removed(request: Any, response: Any, info: Any) -> None:
        ran.append(request.container_id)

    table = HookTable()
    table.register("RemoveContainer", post=removed)

    async def main() -> None:
        async with bed(table) as b, b.channel() as ch:
            assert b.fake is not None
            remove = ch.unary_unary(REMOVE)
            await remove(pb.RemoveContainerRequest(container_id="gone").SerializeToString())
            assert ran == []
            await b.relay.stop(0)
            assert ran == ["gone"]

    run(main())


def test_an_admin_view_right_after_a_create_shows_it(tmp_path: Path, long_wait: None) -> None:
    """ctl's views run the hooks after the calls answered so far first: the container a create
    just made is in the cpusets view by its id, never missing nor pending."""

    async def main() -> None:
        async with node(tmp_path) as n:
            sandbox, _ = await n.run_pod("ls", "burstable", containers=())
            await n.settle()
            config = n.pb.ContainerConfig(
                metadata=n.pb.ContainerMetadata(name="main"),
                image=n.pb.ImageSpec(image="localhost/busybox:latest"),
                linux=n.pb.LinuxContainerConfig(resources=n.pb.LinuxContainerResources(cpu_shares=512)),
            )
            request = n.pb.CreateContainerRequest(pod_sandbox_id=sandbox, config=config)
            cid = (await n.stub().CreateContainer(request)).container_id
            assert n.proxy.relay.frames is not None and n.proxy.relay.frames.later  # still waiting
            rows = {row["id"]: row for row in await n.introspect("Cpusets")}
            assert cid in rows and rows[cid]["state"] == "created"
            assert not any(key.startswith("pending/") for key in rows)

    run(main())
