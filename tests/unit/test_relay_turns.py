"""What the frame relay's asyncio adapter writes, and when, for a hooked call (fake transports: the
byte-level behaviour is tested against real sockets and containerd elsewhere). A pre hook that ends
in the turn its request ended in lets the request's HEADERS and DATA leave in one write; a post hook
runs in the turn the answer came in, after the answer is written (and read: its header blocks are
decoded after the write), without a task of its own (before the write, for a post-first one); the
proxy's line about a create is written after its answer. One test checks on real sockets, under
both event loops, that "written" means in the client's socket already (both loops make the write's
system call at once when nothing waits to be sent)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest

from cri_api.v1 import api_pb2 as pb
from cri_proxy.config import Config
from cri_proxy.relay.hooks import HookTable
from cri_proxy.relay.transport import FrameRelay, Link
from tests.unit.relay_support import bed, run

PATH = "/runtime.v1.RuntimeService/CreateContainer"


class Transport:
    """Records every write (one entry per `write`/`writelines` call) into a shared log."""

    def __init__(self, name: str, log: list[tuple[str, bytes]]) -> None:
        self.name, self.log = name, log

    def write(self, data: bytes) -> None:
        self.log.append((self.name, bytes(data)))

    def writelines(self, chunks: Any) -> None:
        self.log.append((self.name, b"".join(bytes(c) for c in chunks)))

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def frames(data: bytes) -> list[int]:
    """The frame types in `data` (HTTP/2 frames, no preface)."""
    out, at = [], 0
    while at + 9 <= len(data):
        length = int.from_bytes(data[at : at + 3], "big")
        out.append(data[at + 3])
        at += 9 + length
    return out


def connected(
    table: HookTable, log: list[tuple[str, bytes]], window: int = 0
) -> tuple[Link, h2.connection.H2Connection, h2.connection.H2Connection]:
    """A Link between an h2 client and an h2 server (the runtime) on recording transports, the
    handshake done both ways; `window`: more connection window the server gives at once."""
    link = Link(FrameRelay(Config(runtime_endpoint="unix:///nonexistent/runtime.sock"), table))
    link.client = Transport("client", log)  # type: ignore[assignment]
    link.runtime_up(Transport("runtime", log))  # type: ignore[arg-type]
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    client.initiate_connection()
    server.initiate_connection()
    if window:
        server.increment_flow_control_window(window)
    link.data_received(client.data_to_send())
    link.runtime_data(server.data_to_send())
    for who, data in log:
        (server if who == "runtime" else client).receive_data(data)
    link.data_received(client.data_to_send())
    link.runtime_data(server.data_to_send())
    log.clear()
    return link, client, server


def send_call(client: h2.connection.H2Connection, body: bytes, path: str = PATH) -> int:
    """A request to `path` (CreateContainer) with `body`, HEADERS and DATA queued on `client`: its
    stream id."""
    sid: int = client.get_next_available_stream_id()
    client.send_headers(
        sid,
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "x"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ],
    )
    client.send_data(sid, b"\0" + len(body).to_bytes(4, "big") + body, end_stream=True)
    return sid


def test_a_hooked_call_takes_one_write_each_way_and_its_post_hook_runs_after_the_answer() -> None:
    log: list[tuple[str, bytes]] = []

    async def pre(request: Any, info: Any) -> Any:
        request.config.linux.resources.cpuset_cpus = "0-1"
        log.append(("pre", b""))
        return request

    async def post(request: Any, response: Any, info: Any) -> None:
        log.append(("post", response.container_id.encode()))

    async def main() -> None:
        table = HookTable()
        table.register("CreateContainer", pre=pre, post=post)
        link, client, server = connected(table, log)
        request = pb.CreateContainerRequest(pod_sandbox_id="p", config=pb.ContainerConfig())
        sid = send_call(client, request.SerializeToString())
        link.data_received(client.data_to_send())  # HEADERS and DATA in one read

        to_runtime = [data for who, data in log if who == "runtime"]
        assert [who for who, _ in log if who != "client"] == ["pre", "runtime"]
        assert len(to_runtime) == 1 and frames(to_runtime[0]) == [1, 0]  # HEADERS, DATA: one write
        events = server.receive_data(to_runtime[0])
        sent = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
        assert pb.CreateContainerRequest.FromString(sent[5:]).config.linux.resources.cpuset_cpus == "0-1"

        log.clear()
        reply = pb.CreateContainerResponse(container_id="c1").SerializeToString()
        server.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
        server.send_data(sid, b"\0" + len(reply).to_bytes(4, "big") + reply)
        server.send_headers(sid, [("grpc-status", "0")], end_stream=True)
        write = link.client.writelines  # type: ignore[union-attr]
        unread: list[bool] = []  # the answer's frames not yet followed, at the client's write

        def writelines(chunks: Any) -> None:
            unread.append(link.core.unread is not None and sid in link.core.streams)
            write(chunks)

        link.client.writelines = writelines  # type: ignore[union-attr,method-assign]
        link.runtime_data(server.data_to_send())  # what _RuntimeSide.data_received does
        # the answer is written first (its frames followed only after), then the post hook has
        # run, in this very turn
        assert [who for who, _ in log] == ["client", "post"]
        assert unread == [True] and link.core.unread is None and not link.core.answers
        assert log[1][1] == b"c1"
        assert not link.tasks

    run(main())


@pytest.mark.parametrize("reads", ["one", "each", "straddled"])
def test_a_post_first_hook_runs_before_its_answer_is_written(reads: str) -> None:
    """`Hooks.post_first` (RunPodSandbox, StartContainer): the post hook runs in the turn its answer
    came in, before the answer's write: an answer in a read of its own (passed on before its frames
    are followed) or in one read with another call's (followed first). The hooks after the other
    calls that end in that read run before it, in their order; in a read that ends no post-first
    call (`straddled`: the start's HEADERS with the other's whole answer), after their answer as
    ever. A post-first hook that waits does not hold its answer: it goes on in a task, and the
    answer is written at once."""
    log: list[tuple[str, bytes]] = []
    gate = asyncio.Event()

    async def started(request: Any, response: Any, info: Any) -> None:
        log.append(("started", request.container_id.encode()))
        if request.container_id == "wait":
            await gate.wait()
            log.append(("waited", b""))

    async def removed(request: Any, response: Any, info: Any) -> None:
        log.append(("removed", request.container_id.encode()))

    def answer(server: h2.connection.H2Connection, sid: int) -> bytes:
        server.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
        server.send_data(sid, b"\0\0\0\0\0")
        server.send_headers(sid, [("grpc-status", "0")], end_stream=True)
        return server.data_to_send()

    async def main() -> None:
        table = HookTable()
        table.register("StartContainer", post=started, post_first=True)
        table.register("RemoveContainer", post=removed)
        link, client, server = connected(table, log)
        start = "/runtime.v1.RuntimeService/StartContainer"
        remove = "/runtime.v1.RuntimeService/RemoveContainer"
        for cid in ("c1", "wait"):
            other = send_call(client, pb.RemoveContainerRequest(container_id="r").SerializeToString(), remove)
            sid = send_call(client, pb.StartContainerRequest(container_id=cid).SerializeToString(), start)
            link.data_received(client.data_to_send())
            for who, data in log:
                if who == "runtime":
                    server.receive_data(data)
            log.clear()
            if reads == "one":
                link.runtime_data(answer(server, other) + answer(server, sid))
                assert [who for who, _ in log] == ["removed", "started", "client"]
            elif reads == "each":
                link.runtime_data(answer(server, other))
                link.runtime_data(answer(server, sid))
                assert [who for who, _ in log] == ["client", "removed", "started", "client"]
            else:
                server.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
                link.runtime_data(server.data_to_send() + answer(server, other))
                server.send_data(sid, b"\0\0\0\0\0")
                server.send_headers(sid, [("grpc-status", "0")], end_stream=True)
                link.runtime_data(server.data_to_send())
                assert [who for who, _ in log] == ["client", "removed", "started", "client"]
            if cid == "wait":  # it waits, in a task; its answer went
                assert link.tasks
                gate.set()
                for _ in range(100):
                    if not link.tasks:
                        break
                    await asyncio.sleep(0)
                assert ("waited", b"") in log
            assert not link.tasks
            events = client.receive_data(b"".join(data for who, data in log if who == "client"))
            assert {e.stream_id for e in events if isinstance(e, h2.events.StreamEnded)} == {other, sid}
            log.clear()

    run(main())


def test_credit_for_held_requests_comes_in_batches_and_the_client_never_runs_low() -> None:
    """The connection credit owed to the client for hooked requests the relay held is batched (one
    WINDOW_UPDATE per CREDIT_BATCH bytes, not one per call), and the client's window never drops by
    more than a batch and a request: a client never waits for it."""
    from cri_proxy.relay.core import CREDIT_BATCH

    async def pre(request: Any, info: Any) -> Any:
        return request

    async def main() -> None:
        log: list[tuple[str, bytes]] = []
        table = HookTable()
        table.register("CreateContainer", pre=pre)
        link, client, server = connected(table, log, window=1 << 20)  # as wide as grpc-go's server gives
        start = client.outbound_flow_control_window

        body = pb.CreateContainerRequest(pod_sandbox_id="p" * 3000).SerializeToString()
        lowest, updates, calls = start, 0, 100
        for _ in range(calls):
            send_call(client, body)
            lowest = min(lowest, client.outbound_flow_control_window)
            link.data_received(client.data_to_send())
            for who, data in log:  # the runtime never credits here: every credit is the relay's own
                if who == "client":
                    events = client.receive_data(data)
                    updates += sum(
                        isinstance(e, h2.events.WindowUpdated) and e.stream_id == 0 for e in events
                    )
                else:
                    server.receive_data(data)
            log.clear()
        sent = calls * (len(body) + 5)
        assert 0 < updates <= sent // CREDIT_BATCH + 1 < calls  # batched, not one per call
        assert lowest >= start - CREDIT_BATCH - len(body) - 5
        assert client.outbound_flow_control_window >= start - CREDIT_BATCH

    run(main())


def _loops() -> list[Any]:
    loops: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return loops
    return [*loops, pytest.param(uvloop.new_event_loop, id="uvloop")]


@pytest.mark.parametrize("first", [False, True], ids=["post", "post-first"])
@pytest.mark.parametrize("new_loop", _loops())
def test_the_answer_reaches_the_client_socket_before_the_post_hook_runs(
    new_loop: Callable[[], asyncio.AbstractEventLoop], first: bool
) -> None:
    """On real sockets: when the post hook starts, the whole answer is already in the client's
    socket (a peek finds the stream's end there). Work done after the answer must not delay it.
    Unless the hook is post-first (`Hooks.post_first`): then nothing of the answer is there yet."""
    found: list[bytes] = []
    peer: list[socket.socket] = []

    async def post(request: Any, response: Any, info: Any) -> None:
        try:
            found.append(peer[0].recv(1 << 16, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except BlockingIOError:
            found.append(b"")

    async def main() -> None:
        table = HookTable()
        table.register("Version", post=post, post_first=first)
        async with bed(table) as b:
            loop = asyncio.get_running_loop()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            peer.append(sock)
            await loop.sock_connect(sock, b.proxy_endpoint.removeprefix("unix://"))
            client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            client.initiate_connection()
            await loop.sock_sendall(sock, client.data_to_send())
            settled = False
            while not settled:  # the proxy's SETTINGS (and the runtime's), acknowledged
                data = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 5)
                assert data, "the proxy closed the connection"
                events = client.receive_data(data)
                settled = any(isinstance(e, h2.events.RemoteSettingsChanged) for e in events)
                await loop.sock_sendall(sock, client.data_to_send())
            sid = send_call(client, b"", "/runtime.v1.RuntimeService/Version")
            await loop.sock_sendall(sock, client.data_to_send())
            for _ in range(500):
                if found:
                    break
                await asyncio.sleep(0.01)
            assert found, "the post hook never ran"
            events = client.receive_data(found[0])
            ended = any(isinstance(e, h2.events.StreamEnded) and e.stream_id == sid for e in events)
            assert ended is not first
            if first:  # it comes once the hook has run
                for _ in range(500):
                    events = client.receive_data(await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 5))
                    if any(isinstance(e, h2.events.StreamEnded) and e.stream_id == sid for e in events):
                        break
                else:
                    raise AssertionError("the answer never came")
            sock.close()

    loop = new_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def test_the_line_about_a_create_is_written_with_its_answer(tmp_path: Any) -> None:
    """The proxy's own hooks: the INFO line saying what CreateContainer was given is written when
    the runtime has answered, a moment after the answer's write to the client (`put_off`), and
    says what the create became; not while the runtime works on it (formatting a line and writing
    it to journald takes a CPU the runtime wants: on a 2-vCPU node, ~0.1 ms of each create), nor
    before the request's write. A call that fails gets its line too, saying so."""
    from loguru import logger

    from cri_proxy.enforce.hooks import pod_record

    log: list[tuple[str, bytes]] = []
    sink = logger.add(lambda m: log.append(("log", str(m).encode())), level="INFO", format="{message}")

    async def main() -> None:
        proxy = _proxy(tmp_path)
        sandbox = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="web", namespace="d", uid="u1"))
        sandbox.linux.cgroup_parent = "/kubepods/besteffort/podu1"
        proxy.state.put_pod(pod_record("s1", sandbox, "v1"))
        link, client, server = connected(proxy.table, log)
        created = pb.CreateContainerResponse(container_id="c1" * 20).SerializeToString()
        for name, status, reply, outcome in (
            ("app", "0", created, b"; created c1c1c1c1c1c1c"),
            ("sidecar", "2", None, b"; not created: UNKNOWN"),
        ):
            meta = pb.ContainerMetadata(name=name)
            request = pb.CreateContainerRequest(pod_sandbox_id="s1", config=pb.ContainerConfig(metadata=meta))
            sid = send_call(client, request.SerializeToString())
            link.data_received(client.data_to_send())
            for data in (data for who, data in log if who == "runtime"):
                server.receive_data(data)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert [who for who, _ in log] == ["runtime"]  # the request went on; nothing logged yet
            log.clear()
            link.runtime_data(_reply(server, sid, status, reply))
            await asyncio.sleep(0)
            assert [who for who, _ in log] == ["client"]  # the answer first; the line a moment later
            for _ in range(100):  # within LINES_WAIT (`put_off`): not as the client's next call comes
                if len(log) > 1:
                    break
                await asyncio.sleep(0.01)
            assert [who for who, _ in log] == ["client", "log"]
            line = b"d/web " + name.encode() + b": BE -> cpuset 0-7 (BE share pool)" + outcome
            assert log[1][1] == line + b"\n"
            log.clear()

    try:
        run(main())
    finally:
        logger.remove(sink)


def _proxy(tmp_path: Any) -> Any:
    """The proxy's own hooks and state, on a fake sysfs (one NUMA node, CPUs 0-7)."""
    from cri_proxy.serve import Proxy
    from tests.unit.enforce_support import fake_sysfs

    config = Config(
        runtime_endpoint="unix:///nonexistent/runtime.sock",
        state_dir=str(tmp_path / "state"),
        kubelet_state_file=str(tmp_path / "cpu_manager_state"),
        sysfs_root=str(fake_sysfs(tmp_path / "sys", {0: "0-7"})),
        cgroup_root=str(tmp_path / "cgroup"),
    ).validate()
    return Proxy(config)


def _reply(server: h2.connection.H2Connection, sid: int, status: str, reply: bytes | None) -> bytes:
    """The runtime's answer to call `sid`: message `reply` (None: no message), then `status`."""
    server.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
    if reply is not None:
        server.send_data(sid, b"\0" + len(reply).to_bytes(4, "big") + reply)
    server.send_headers(sid, [("grpc-status", status)], end_stream=True)
    return server.data_to_send()


def test_the_proxy_knows_a_new_pod_and_a_start_when_their_answers_are_written(tmp_path: Any) -> None:
    """The proxy's RunPodSandbox and StartContainer hooks are post-first (`Hooks.post_first`): when
    the kubelet is told a pod runs, the proxy's state has it already, its first create read ahead;
    when told a container started, the state says it runs. Its next call never meets that work."""
    from cri_proxy.state.model import ContainerRecord, ContainerState

    async def main() -> None:
        log: list[tuple[str, bytes]] = []
        proxy = _proxy(tmp_path)
        link, client, server = connected(proxy.table, log)
        seen: list[tuple[bool, bool, bool]] = []  # at each write to the client
        write = link.client.writelines  # type: ignore[union-attr]

        def writelines(chunks: Any) -> None:
            pod, c = proxy.state.pod("s2"), proxy.state.container("c2")
            ahead = pod is not None and proxy.policy.before_create(pod, None) is not None
            seen.append((pod is not None, ahead, c is not None and c.state is ContainerState.RUNNING))
            write(chunks)

        link.client.writelines = writelines  # type: ignore[union-attr,method-assign]
        proxy.policy.plan()  # as a proxy that has been running has one: a new pod is read ahead from it
        sandbox = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="web", namespace="d", uid="u2"))
        sandbox.linux.cgroup_parent = "/kubepods/besteffort/podu2"
        calls = (
            (
                "RunPodSandbox",
                pb.RunPodSandboxRequest(config=sandbox),
                pb.RunPodSandboxResponse(pod_sandbox_id="s2"),
            ),
            ("StartContainer", pb.StartContainerRequest(container_id="c2"), pb.StartContainerResponse()),
        )
        for method, request, response in calls:
            sid = send_call(client, request.SerializeToString(), f"/runtime.v1.RuntimeService/{method}")
            link.data_received(client.data_to_send())
            for data in (data for who, data in log if who == "runtime"):
                server.receive_data(data)
            log.clear()
            seen.clear()
            link.runtime_data(_reply(server, sid, "0", response.SerializeToString()))
            if method == "RunPodSandbox":
                assert seen == [(True, True, False)]
                proxy.state.put_container(ContainerRecord("c2", "s2", "app"))  # as its create leaves it
                proxy.policy.prepare(["s2"])  # and its post hook, reading the pod's next create ahead
            else:  # carried over the start
                assert seen == [(True, True, True)]

    run(main())


def _ready_table(log: list[tuple[str, bytes]]) -> HookTable:
    """CreateContainer with a ready hook (a cpuset patch; `after` and the hooks after the call log
    what they got)."""
    from cri_proxy.relay.hooks import Ready

    patch = pb.CreateContainerRequest(
        config=pb.ContainerConfig(
            linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(cpuset_cpus="3"))
        )
    ).SerializeToString()

    def ready(message: bytes, info: Any) -> Ready:
        return Ready(patch, lambda sent: log.append(("after", sent.SerializeToString())))

    async def post(request: Any, response: Any, info: Any) -> None:
        log.append(("post", request.SerializeToString()))

    async def failed(request: Any, code: Any, info: Any) -> None:
        log.append(("failed", request.SerializeToString()))

    table = HookTable()
    table.register("CreateContainer", pre=None, post=post, failed=failed, ready=ready)
    return table


def _answer(server: h2.connection.H2Connection, sid: int, status: str) -> bytes:
    reply = pb.CreateContainerResponse(container_id="c1").SerializeToString()
    server.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
    if status == "0":
        server.send_data(sid, b"\0" + len(reply).to_bytes(4, "big") + reply)
    server.send_headers(sid, [("grpc-status", status)], end_stream=True)
    return server.data_to_send()


@pytest.mark.parametrize("status, hook", [("0", "post"), ("2", "failed")])
def test_a_ready_requests_after_runs_once_its_answer_is_written_before_the_hook_after_it(
    status: str, hook: str
) -> None:
    """A request that went on ready is decoded for `Ready.after` (a create's pending record) not
    while the runtime works on it, where its CPU would slow the runtime's (`READY_WAIT`), but
    after the answer's write, right before the hook after the call, which gets the same request:
    decoded once, counted once as the pre hook's "ready"."""

    async def main() -> None:
        log: list[tuple[str, bytes]] = []
        link, client, server = connected(_ready_table(log), log)
        body = pb.CreateContainerRequest(pod_sandbox_id="p", config=pb.ContainerConfig()).SerializeToString()
        sid = send_call(client, body)
        link.data_received(client.data_to_send())
        assert [who for who, _ in log] == ["runtime"]  # the request went on; nothing decoded yet
        for _ in range(3):
            await asyncio.sleep(0)
        assert [who for who, _ in log] == ["runtime"] and link.readied
        server.receive_data(log[0][1])
        log.clear()
        link.runtime_data(_answer(server, sid, status))
        assert [who for who, _ in log] == ["client", "after", hook]
        sent = pb.CreateContainerRequest.FromString(log[1][1])
        assert sent.config.linux.resources.cpuset_cpus == "3" and sent.pod_sandbox_id == "p"
        assert log[2][1] == log[1][1]
        assert link.relay.runner.runs[("CreateContainer", "pre", "ready")] == 1
        assert not link.readied and not link.tasks

    run(main())


def test_a_ready_request_without_an_answer_is_decoded_ready_wait_after_its_write_or_at_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When the runtime takes long (a create that hangs), `Ready.after` does not wait for the
    answer: it runs `READY_WAIT` after the write (a request written since waits on: its own
    `READY_WAIT`), and the hook after the call gets the request decoded then; a link that closes
    decodes those still waiting at once (the failed hook gets them)."""
    from cri_proxy.relay import transport

    monkeypatch.setattr(transport, "READY_WAIT", 0.2)

    async def main() -> None:
        log: list[tuple[str, bytes]] = []
        link, client, server = connected(_ready_table(log), log)
        body = pb.CreateContainerRequest(pod_sandbox_id="p").SerializeToString()
        sid = send_call(client, body)
        link.data_received(client.data_to_send())
        server.receive_data(log[0][1])
        await asyncio.sleep(0.1)
        later = send_call(client, pb.CreateContainerRequest(pod_sandbox_id="q").SerializeToString())
        link.data_received(client.data_to_send())
        server.receive_data(log[1][1])
        assert [who for who, _ in log] == ["runtime", "runtime"]
        for _ in range(300):  # deadline 3 s
            if any(who == "after" for who, _ in log):
                break
            await asyncio.sleep(0.01)
        assert [who for who, _ in log] == ["runtime", "runtime", "after"]
        assert pb.CreateContainerRequest.FromString(log[2][1]).pod_sandbox_id == "p"
        assert list(link.readied) == [later]  # written 0.1 s later: not due with the first
        log.clear()
        link.runtime_data(_answer(server, sid, "0"))
        assert [who for who, _ in log] == ["client", "post"]  # decoded before: not again
        assert pb.CreateContainerRequest.FromString(log[1][1]).pod_sandbox_id == "p"
        for _ in range(300):  # deadline 3 s
            if not link.readied:
                break
            await asyncio.sleep(0.01)
        assert [who for who, _ in log] == ["client", "post", "after"] and link.ready_due is None
        log.clear()
        link.runtime_data(_answer(server, later, "0"))
        assert [who for who, _ in log] == ["client", "post"]

        log.clear()
        send_call(client, body)
        link.data_received(client.data_to_send())
        assert [who for who, _ in log] == ["runtime"] and link.readied
        link.connection_lost(None)  # the client went: its call ends, its failed hook runs
        assert [who for who, _ in log] == ["runtime", "after", "failed"]
        assert link.ready_due is None and not link.readied
        assert link.relay.runner.runs[("CreateContainer", "pre", "ready")] == 3

    run(main())
