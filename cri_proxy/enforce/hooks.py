"""The CRI hooks: CRI event -> node state -> decision -> the request changed, the others updated.

`CreateContainer` gets its cpuset before it is forwarded (exclusive CPUs are vacated first), and
the line saying so is written with its answer;
kubelet's `UpdateContainerResources` is merged into the last-known resources (as the runtime
holds them) and keeps the decided cpuset; the sandbox and container life-cycle calls keep the
state and wake the reconciler.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import grpc
from google.protobuf.message import Message
from loguru import logger

from cri_proxy.config import Config
from cri_proxy.cpu import CPUSet, Problem, ProblemKind, QoS
from cri_proxy.cpu.decide import ContainerDecision, may_move_pools
from cri_proxy.enforce.createkeys import create_keys, create_sandbox
from cri_proxy.enforce.naming import about, about_pod
from cri_proxy.enforce.policy import Early, Policy
from cri_proxy.enforce.reconciler import Reconciler
from cri_proxy.enforce.recovery import canonical_cpuset
from cri_proxy.errors import CpuError
from cri_proxy.logs import debug_enabled, put_off, soon
from cri_proxy.redact import dump
from cri_proxy.relay.forward import FailPolicy
from cri_proxy.relay.hooks import HookError, HookTable, Ready
from cri_proxy.relay.methods import KNOWN, MethodInfo
from cri_proxy.state.model import (
    LIVE_STATES,
    ContainerRecord,
    ContainerState,
    NodeState,
    PodRecord,
    resources_bytes,
)
from cri_proxy.state.resources import merge_linux_resources

EXCLUSIVE = frozenset({QoS.LSE, QoS.LSR})
_FAIL = FailPolicy.FAIL.value  # compared per create: no enum made, no enum attribute read
LEARN_WAIT = 2.0
"""Seconds an update naming an unknown container waits for the runtime's listing, at most."""
PLAN_LATER = 0.1
"""Seconds the plan after a create waits when what was read ahead for the next create still holds
(`Policy.renamed`): a pod's creates in a row make one plan in that time, not one each; a plan
after a create is ~0.2 ms of a CPU the runtime and the kubelet's next call want. A start or a new
pod that comes first makes it then, before its answer (`_plan_now`)."""
GIVEN = "{} -> cpuset {} ({})"
"""The line about a create given a cpuset (its QoS class, the cpuset, why), before what became of it."""
LINES_WAITING = 1024
"""Creates in flight whose line waits for their answer, at most; past it the oldest is written."""


def pod_record(sandbox_id: str, config: Any, api_version: str) -> PodRecord:
    """A PodSandboxConfig (any API version) as the state keeps it."""
    meta = config.metadata
    return PodRecord(
        sandbox_id=sandbox_id,
        uid=meta.uid,
        name=meta.name,
        namespace=meta.namespace,
        cgroup_parent=config.linux.cgroup_parent,
        labels=dict(config.labels),
        annotations=dict(config.annotations),
        api_version=api_version,
    )


def _say(pod: PodRecord, container: str, level: str, message: str, *args: object) -> None:
    """A line about a container of `pod`, bound to them (`about_pod`): a create's lines are put off
    until its request went on or its answer came (`EnforceHooks._said`), then a moment more
    (`put_off`), the binding too."""
    log, who = about_pod(pod, container)
    log.log(level, "{}: " + message, who, *args)


@lru_cache(maxsize=64)  # a node's few pools, and what its bindings give
def _cpuset_patch(path: str, cpus: str) -> bytes:
    """A partial CreateContainerRequest (of method `path`'s version) that sets the cpuset: appended
    to a request, it is merged over the request's own fields (`EnforceHooks.ready_create`)."""
    partial: Any = KNOWN[path].request_type()
    partial.config.linux.resources.cpuset_cpus = cpus
    data: bytes = partial.SerializeToString()
    return data


def _cpuset_only(decision: ContainerDecision) -> bool:
    """Whether all `decision` asks of a create is a cpuset set: there is one, and no CPUs to vacate
    first (an exclusive one's)."""
    return decision.cpuset is not None and decision.qos not in EXCLUSIVE


def pending_id(sandbox_id: str, name: str, attempt: int) -> str:
    """The id a container has in the state between CreateContainer and its response."""
    return f"pending/{sandbox_id}/{name}/{attempt}"


@dataclass(frozen=True, slots=True)
class _Pending:
    """A create's pending record, to be."""

    pod: PodRecord
    id: str
    name: str
    attempt: int
    # as the request asked, before the cpuset went in; or as sent, a message serialised only when
    # the record goes in (the usual create goes in as created, from its answer's: `_went_in`)
    resources: bytes | Message
    api_version: str

    def record(self) -> ContainerRecord:
        """Its pending record."""
        resources = self.resources
        serialised = resources if isinstance(resources, bytes) else resources_bytes(resources)
        return self._as(self.id, ContainerState.PENDING, serialised, None)

    def created(self, container_id: str, resources: bytes, applied: str) -> ContainerRecord:
        """Its record as created, under its runtime id (`EnforceHooks._went_in`)."""
        return self._as(container_id, ContainerState.CREATED, resources, applied)

    def _as(
        self, container_id: str, state: ContainerState, resources: bytes, applied: str | None
    ) -> ContainerRecord:
        return ContainerRecord(
            id=container_id,
            sandbox_id=self.pod.sandbox_id,
            name=self.name,
            attempt=self.attempt,
            state=state,
            resources=resources,
            applied=applied,
            api_version=self.api_version,
        )


class EnforceHooks:
    """Registers the hooks on a relay's table; all state changes go through `NodeState`."""

    def __init__(
        self,
        state: NodeState,
        policy: Policy,
        reconciler: Reconciler,
        settings: Callable[[], Config],
        learn: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self.state = state
        self.learn = learn  # list the runtime now, for a call naming a container not known yet
        self.policy = policy
        self.reconciler = reconciler
        self.settings = settings  # read per call: a reload swaps it whole
        self.injected: dict[str, int] = {}  # QoS -> count, for metrics and tests
        self.exclusive_timeouts = 0
        self.replaced = 0  # UpdateContainerResources whose cpuset the decision replaced (a metric)
        # sandboxes first seen in a CreateContainer's sandbox_config, until the runtime confirms them
        self._learned: set[str] = set()
        self._planning: asyncio.Handle | None = None  # the plan to make after this loop turn
        self._planning_now = False  # that plan is due in the next turn, not after PLAN_LATER
        # pods whose next create's decision the plan reads ahead, the newest last
        self._next_creates: dict[str, None] = {}
        # pending id -> the INFO line about its create, written when the call ends: formatting and
        # writing it while the runtime works would take a CPU the runtime wants (on a small node,
        # ~0.1 ms of each create); at the end it also says what the create became
        self._lines: dict[str, tuple[PodRecord, str, str, tuple[object, ...]]] = {}
        # pending id -> a create decided early whose request went on before its record went in
        self._unrecorded: dict[str, tuple[_Pending, Early, str]] = {}
        self._last_patch: tuple[ContainerDecision, str, bytes | None] | None = None  # `_ready_patch`

    @property
    def fail_policy(self) -> FailPolicy:
        return FailPolicy(self.settings().fail_policy)

    @property
    def dry_run(self) -> bool:
        return self.settings().dry_run

    @property
    def exclusive_wait(self) -> float:
        return self.settings().exclusive_wait_seconds

    def register(self, table: HookTable) -> None:
        # the two calls the runtime takes longest over, whose hooks' work (a new pod read ahead,
        # a start checked) is done before their answers: the kubelet's next call never meets it
        table.register("RunPodSandbox", post=self.run_pod_sandbox, post_first=True)
        table.register(
            "CreateContainer",
            pre=self.create_container,
            post=self.container_created,
            failed=self.create_failed,
            ready=self.ready_create,
        )
        table.register("UpdateContainerResources", pre=self.update_resources, post=self.resources_updated)
        table.register("StartContainer", post=self.container_started, post_first=True)
        table.register("StopContainer", post=self.container_stopped)
        table.register("RemoveContainer", post=self.container_removed)
        table.register("StopPodSandbox", post=self.pod_stopped)
        table.register("RemovePodSandbox", post=self.pod_removed)

    def _plan_soon(self, sandbox_id: str | None = None, wait: float = 0.0) -> None:
        """After a change to the pods the rules see: make the plan in a later loop turn (the call's
        answer is written by then; the changes of one turn make one plan), so that the next
        CreateContainer reads its decision from it (`Policy.before_create`) instead of deciding
        on its call's path; for a create in `sandbox_id` (a pod that may get one next), the
        decision is read ahead too (`Policy.prepare`). `wait`: not before that many seconds (a
        plan due sooner stays so)."""
        if sandbox_id is not None:
            self._next_creates[sandbox_id] = None
        if self._planning is not None:
            if wait or self._planning_now:
                return
            self._planning.cancel()
        loop = asyncio.get_running_loop()
        self._planning_now = not wait
        self._planning = loop.call_later(wait, self._make_plan) if wait else loop.call_soon(self._make_plan)

    def _plan_now(self, sandbox_id: str | None = None) -> None:
        """`_plan_soon`, but now: in the hook of a call the runtime took long over, run before its
        answer is written (`post_first`), the kubelet is still waiting on that call, not on us. A
        plan made in a later turn, or when its timer fires (`PLAN_LATER` after a create is about
        when runc has started the container), would meet the kubelet's next call instead."""
        if sandbox_id is not None:
            self._next_creates[sandbox_id] = None
        if self._planning is not None:
            self._planning.cancel()
        self._make_plan()

    def _make_plan(self) -> None:
        self._planning = None
        pods, self._next_creates = self._next_creates, {}
        try:
            self.policy.plan()
            self.policy.prepare_after_plan(reversed(pods))
        except Exception as exc:  # no call waits on this one; a create decides as it did before
            logger.opt(exception=exc).error("making the plan after a change failed: {}", exc)

    # -- sandboxes ----------------------------------------------------------------------------
    async def run_pod_sandbox(self, request: Message, response: Message, info: MethodInfo) -> None:
        req: Any = request
        pod = pod_record(response.pod_sandbox_id, req.config, info.version)  # type: ignore[attr-defined]
        self.state.put_pod(pod)
        # an exclusive pod carves the share pools as soon as it exists; a new pod that names no
        # class nor allocation (nor has an API view) moves nothing: it has no containers yet, and
        # its first create is read ahead from the last plan (`Policy.read_ahead`), without a plan
        if may_move_pools(pod.labels, pod.annotations) or self.state.has_api_view(pod.uid):
            self.reconciler.request()
        elif self._planning is None and self.policy.read_ahead(pod.sandbox_id):
            return
        self._plan_now(pod.sandbox_id)  # its containers' creates come next; a plan due is made now

    async def pod_stopped(self, request: Message, response: Message, info: MethodInfo) -> None:
        if self.state.stop_pod(request.pod_sandbox_id):  # type: ignore[attr-defined]
            self.reconciler.request()
            self._plan_soon()

    async def pod_removed(self, request: Message, response: Message, info: MethodInfo) -> None:
        self.state.remove_pod(request.pod_sandbox_id)  # type: ignore[attr-defined]
        self._learned.discard(request.pod_sandbox_id)  # type: ignore[attr-defined]
        self.reconciler.request()
        self._plan_soon()

    # -- containers ---------------------------------------------------------------------------
    def _decision_for(self, container_id: str) -> ContainerDecision | None:
        return self.policy.plan().containers.get(container_id)

    async def create_container(self, request: Message, info: MethodInfo) -> Message:
        req: Any = request
        pod = self.state.pod(req.pod_sandbox_id)
        if pod is None and req.HasField("sandbox_config"):  # a sandbox from before we were watching
            pod = pod_record(req.pod_sandbox_id, req.sandbox_config, info.version)
            self.state.put_pod(pod)
            self._learned.add(pod.sandbox_id)
        if pod is None:
            logger.warning(
                "CreateContainer for unknown sandbox {}: forwarded unchanged", req.pod_sandbox_id[:13]
            )
            return request
        name, attempt = req.config.metadata.name, req.config.metadata.attempt
        if debug_enabled():
            log, who = about_pod(pod, name)
            log.opt(lazy=True).debug("CreateContainer {}: {}", lambda: who, lambda: dump(req))
        pid = pending_id(pod.sandbox_id, name, attempt)
        early = self.policy.before_create(pod, pid)  # from the plan made since the last change
        resources = req.config.linux.resources
        pending = _Pending(pod, pid, name, attempt, resources_bytes(resources), info.version)
        if early is not None and self._sure(early.decision):
            # the usual create: what is left to do waits until its request went on (`_record`)
            cpus = str(early.decision.cpuset)
            resources.cpuset_cpus = cpus
            self._unrecorded[pid] = (pending, early, cpus)
            soon(self._record, pid)
            return request
        self.state.put_container(pending.record())
        decision, problems = self.policy.for_container(pod, pid, early)
        # the lines about the decision are written after the request went on (`put_off`)
        for problem in problems:
            put_off(_say, pod, name, "WARNING", "{}: {}", problem.kind, problem.message)
        self._refuse_bad_annotation(pod, problems, pid)
        if decision is None or decision.cpuset is None:
            why = decision.why if decision is not None else "not managed"
            qos = decision.qos if decision else None
            self._line(pid, pod, name, "{} -> cpuset left as is ({})", qos, why)
            return request
        cpus = str(decision.cpuset)
        dry_run = self.dry_run
        dry = " [dry-run]" if dry_run else ""
        self._line(pid, pod, name, GIVEN + "{}", decision.qos, cpus, decision.why, dry)
        if dry_run:
            return request
        req.config.linux.resources.cpuset_cpus = cpus  # creates linux/resources when absent
        self._injected(decision)
        if decision.qos in EXCLUSIVE:
            try:
                await self._vacate(pod, name, cpus)
            except asyncio.CancelledError:  # the caller gave up while we waited: nothing was created
                self.state.remove_container(pid)
                self._said(pid, "; not forwarded: the call was cancelled")
                raise
        return request

    def ready_create(self, message: bytes, info: MethodInfo) -> Ready | None:
        """The usual create's pre hook without running it (`Hooks.ready`), so that its request goes
        on from the relay's read: a create in a known pod whose decision was read ahead
        (`Policy.before_create`) and needs nothing but a cpuset set (`_ready_patch`). Of the
        request only the pod's id is parsed (`create_sandbox`), and the container's keys too when
        nothing was read ahead for the pod (`create_keys`); the cpuset goes as a patch the runtime
        merges over the request's own; the container's name follows once the request went on
        (`after`, which the relay runs when the call ends, or a while after its write when it
        does not), and its pending record a loop turn later (`_record`), unless the hooks after
        the call come first: then it goes in as created (`_went_in`). Else None and the pre hook
        runs: a debug line to write, keys that do not decode, an unknown pod, an exclusive or
        dry-run create, or the `fail` policy (a request that does not decode is then refused
        before it goes, which only the pre hook's path does)."""
        if debug_enabled():
            return None
        settings = self.settings()
        if settings.dry_run or settings.fail_policy == _FAIL:
            return None
        sandbox_id = create_sandbox(message)
        if sandbox_id is None:
            return None
        pod = self.state.pod(sandbox_id)
        if pod is None:
            return None
        early = self.policy.before_create(pod, None)
        if early is None:  # nothing read ahead for the pod: the container's own keys are asked
            keys = create_keys(message)
            early = self.policy.before_create(pod, pending_id(*keys)) if keys is not None else None
            if early is None:
                return None
        patch = self._ready_patch(info.path, early.decision)
        if patch is None:
            return None

        def after(sent: Message) -> None:
            request: Any = sent  # as the runtime reads it: the keys the hooks after the call see
            name, attempt = request.config.metadata.name, request.config.metadata.attempt
            pid = pending_id(sandbox_id, name, attempt)
            pending = _Pending(pod, pid, name, attempt, request.config.linux.resources, info.version)
            self._unrecorded[pid] = (pending, early, str(early.decision.cpuset))
            soon(self._record, pid)  # unless the hooks after the call come first (`_went_in`)

        return Ready(patch, after)

    def _ready_patch(self, path: str, decision: ContainerDecision) -> bytes | None:
        """The cpuset patch for a create whose `decision` (read ahead) is all it needs: a cpuset to
        set, nothing to vacate first (`_cpuset_only`; the caller asks about the dry run). Kept for
        the last decision: a pod's creates read the same one ahead, one after another, and the
        checks and the patch cost each ~30 µs on the path with the caches cold."""
        last = self._last_patch
        if last is not None and last[0] is decision and last[1] == path:
            return last[2]
        patch = _cpuset_patch(path, str(decision.cpuset)) if _cpuset_only(decision) else None
        self._last_patch = (decision, path, patch)
        return patch

    def _sure(self, decision: ContainerDecision) -> bool:
        """Whether a decision read early (`Policy.before_create`) is all a create needs on its path:
        a cpuset to set, nothing to vacate first, not a dry run."""
        return _cpuset_only(decision) and not self.dry_run

    def _record(self, pid: str) -> None:
        """What a create decided early leaves until its request went on: its pending record, the
        line kept about it, the count. Done first by the hooks after its call too (`_said`), so that
        its answer, however soon it comes, finds them."""
        waiting = self._unrecorded.pop(pid, None)
        if waiting is None:
            return
        pending, early, cpus = waiting
        decision = early.decision
        self.state.put_container(pending.record())
        self.policy.took_early(early, pid)  # the post hook then asks nothing again
        self._line(pid, pending.pod, pending.name, GIVEN, decision.qos, cpus, decision.why)
        self._injected(decision)

    def _injected(self, decision: ContainerDecision) -> None:
        """A create that goes on with `decision`'s cpuset: counted by its QoS class."""
        qos = str(decision.qos)
        self.injected[qos] = self.injected.get(qos, 0) + 1

    def _line(self, pid: str, pod: PodRecord, name: str, message: str, *args: object) -> None:
        """The INFO line about create `pid`, kept until its call ends (`_said`)."""
        lines = self._lines
        if pid in lines:  # the same create again before the first one ended: that one's line goes now
            self._said(pid, "; no answer yet")
        elif len(lines) >= LINES_WAITING:  # answers that never come (a hung runtime): none is lost
            self._said(next(iter(lines)), "; no answer yet")
        lines[pid] = (pod, name, message, args)

    def _said(self, pid: str, outcome: str) -> None:
        """Write the line kept about create `pid`, with what became of it."""
        self._record(pid)  # a create decided early: its record and kept line first, if still waiting
        kept = self._lines.pop(pid, None)
        if kept is not None:
            pod, name, message, args = kept
            put_off(_say, pod, name, "INFO", message + "{}", *args, outcome)

    def _refuse_bad_annotation(self, pod: PodRecord, problems: list[Problem], pid: str) -> None:
        """The pod's `problems` name an annotation that does not parse: refused under fail policy."""
        if not problems or self.fail_policy is not FailPolicy.FAIL or self.dry_run:  # dry-run neither
            return
        for problem in problems:
            if problem.kind is ProblemKind.BAD_ANNOTATION:
                self.state.remove_container(pid)
                raise HookError(grpc.StatusCode.INVALID_ARGUMENT, f"pod {pod.key}: {problem.message}")

    async def _vacate(self, pod: PodRecord, name: str, cpus: str) -> None:
        """Exclusivity first: other containers leave these CPUs before this one is created."""
        ticket = self.reconciler.request()
        if not await self.reconciler.wait_for(ticket, self.exclusive_wait):
            self.exclusive_timeouts += 1
            left = [
                p.message
                for p in self.policy.plan().problems
                if p.kind is ProblemKind.EXCLUSIVE_OVERLAP and p.pod == pod.key
            ]
            log, who = about_pod(pod, name)
            log.warning(
                "{}: other containers did not leave CPUs {} within {} s; creating anyway{}",
                who,
                cpus,
                self.exclusive_wait,
                "".join(f"; {message}" for message in left),
            )

    async def container_created(self, request: Message, response: Message, info: MethodInfo) -> None:
        req: Any = request
        pid = pending_id(req.pod_sandbox_id, req.config.metadata.name, req.config.metadata.attempt)
        cid = response.container_id  # type: ignore[attr-defined]
        resources = req.config.linux.resources
        applied = canonical_cpuset(resources.cpuset_cpus)
        waiting = self._unrecorded.pop(pid, None)
        if waiting is not None:
            self._went_in(waiting, cid, resources_bytes(resources), applied)
            return
        self._said(pid, f"; created {cid[:13]}")
        # asked of the pending record, before the rename (which changes no decision but a v1 kubelet
        # file's): as the pre hook asked, so usually without making the node's plan on the call's path
        pod = self.state.pod(req.pod_sandbox_id)
        settled = (
            pod is not None and not self.policy.ids_matter() and self.policy.as_decided(pod, pid, applied)
        )
        self._learned.discard(req.pod_sandbox_id)
        kept = resources_bytes(resources)
        if self.state.rename_container(pid, cid, resources=kept, applied=applied):
            self.reconciler.created(cid)  # its cgroup has what this create set: its start needs no check
            # the pod's next container may come next: when what was read ahead for it still holds,
            # the plan waits (a create right behind, often in a burst, needs none)
            self._plan_soon(req.pod_sandbox_id, PLAN_LATER if self.policy.renamed(pid) else 0.0)
            if not settled:
                self.reconciler.request()
            return
        self._plan_soon(req.pod_sandbox_id)
        if self.state.container(cid) is None and self.state.pod(req.pod_sandbox_id):
            # the pending record went meanwhile (a merge resolved or dropped it): never lose the container
            self.state.put_container(
                ContainerRecord(
                    id=cid,
                    sandbox_id=req.pod_sandbox_id,
                    name=req.config.metadata.name,
                    attempt=req.config.metadata.attempt,
                    api_version=info.version,
                )
            )
        self.state.update_container(cid, resources=kept, applied=applied)
        self.reconciler.request()

    def _went_in(self, waiting: tuple[_Pending, Early, str], cid: str, kept: bytes, applied: str) -> None:
        """A create decided early whose call ended before its pending record went in (the usual
        ready create, `ready_create`): the container goes in as created, in one change instead of
        two (its pending record, then its runtime id), with what its record would have led to
        (`_record`, then the rename's). Half the state's and the policy's work after a create, done
        where the caller waits to be woken by its answer."""
        pending, early, cpus = waiting
        pod = pending.pod
        decision = early.decision
        self._learned.discard(pod.sandbox_id)
        self.state.put_container(pending.created(cid, kept, applied))
        self.policy.took_early(early, cid)
        settled = not self.policy.ids_matter() and self.policy.as_decided(pod, cid, applied)
        self._injected(decision)
        put_off(
            _say,
            pod,
            pending.name,
            "INFO",
            GIVEN + "{}",
            decision.qos,
            cpus,
            decision.why,
            f"; created {cid[:13]}",
        )
        self.reconciler.created(cid)
        self._plan_soon(pod.sandbox_id, PLAN_LATER if self.policy.went_in(cid) else 0.0)
        if not settled:
            self.reconciler.request()

    async def create_failed(self, request: Message, code: grpc.StatusCode, info: MethodInfo) -> None:
        req: Any = request
        sid = req.pod_sandbox_id
        pid = pending_id(sid, req.config.metadata.name, req.config.metadata.attempt)
        self._said(pid, f"; not created: {code.name}")
        self.state.remove_container(pid)
        if sid in self._learned:
            self._learned.discard(sid)
            if code is grpc.StatusCode.NOT_FOUND and not any(self.state.containers_of(sid)):
                # learnt from this very call and the runtime has no such sandbox (removed meanwhile):
                # forget it, or its exclusive CPUs would stay carved out of the pools
                self.state.remove_pod(sid)
        self.reconciler.request()  # roll back: pools widen again if this was exclusive
        self._plan_soon(sid)  # the create again, as a kubelet retries

    def _refuse_offline(self, container_id: str, requested: str) -> None:
        """A cpuset naming CPUs that are not online is refused, as the runtime would have."""
        try:
            cpus = CPUSet.parse(requested)
        except CpuError as exc:
            raise HookError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"container {container_id[:13]}: cpuset_cpus {requested!r} does not parse: {exc}",
            ) from None
        online = self.policy.topology.online
        offline = cpus - online
        if offline:
            raise HookError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"container {container_id[:13]}: cpuset_cpus {requested!r} names CPUs {offline} "
                f"that are not online (online: {online})",
            )

    async def update_resources(self, request: Message, info: MethodInfo) -> Message:
        """Any client's update (kubelet's, crictl's): merged into what we know (as the runtime
        holds it now), the decided cpuset kept, sent whole. A requested cpuset the decision
        replaces is logged and counted, never dropped silently; one naming CPUs that are not
        online is refused."""
        req: Any = request
        self.reconciler.updating(req.container_id)  # an update around its start: the start is checked
        requested = req.linux.cpuset_cpus if req.HasField("linux") else ""
        if requested and not self.dry_run:
            self._refuse_offline(req.container_id, requested)
        if not req.HasField("linux"):
            return request
        c = self.state.container(req.container_id)
        if c is None and self.learn is not None:  # e.g. kubelet's update right after our restart
            await self.learn(LEARN_WAIT)
            c = self.state.container(req.container_id)
        if c is None:
            return request
        # as the runtime holds it (a limit changed there directly is not put back), not in dry-run
        merged = c.linux_resources() if self.dry_run else await self.reconciler.resources_held(c)
        merge_linux_resources(merged, req.linux)
        decision = self._decision_for(c.id)
        if decision is not None and decision.qos not in (None, QoS.KUBELET) and decision.cpuset is not None:
            decided = str(decision.cpuset)
            if requested and canonical_cpuset(requested) != decided:
                self.replaced += 1
                log, who = about(self.state, c)
                log.warning(
                    "{}: UpdateContainerResources asked for cpuset {}; {} ({}: {}){}",
                    who,
                    requested,
                    "would replace it, but dry-run forwards it" if self.dry_run else f"replaced by {decided}",
                    decision.qos,
                    decision.why,
                    "" if not self.dry_run else " [dry-run]",
                )
            if not self.dry_run:
                merged.cpuset_cpus = decided
        elif not merged.cpuset_cpus and c.applied:
            merged.cpuset_cpus = c.applied
        if self.dry_run:
            return request
        req.linux.ParseFromString(merged.SerializeToString())
        return request

    async def resources_updated(self, request: Message, response: Message, info: MethodInfo) -> None:
        req: Any = request
        c = self.state.container(req.container_id)
        if c is None or not req.HasField("linux"):
            return
        merged = c.linux_resources()
        merge_linux_resources(merged, req.linux)
        self.state.update_container(
            c.id, resources=merged.SerializeToString(), applied=canonical_cpuset(merged.cpuset_cpus)
        )

    async def container_started(self, request: Message, response: Message, info: MethodInfo) -> None:
        cid = request.container_id  # type: ignore[attr-defined]
        was = self.state.container(cid)
        before = self.state.rules_generation
        if self.state.update_container(cid, state=ContainerState.RUNNING) is None:
            return
        if was is not None and was.state in LIVE_STATES:  # its pod's containers the rules see are the same
            self.policy.moved_nothing(before)  # a kubelet's next create in the pod reads ahead still
        if self._planning is not None:  # the plan after its create: made now, not as the next comes
            self._plan_now()
        if not self.dry_run:
            self.reconciler.verify_started(cid)

    async def container_stopped(self, request: Message, response: Message, info: MethodInfo) -> None:
        self.state.update_container(request.container_id, state=ContainerState.EXITED)  # type: ignore[attr-defined]
        self.reconciler.request()
        self._plan_soon()

    async def container_removed(self, request: Message, response: Message, info: MethodInfo) -> None:
        if self.state.remove_container(request.container_id) is not None:  # type: ignore[attr-defined]
            self.reconciler.request()
            self._plan_soon()
