"""Bad input through the proxy: requests that do not decode, annotations of every bad shape, a huge
kubelet state file. Never a crash, a hang, a changed node state or a memory blow-up.

The raw-request part runs one proxy (hooks, state, reconciler) in front of the fake runtime on an
event loop in a background thread, and sends raw bytes to it with a synchronous gRPC client, so one
node serves hundreds of hypothesis examples. `bench/fuzz.py` drives the same generators and the
same checks (`Fuzzer.one`) for 10,000+ inputs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError, Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loguru import logger

from cri_proxy.cpu import ProblemKind
from cri_proxy.relay.forward import FailPolicy
from cri_proxy.relay.methods import KNOWN, MethodInfo, method_path
from cri_proxy.state.model import ContainerState
from tests.protowire import length_field, tag, varint
from tests.unit.enforce_support import ALLOC, QOS_LABEL, Node, alloc, node
from tests.unit.relay_support import run

INTERCEPTED = (
    "RunPodSandbox",
    "CreateContainer",
    "UpdateContainerResources",
    "StartContainer",
    "StopContainer",
    "RemoveContainer",
    "StopPodSandbox",
    "RemovePodSandbox",
)
VERSIONS = ("v1", "v1alpha2")
PATHS = tuple(method_path(v, "RuntimeService", m) for v in VERSIONS for m in INTERCEPTED)
CALL_TIMEOUT = 10.0  # every call has one: a hang shows as DEADLINE_EXCEEDED, which fails the check
VERSION_PATH = "/runtime.v1.RuntimeService/Version"


# -- generators: (rng, a valid request of the method) -> raw bytes --------------------------------
def _string_fields(info: MethodInfo) -> list[int]:
    return [f.number for f in info.request_type.DESCRIPTOR.fields if f.type == f.TYPE_STRING]


def random_bytes(rng: random.Random, seed: bytes, info: MethodInfo) -> bytes:
    return rng.randbytes(rng.randint(1, 256))


def flipped(rng: random.Random, seed: bytes, info: MethodInfo) -> bytes:
    """A valid message with 1-4 random bytes replaced."""
    raw = bytearray(seed)
    for _ in range(rng.randint(1, 4)):
        raw[rng.randrange(len(raw))] = rng.randrange(256)
    return bytes(raw)


def truncated(rng: random.Random, seed: bytes, info: MethodInfo) -> bytes:
    return seed[: rng.randrange(1, len(seed))]


def bad_wire_type(rng: random.Random, seed: bytes, info: MethodInfo) -> bytes:
    """A field with wire type 6 or 7 (no such type), or a group that never ends / never began."""
    field = rng.choice([*(f.number for f in info.request_type.DESCRIPTOR.fields), 999])
    bad = tag(field, rng.choice((3, 4, 6, 7)))
    return seed + bad if rng.random() < 0.5 else bad + seed


def bad_length(rng: random.Random, seed: bytes, info: MethodInfo) -> bytes:
    """A length-delimited field whose length runs past the end of the message."""
    body = rng.randbytes(rng.randint(0, 16))
    return seed + tag(rng.randint(1, 20), 2) + varint(len(body) + rng.randint(1, 1 << 20)) + body


def overlong_varint(rng: random.Random, seed: bytes, info: MethodInfo) -> bytes:
    return seed + tag(rng.randint(1, 20), 0) + b"\xff" * rng.randint(10, 20)


def field_zero(rng: random.Random, seed: bytes, info: MethodInfo) -> bytes:
    return seed + tag(0, rng.choice((0, 2))) + b"\x00"


def bad_utf8(rng: random.Random, seed: bytes, info: MethodInfo) -> bytes:
    """A top-level string field (an id, the runtime handler) holding bytes that are not UTF-8."""
    value = bytes(rng.choice((0x80, 0xC0, 0xFE, 0xFF, 0xED)) for _ in range(rng.randint(1, 8)))
    value += b"\xc3"  # a lead byte with nothing after it: never valid UTF-8
    return seed + length_field(rng.choice(_string_fields(info)), value)


def bad_nested(rng: random.Random, seed: bytes, info: MethodInfo) -> bytes:
    """A string that is not UTF-8 inside a nested message: where a create's keys are not, so only
    the whole request does not decode (`create_keys`)."""
    nested = [
        f
        for f in info.request_type.DESCRIPTOR.fields
        if f.type == f.TYPE_MESSAGE and any(g.type == g.TYPE_STRING for g in f.message_type.fields)
    ]
    if not nested:
        return bad_utf8(rng, seed, info)
    field = rng.choice(nested)
    string = rng.choice([g.number for g in field.message_type.fields if g.type == g.TYPE_STRING])
    value = bytes(rng.choice((0x80, 0xFE, 0xFF)) for _ in range(rng.randint(1, 8))) + b"\xc3"
    return seed + length_field(field.number, length_field(string, value))


Generator = Callable[[random.Random, bytes, MethodInfo], bytes]
GENERATORS: dict[str, Generator] = {
    "random": random_bytes,
    "flipped": flipped,
    "truncated": truncated,
    "wire-type": bad_wire_type,
    "length": bad_length,
    "varint": overlong_varint,
    "field-zero": field_zero,
    "utf8": bad_utf8,
    "nested": bad_nested,
}
NEVER_DECODE = ("wire-type", "length", "varint", "field-zero", "utf8", "nested")


def valid_request(info: MethodInfo, sandbox_id: str, container_id: str) -> Message:
    """A request of the method as kubelet would send it (the seed the generators damage)."""
    pb = Node.pb if info.version == "v1" else _v1alpha2()
    config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="fuzz", uid="uid-fuzz", namespace="default"),
        labels={QOS_LABEL: "LS", "io.kubernetes.pod.uid": "uid-fuzz"},
        annotations=alloc(numaNodeResources=[{"node": 0, "resources": {"cpu": "1"}}]),
        linux=pb.LinuxPodSandboxConfig(cgroup_parent="/kubepods/burstable/poduid-fuzz"),
    )
    resources = pb.LinuxContainerResources(cpu_shares=512, cpu_quota=50000, cpu_period=100000)
    name = info.name
    if name == "RunPodSandbox":
        return pb.RunPodSandboxRequest(config=config)
    if name == "CreateContainer":
        cconfig = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="main"),
            image=pb.ImageSpec(image="localhost/busybox:latest"),
            linux=pb.LinuxContainerConfig(resources=resources),
        )
        return pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=cconfig, sandbox_config=config)
    if name == "UpdateContainerResources":
        return pb.UpdateContainerResourcesRequest(container_id=container_id, linux=resources)
    if name == "StopContainer":
        return pb.StopContainerRequest(container_id=container_id, timeout=1)
    if name in ("StartContainer", "RemoveContainer"):
        return getattr(pb, f"{name}Request")(container_id=container_id)
    return getattr(pb, f"{name}Request")(pod_sandbox_id=sandbox_id)


def _v1alpha2() -> Any:
    from cri_api.v1alpha2 import api_pb2

    return api_pb2


def decodes(info: MethodInfo, raw: bytes) -> bool:
    try:
        info.request_type.FromString(raw)
    except DecodeError:
        return False
    return True


# -- one proxy for many examples -------------------------------------------------------------------
class LiveNode:
    """`node(...)` on an event loop in a background thread; calls come from sync gRPC clients."""

    def __init__(self, tmp: Path, **config: Any) -> None:
        self.loop = asyncio.new_event_loop()
        # signal handlers (SIGHUP reload) need the main thread; nothing here sends signals
        self.loop.add_signal_handler = lambda *args: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.loop.run_forever, name="live-node", daemon=True)
        self.thread.start()
        self._cm = node(tmp, **config)
        self.node: Node = self.run(self._cm.__aenter__())
        self.proxy_channel = grpc.insecure_channel(f"unix://{tmp}/proxy.sock")
        self.runtime_channel = grpc.insecure_channel(self.node.fake.opts.listen)

    def run(self, coro: Any, timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.proxy_channel.close()
        self.runtime_channel.close()
        try:
            self.run(self._cm.__aexit__(None, None, None))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()

    def set_fail_policy(self, policy: FailPolicy) -> None:
        settings = self.node.proxy.settings
        if settings.current.fail_policy != policy.value:
            settings.swap(replace(settings.current, fail_policy=policy.value))


def call(channel: grpc.Channel, path: str, raw: bytes) -> tuple[grpc.StatusCode, str]:
    try:
        channel.unary_unary(path)(raw, timeout=CALL_TIMEOUT)
    except grpc.RpcError as error:
        return error.code(), error.details() or ""  # type: ignore[attr-defined]
    return grpc.StatusCode.OK, ""


class Fuzzer:
    """Sends one raw request through the proxy and checks what must hold; counts outcomes."""

    def __init__(self, live: LiveNode) -> None:
        self.live = live
        self.outcomes: Counter[str] = Counter()
        self.hook_errors: list[str] = []
        self._dirty = True  # the state may still be settling after a request that decoded
        self._sink = logger.add(self._log, level="ERROR", format="{message}")
        sandbox, ids = live.run(live.node.run_pod("fuzz", "burstable", {QOS_LABEL: "LS"}))
        self.sandbox = sandbox
        self.seeds = {
            path: valid_request(KNOWN[path], sandbox, ids["main"]).SerializeToString() for path in PATHS
        }
        self.readied = 0  # creates that went on with their hooks' answer ready (`ready_create`)

    def _log(self, message: Any) -> None:
        self.hook_errors.append(str(message).strip()[:300])

    def close(self) -> None:
        logger.remove(self._sink)

    def _settle(self) -> int:
        n = self.live.node
        self.live.run(n.settle())
        return n.proxy.state.generation

    def one(self, path: str, raw: bytes, policy: FailPolicy) -> str:
        """The outcome: "invalid-argument", "runtime-answer" or "ok"; AssertionError if broken."""
        live, info, state = self.live, KNOWN[path], self.live.node.proxy.state
        live.set_fail_policy(policy)
        good = decodes(info, raw)
        before = self._settle() if self._dirty or not good else state.generation
        if info.name == "CreateContainer":  # the usual create's way, when its keys decode
            self.readied += live.run(self._ready(raw, info))
        code, details = call(live.proxy_channel, path, raw)
        assert code is not grpc.StatusCode.DEADLINE_EXCEEDED, f"{path}: no answer in {CALL_TIMEOUT} s"
        assert "hook failed" not in details, f"{path}: {details}"
        if not good:
            if policy is FailPolicy.FAIL:
                assert code is grpc.StatusCode.INVALID_ARGUMENT, (path, code, details)
                assert "does not decode" in details, details
            else:  # forwarded as sent: the runtime's own answer
                direct, _ = call(live.runtime_channel, path, raw)
                assert code is direct, (path, code, direct, details)
            assert state.generation == before, f"{path}: a request that does not decode changed the state"
            outcome = "invalid-argument" if code is grpc.StatusCode.INVALID_ARGUMENT else "runtime-answer"
        else:
            self._dirty = True
            outcome = "ok" if code is grpc.StatusCode.OK else "runtime-answer"
        self.check_consistent()
        version, _ = call(live.proxy_channel, VERSION_PATH, b"")
        assert version is grpc.StatusCode.OK, f"the proxy does not answer Version after {path}"
        assert not self.hook_errors, self.hook_errors
        self.outcomes[outcome] += 1
        return outcome

    async def _ready(self, raw: bytes, info: MethodInfo) -> bool:
        """Whether the create goes on with no pre hook run (`EnforceHooks.ready_create`), with its
        decision read ahead as the hooks do between calls after a change."""
        proxy = self.live.node.proxy
        proxy.policy.plan()
        proxy.policy.prepare([self.sandbox])
        return proxy.hooks.ready_create(raw, info) is not None

    def check_consistent(self, within: float = 5.0) -> None:
        """Every container's sandbox known, nothing pending, once the call's post or failed hook
        ran (the relay runs them after the answer is on its way): waited for, with a deadline."""
        state = self.live.node.proxy.state
        deadline = time.monotonic() + within
        while True:
            _, pods, containers = state.snapshot()
            sandboxes = {p.sandbox_id for p in pods}
            try:
                for c in containers:
                    assert c.sandbox_id in sandboxes, f"container {c.id} of unknown sandbox {c.sandbox_id}"
                    assert c.state is not ContainerState.PENDING and not c.id.startswith("pending/"), c
                return
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.01)


@contextlib.contextmanager
def fuzzer(tmp: Path) -> Iterator[Fuzzer]:
    live = LiveNode(tmp, exclusive_wait_seconds=0.5, reconcile_period_seconds=3600.0)
    try:
        f = Fuzzer(live)
        try:
            yield f
        finally:
            f.close()
    finally:
        live.close()


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzer]:
    with fuzzer(tmp_path_factory.mktemp("fuzz")) as f:
        yield f


POLICIES = (FailPolicy.IGNORE, FailPolicy.FAIL)


def test_every_method_and_version_refuses_or_forwards_what_does_not_decode(fuzz: Fuzzer) -> None:
    rng = random.Random(8)
    for path in PATHS:
        info = KNOWN[path]
        for name in NEVER_DECODE:
            raw = GENERATORS[name](rng, fuzz.seeds[path], info)
            assert not decodes(info, raw), (path, name, raw)
            for policy in POLICIES:
                expected = "invalid-argument" if policy is FailPolicy.FAIL else "runtime-answer"
                assert fuzz.one(path, raw, policy) == expected
    # a create damaged only where its keys are not goes on at once, as the usual create does
    assert fuzz.readied >= 2, fuzz.readied


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    path=st.sampled_from(PATHS),
    kind=st.sampled_from(sorted(GENERATORS)),
    policy=st.sampled_from(POLICIES),
    rng=st.randoms(use_true_random=False),
)
def test_fuzzed_requests_never_crash_hang_or_corrupt(
    fuzz: Fuzzer, path: str, kind: str, policy: FailPolicy, rng: random.Random
) -> None:
    fuzz.one(path, GENERATORS[kind](rng, fuzz.seeds[path], KNOWN[path]), policy)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), raw=st.binary(min_size=1, max_size=512), policy=st.sampled_from(POLICIES))
def test_arbitrary_bytes(fuzz: Fuzzer, path: str, raw: bytes, policy: FailPolicy) -> None:
    fuzz.one(path, raw, policy)


# -- annotations of every bad shape ----------------------------------------------------------------
MIB = 1 << 20
BAD_ANNOTATIONS: dict[str, str] = {
    "not JSON": "{cpuset: 0-1",
    "a JSON list": "[1, 2]",
    "cpuset an int": '{"cpuset": 3}',
    "cpuset 0-99999": '{"cpuset": "0-99999"}',
    "cpuset -1": '{"cpuset": "-1"}',
    "cpuset a-b": '{"cpuset": "a-b"}',
    "cpuset 1 MiB": json.dumps({"cpuset": "1," * (MIB // 2)}),
    "1 MiB not JSON": "x" * MIB,
    "nested 100k deep": "[" * 100_000,
    "numaNodeResources node a string": '{"numaNodeResources": [{"node": "0"}]}',
    "1 MiB JSON, 100k entries": json.dumps(
        {"numaNodeResources": [{"node": 0, "resources": {"cpu": "1"}}] * 100_000}
    ),
    "100k entries, the last bad": json.dumps({"numaNode": [0] * 99_999 + ["x"]}, separators=(",", ":")),
}


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_bad_annotations_are_problems_and_the_ls_rule_applies(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, exclusive_wait_seconds=0.5) as n:
            await n.run_pod("warm-up", "burstable")
            rss = _rss_kib()
            shapes = {
                **{k: (v, ProblemKind.BAD_ANNOTATION) for k, v in BAD_ANNOTATIONS.items()},
                "CPUs beyond the node": ('{"cpuset": "64-65"}', ProblemKind.CPUS_NOT_ONLINE),
                "CPUs 8191": ('{"cpuset": "8191"}', ProblemKind.CPUS_NOT_ONLINE),
            }
            for i, (what, (value, kind)) in enumerate(shapes.items()):
                name = f"bad-{i}"
                _, ids = await n.run_pod(name, "guaranteed", {QOS_LABEL: "LSR"}, {ALLOC: value})
                plan = n.proxy.policy.plan()
                mine = [p for p in plan.problems if p.pod == f"default/{name}"]
                assert kind in {p.kind for p in mine}, (what, mine)
                if kind is ProblemKind.BAD_ANNOTATION:
                    message = next(p.message for p in mine if p.kind is kind)
                    assert ALLOC in message and len(message) < 400, (what, message)
                # created, with the LS rule
                assert n.cpuset(ids["main"]) == str(plan.pools.ls), what
                assert (await n.stub().Version(n.pb.VersionRequest(), timeout=5)).runtime_name
            assert _rss_kib() - rss < 200 * 1024, "memory jumped"
            # valid, as long as Kubernetes allows (256 KiB): 40,000 NUMA node ids the node does not have
            huge = json.dumps({"numaNode": list(range(40_000))}, separators=(",", ":"))
            _, ids = await n.run_pod("many-nodes", "burstable", {QOS_LABEL: "LS"}, {ALLOC: huge})
            plan = n.proxy.policy.plan()
            assert n.cpuset(ids["main"]) == str(plan.pools.ls)
            assert len(plan.containers[ids["main"]].why) < 400
            assert _rss_kib() - rss < 200 * 1024, "memory jumped"

    run(main())


def test_bad_annotation_under_fail_policy_is_refused_and_leaves_nothing_pending(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, fail_policy="fail") as n:
            for i, value in enumerate((BAD_ANNOTATIONS["cpuset 0-99999"], BAD_ANNOTATIONS["1 MiB not JSON"])):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await n.run_pod(f"bad-{i}", "guaranteed", {QOS_LABEL: "LSR"}, {ALLOC: value})
                assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert f"default/bad-{i}" in (refused.value.details() or "")
            assert not n.proxy.state.containers()
            assert not n.fake.store.containers

    run(main())


def _with_bad_utf8(message: Message, marker: str) -> bytes:
    """The message's bytes with `marker` (inside an annotation value) replaced by invalid UTF-8."""
    raw = message.SerializeToString()
    bad = (b"\xff\xfe" * len(marker))[: len(marker.encode())]
    assert raw.count(marker.encode()) >= 1
    return raw.replace(marker.encode(), bad)


def test_non_utf8_annotation_is_a_request_that_does_not_decode(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path) as n:
            pb = n.pb
            sandbox, _ = await n.run_pod("good", "burstable")
            marker = "NOT-UTF-8-HERE"
            config = pb.PodSandboxConfig(
                metadata=pb.PodSandboxMetadata(name="bad-utf8", uid="uid-bad-utf8", namespace="default"),
                labels={QOS_LABEL: "LSR"},
                annotations={ALLOC: '{"cpuset": "' + marker + '"}'},
                linux=pb.LinuxPodSandboxConfig(cgroup_parent="/kubepods/poduid-bad-utf8"),
            )
            run_raw = _with_bad_utf8(pb.RunPodSandboxRequest(config=config), marker)
            create_raw = _with_bad_utf8(
                pb.CreateContainerRequest(
                    pod_sandbox_id=sandbox,
                    config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name="x")),
                    sandbox_config=config,
                ),
                marker,
            )
            with pytest.raises(DecodeError):
                pb.RunPodSandboxRequest.FromString(run_raw)
            await n.settle()  # the start's cgroup check is done
            info = KNOWN["/runtime.v1.RuntimeService/CreateContainer"]
            runs = n.proxy.relay.forwarder.runner.runs
            undecodable = ("CreateContainer", "pre", "undecodable")
            generation = n.proxy.state.generation
            direct = grpc.aio.insecure_channel(n.fake.opts.listen)
            counted = runs[undecodable]
            for policy in FailPolicy:
                n.proxy.settings.swap(replace(n.proxy.settings.current, fail_policy=policy.value))
                n.proxy.policy.plan()  # what the hooks make between calls after a change, and read ahead
                n.proxy.policy.prepare([sandbox])
                for method, raw in (("RunPodSandbox", run_raw), ("CreateContainer", create_raw)):
                    path = f"/runtime.v1.RuntimeService/{method}"
                    if method == "CreateContainer":
                        # what the relay asks first: under `ignore` the create goes on with no pre
                        # hook run, only its keys parsed (they decode), its decision read ahead
                        ready = n.proxy.hooks.ready_create(raw, info)
                        assert (ready is None) is (policy is FailPolicy.FAIL)
                    with pytest.raises(grpc.aio.AioRpcError) as error:
                        await n.channel.unary_unary(path)(raw, timeout=5)
                    if policy is FailPolicy.FAIL:  # refused here
                        assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT, error.value
                    else:  # forwarded: the runtime cannot decode it either, and says so
                        with pytest.raises(grpc.aio.AioRpcError) as runtime_says:
                            await direct.unary_unary(path)(raw, timeout=5)
                        assert error.value.code() is runtime_says.value.code(), error.value
                    if method == "CreateContainer":  # counted as such on either path
                        assert runs[undecodable] == counted + 1
                        counted += 1
            await direct.close(None)
            assert n.proxy.state.generation == generation
            assert len(n.fake.store.sandboxes) == 1

    run(main())


def test_a_100k_cpu_list_in_the_kubelet_state_file_is_a_problem(tmp_path: Path) -> None:
    state = {"policyName": "static", "defaultCpuSet": "0-99999", "entries": {}, "checksum": 1}

    async def main() -> None:
        async with node(tmp_path, kubelet_state=state) as n:
            problems = [p for p in n.proxy.policy.plan().problems if p.kind is ProblemKind.BAD_KUBELET_STATE]
            assert problems and "99999" in problems[0].message, problems
            _, ids = await n.run_pod("ls", "burstable")
            assert n.cpuset(ids["main"]) == "0-15"  # as without a file
            # entries too: a v2 entry naming 100k CPUs, then a file of 1 MiB of them
            bad_entry = {**state, "defaultCpuSet": "0-15", "entries": {"uid-x": {"main": "0-99999"}}}
            path = tmp_path / "cpu_manager_state"
            for text in (json.dumps(bad_entry), json.dumps({**state, "defaultCpuSet": "1," * (MIB // 2)})):
                path.write_text(text)
                for _ in range(200):
                    await asyncio.sleep(0.02)
                    found = [
                        p
                        for p in n.proxy.policy.plan().problems
                        if p.kind is ProblemKind.BAD_KUBELET_STATE and "cpu_manager_state" in p.message
                    ]
                    if found and found[0] != problems[0]:
                        break
                else:
                    raise AssertionError(f"no new bad-kubelet-state problem for {text[:60]}")
                problems = found
            _, ids = await n.run_pod("ls2", "burstable")
            assert n.cpuset(ids["main"]) == "0-15"

    run(main())


def test_create_container_for_a_sandbox_the_runtime_does_not_have_leaves_no_phantom_pod(
    tmp_path: Path,
) -> None:
    """kubelet's CreateContainer carries the sandbox config; the proxy learns unknown sandboxes from
    it. When the runtime says the sandbox does not exist, an exclusive pod learnt that way must not
    stay in the state, holding its CPUs out of the pools until the next restart."""

    async def main() -> None:
        async with node(tmp_path, exclusive_wait_seconds=0.5) as n:
            pb = n.pb
            _, ls = await n.run_pod("ls", "burstable")
            config = pb.PodSandboxConfig(
                metadata=pb.PodSandboxMetadata(name="gone", uid="uid-gone", namespace="default"),
                labels={QOS_LABEL: "LSE"},
                annotations=alloc("0-7"),
                linux=pb.LinuxPodSandboxConfig(cgroup_parent="/kubepods/poduid-gone"),
            )
            request = pb.CreateContainerRequest(
                pod_sandbox_id="f" * 64,
                config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name="main")),
                sandbox_config=config,
            )
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await n.stub().CreateContainer(request, timeout=10)
            assert error.value.code() is grpc.StatusCode.NOT_FOUND
            await n.settle()
            assert [p.key for p in n.proxy.state.pods()] == ["default/ls"]
            assert n.cpuset(ls["main"]) == "0-15"

    run(main())
