"""A node's bad day at random, against the real containerd and runc (2 CPUs).

Pods of every QoS come and go (at most one exclusive pod at a time, on CPU 1); containers are
created, started, stopped and removed, through the proxy or behind its back, or their process is
killed (as by the OOM killer); the kubelet sends its cpuset-only updates and its in-place resizes
(a new memory limit); an operator writes a cgroup by hand, or reloads the configuration with other
reserved or system CPUs (or with a value the proxy must refuse, keeping the running one); the proxy
is SIGKILLed and started again (at rest or a moment into a create sent through it) or sent SIGHUP;
the kubelet's static CPU manager gives Guaranteed pods CPUs in its state file, or the file is
removed or left half-written; containerd restarts, crashes (SIGKILL, then started again), or stalls
(SIGSTOP) under a create whose deadline passes; on a day the proxy also watches the Kubernetes API
(the test API server), the scheduler re-binds pods or relabels them there (some of it as a
malformed annotation, some lost to compaction so that only a re-list sees it), pods leave the API,
and the API's watches are cut, expire or the server goes down — in any order hypothesis picks, and
on a busy day with a kubelet starting containers all the while.

After the steps, within a deadline, the proxy must know exactly the containers containerd has, with
nothing pending, every running container's cgroup must hold what the proxy decided (and the memory
limit the kubelet's last resize set), and that must be what `cri-proxy plan` decides afresh from
the proxy's snapshot (`converge.mismatch`); with the API, each pod's QoS label and allocation as
the API has them now; the proxy must never have logged a traceback and must stop cleanly.

CI runs four days drawn from a fixed seed and the three written out below;
`CRI_PROXY_CHAOS_EXAMPLES=250` runs more (a few seconds each).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import ProxyProcess
from containerd import CriClient, PrivateContainerd, connect, container_cgroup_file, remove_all_pods
from converge import mismatch, wait_for
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from kube import QoS, create, linux_resources, pod_sandbox_config

from cri_api.v1 import api_pb2 as v1

try:
    from tests.unit.kube_api_server import KubeApiServer
except ImportError:  # run as `pytest tests/e2e/...` without the repository on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.unit.kube_api_server import KubeApiServer

pytestmark = pytest.mark.e2e

QOS = "koordinator.sh/qosClass"
ALLOC = "scheduling.koordinator.sh/resource-status"
EXAMPLES = int(os.environ.get("CRI_PROXY_CHAOS_EXAMPLES", "4"))

# kind -> (the kubelet's QoS class, the Koordinator labels and annotations)
KINDS: dict[str, tuple[QoS, dict[str, str], dict[str, str]]] = {
    "ls": ("burstable", {QOS: "LS"}, {}),
    "be": ("besteffort", {QOS: "BE"}, {}),
    "lsr": ("guaranteed", {QOS: "LSR"}, {ALLOC: json.dumps({"cpuset": "1"})}),
    "lse": ("guaranteed", {QOS: "LSE"}, {ALLOC: json.dumps({"cpuset": "1"})}),
    "burstable": ("burstable", {}, {}),
    "besteffort": ("besteffort", {}, {}),
    "guaranteed": ("guaranteed", {}, {}),
    "system": ("burstable", {QOS: "SYSTEM"}, {}),
}
EXCLUSIVE = ("lsr", "lse")
BUSY, BUSY_MOST = "busy", 12  # the names of the busy kubelet's containers, and how many in a day
STALLED = "stalled"  # the names of the containers created while containerd stalls
CUT = "cut"  # the names of the containers whose create the proxy was killed under
CONFIG = "reconcile_period_seconds = 1.0\nexclusive_wait_seconds = 2.0\n"
NODE = "chaos-node"
LABELS = ("LS", "BE", "SYSTEM", "")  # what the API's QoS label says (not exclusive: one at a time)
ALLOCS = ("0", "1", "", "x", "not json")  # what the API's allocation says: a cpuset, none, malformed
CPUS = ("", "0", "1", "0-1", "2", "one")  # reserved or system CPUs; refused: every CPU reserved, 2, one

Step = tuple[Any, ...]
VIA = ("proxy", "direct")  # through the proxy, or behind its back
STEPS: st.SearchStrategy[Step] = st.one_of(
    st.tuples(st.just("pod"), st.sampled_from(sorted(KINDS))),
    st.tuples(st.just("container"), st.integers(0, 9), st.booleans(), st.sampled_from(VIA)),
    st.tuples(st.sampled_from(["start", "stop", "remove"]), st.integers(0, 9), st.sampled_from(VIA)),
    st.tuples(st.just("kubelet-update"), st.integers(0, 9)),
    st.tuples(st.just("resize"), st.integers(0, 9), st.sampled_from([48, 64, 96])),
    st.tuples(st.just("drift"), st.integers(0, 9), st.sampled_from(["0", "1", "0-1"])),
    st.tuples(st.just("oom"), st.integers(0, 9)),
    st.tuples(st.just("kill-proxy-mid-create"), st.integers(0, 9), st.sampled_from([0.0, 0.003, 0.01, 0.03])),
    st.tuples(st.sampled_from(["stop-pod", "remove-pod"]), st.integers(0, 9), st.sampled_from(VIA)),
    st.tuples(st.just("stall"), st.integers(0, 9), st.sampled_from([0.5, 1.5])),
    st.tuples(st.just("config"), st.sampled_from(CPUS), st.sampled_from(CPUS)),
    st.tuples(st.just("kubelet-file"), st.sampled_from(["0", "1", "none", "half-written", "removed"])),
    st.tuples(st.sampled_from(["kill-proxy", "hup-proxy", "restart-containerd", "crash-containerd"])),
    # the Kubernetes API (on a day the proxy watches it): True: the change's event is sent, False:
    # lost to compaction (the watch then expires: a re-list sees it)
    st.tuples(st.just("api-label"), st.integers(0, 9), st.sampled_from(LABELS), st.booleans()),
    st.tuples(st.just("api-alloc"), st.integers(0, 9), st.sampled_from(ALLOCS), st.booleans()),
    st.tuples(st.just("api-delete"), st.integers(0, 9)),
    st.tuples(st.just("api"), st.sampled_from(["drop", "expire", "gone-http", "down", "up"])),
)


class Day:
    """One example's node: the proxy in front of containerd, and the steps taken on them."""

    def __init__(self, containerd: PrivateContainerd, name: str, api: KubeApiServer | None) -> None:
        self.containerd = containerd
        self.api = api
        self.config = containerd.workdir / f"{name}.toml"
        self.table = ""  # the [kubernetes] table, last in the file (the keys after it are its own)
        if api is not None:
            kubeconfig = api.kubeconfig(containerd.workdir / f"{name}.kubeconfig")
            self.table = f'[kubernetes]\nenabled = true\nnode_name = "{NODE}"\nkubeconfig = "{kubeconfig}"\n'
        self.config.write_text(CONFIG + self.table)
        self.proxy = ProxyProcess(containerd, "--config", str(self.config), name=name)
        self.numbers = itertools.count(1)  # names made unique (steps and the busy kubelet alike)
        self.configs: dict[str, tuple[Any, str]] = {}  # sandbox id -> (its config, its kind)
        self.kubelet_file = containerd.workdir / "cpu_manager_state"  # ProxyProcess's --kubelet-state-file
        self.kubelet: dict[str, Any] | None = None  # the static policy's state as last written whole
        self.memory: dict[str, int] = {}  # container id -> the memory limit its last resize set

    def pods(self, cri: CriClient) -> list[tuple[str, Any, str]]:
        """(id, config, kind) of the ready pods, oldest first: indexes in the steps pick among them."""
        ready = v1.PodSandboxFilter(state=v1.PodSandboxStateValue(state=v1.SANDBOX_READY))
        items = cri.runtime.ListPodSandbox(v1.ListPodSandboxRequest(filter=ready), timeout=30).items
        ordered = sorted(items, key=lambda p: (p.created_at, p.id))
        return [(p.id, *self.configs[p.id]) for p in ordered if p.id in self.configs]

    def containers(self, cri: CriClient, *states: int) -> list[v1.Container]:
        """The steps' containers in `states`, oldest first. Not the busy kubelet's, whose create and
        start it alone sends (containerd refuses a remove while a start is under way); nor those
        whose create failed at its deadline or lost the proxy under it: the kubelet never learns
        their ids (containerd may have made one all the same, and half: its start fails on the
        sandbox's namespaces; or its start, cut with the proxy, is still "in starting state")."""
        listed = cri.runtime.ListContainers(v1.ListContainersRequest(), timeout=30).containers
        theirs = (BUSY, STALLED, CUT)
        mine = (c for c in listed if c.state in states and not c.metadata.name.startswith(theirs))
        return sorted(mine, key=lambda c: (c.created_at, c.id))

    def take(self, step: Step) -> None:
        op, *args = step
        with connect(self.proxy.address) as through, connect(self.containerd.address) as direct:
            live = (v1.CONTAINER_CREATED, v1.CONTAINER_RUNNING)
            if op == "pod":
                kind = args[0]
                if kind in EXCLUSIVE and any(k in EXCLUSIVE for _, _, k in self.pods(direct)):
                    return  # one exclusive pod at a time on CPU 1 (two would be a conflict by design)
                qos, labels, annotations = KINDS[kind]
                config = pod_sandbox_config(
                    v1,
                    f"{kind}-{next(self.numbers)}",
                    qos=qos,
                    labels=labels,
                    annotations=annotations,
                    log_root=self.containerd.pod_log_dir,
                )
                sandbox = through.runtime.RunPodSandbox(v1.RunPodSandboxRequest(config=config), timeout=30)
                self.configs[sandbox.pod_sandbox_id] = (config, kind)
                if self.api is not None:  # the pod as the API has it (put after the kubelet ran it)
                    meta = config.metadata
                    self.api.put_pod(meta.name, meta.uid, labels, annotations, namespace=meta.namespace)
                create(through, (sandbox.pod_sandbox_id, config), "app")
            elif op == "container":
                pods = self.pods(direct)
                if pods:
                    sandbox_id, config, _ = pods[args[0] % len(pods)]
                    cri = through if args[2] == "proxy" else direct
                    create(cri, (sandbox_id, config), f"c{next(self.numbers)}", start=args[1])
            elif op in ("start", "stop", "remove", "kubelet-update", "resize", "drift", "oom"):
                states = {
                    "start": (v1.CONTAINER_CREATED,),
                    "stop": (v1.CONTAINER_RUNNING,),
                    "drift": (v1.CONTAINER_RUNNING,),
                    "oom": (v1.CONTAINER_RUNNING,),
                }.get(op, live)
                found = self.containers(direct, *states)
                if op == "start":  # as the kubelet: only in a pod still ready (else the runtime refuses)
                    ready = {sandbox_id for sandbox_id, _, _ in self.pods(direct)}
                    found = [c for c in found if c.pod_sandbox_id in ready]
                if found:
                    cri = direct if args[1:] == ["direct"] else through
                    self.on_container(cri, found[args[0] % len(found)], op, *args[1:])
            elif op in ("stop-pod", "remove-pod"):
                pods = self.pods(direct)
                if pods:
                    sandbox_id = pods[args[0] % len(pods)][0]
                    rt = (direct if args[1] == "direct" else through).runtime
                    rt.StopPodSandbox(v1.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=30)
                    if op == "remove-pod":
                        rt.RemovePodSandbox(v1.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=30)
            elif op == "stall":  # containerd hangs under a create: the caller's deadline passes
                pods = self.pods(direct)
                pid = self.containerd.pid
                if pods and pid is not None:
                    sandbox_id, config, _ = pods[args[0] % len(pods)]
                    name = f"{STALLED}{next(self.numbers)}"
                    os.kill(pid, signal.SIGSTOP)
                    try:
                        with pytest.raises(grpc.RpcError) as raised:
                            create(through, (sandbox_id, config), name, start=False, timeout=args[1])
                        assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED, raised.value
                    finally:
                        os.kill(pid, signal.SIGCONT)
            elif op == "kill-proxy-mid-create":
                pods = self.pods(direct)
                if pods:
                    sandbox_id, config, _ = pods[args[0] % len(pods)]
                    self.kill_proxy_under(through, (sandbox_id, config), args[1])
            elif op == "config":
                self.reload(*args)
            elif op.startswith("api"):
                self.on_api(op, args, direct)
            elif op == "kubelet-file":
                self.write_kubelet_file(args[0], direct)
            elif op == "kill-proxy":
                self.proxy.kill()
                self.proxy.start()
            elif op == "hup-proxy":
                assert self.proxy.proc is not None
                self.proxy.proc.send_signal(signal.SIGHUP)
            elif op == "restart-containerd":
                self.containerd.restart()
            elif op == "crash-containerd":  # killed (the OOM killer, a panic), then started again
                self.containerd.kill()
                self.containerd.start_daemon()

    def on_container(self, cri: CriClient, c: v1.Container, op: str, *args: Any) -> None:
        rt = cri.runtime
        if op == "start":
            rt.StartContainer(v1.StartContainerRequest(container_id=c.id), timeout=30)
        elif op == "stop":
            rt.StopContainer(v1.StopContainerRequest(container_id=c.id, timeout=1), timeout=30)
        elif op == "remove":
            rt.RemoveContainer(v1.RemoveContainerRequest(container_id=c.id), timeout=30)
        elif op == "kubelet-update":
            # the CPU manager's cpuset-only update: the container's own entry or the shared set
            update = v1.UpdateContainerResourcesRequest(
                container_id=c.id, linux=v1.LinuxContainerResources(cpuset_cpus=self.kubelet_set(c))
            )
            rt.UpdateContainerResources(update, timeout=30)
        elif op == "resize":  # the kubelet's in-place resize: every resource, the memory limit new
            known = self.configs.get(c.pod_sandbox_id)
            qos = KINDS[known[1]][0] if known is not None else "besteffort"
            if qos == "besteffort":
                return  # no resize changes a pod's QoS class
            linux = linux_resources(v1, qos, memory_limit=args[0] << 20, cpuset_cpus=self.kubelet_set(c))
            self.memory.pop(c.id, None)  # not known until answered (it may land all the same)
            rt.UpdateContainerResources(
                v1.UpdateContainerResourcesRequest(container_id=c.id, linux=linux), timeout=30
            )
            self.memory[c.id] = args[0] << 20
        elif op == "oom":  # the container's process killed behind everyone's back: it exits
            status = v1.ContainerStatusRequest(container_id=c.id, verbose=True)
            verbose = rt.ContainerStatus(status, timeout=30)
            with contextlib.suppress(KeyError, ValueError, ProcessLookupError):
                os.kill(int(json.loads(verbose.info["info"])["pid"]), signal.SIGKILL)
            # the next step comes once containerd has seen the exit (a call to the container in
            # between is answered "ttrpc: closed", directly too, as the kubelet's would be)
            exited = v1.ContainerStatusRequest(container_id=c.id)
            wait_for(
                lambda: (
                    None
                    if rt.ContainerStatus(exited, timeout=30).status.state == v1.CONTAINER_EXITED
                    else "containerd has not seen the exit"
                ),
                10,
            )
        elif op == "drift":  # an operator's echo into the cgroup, behind containerd's back
            parent = self.parent_of(c)
            if parent is not None:
                # it may have exited meanwhile, or the set is not within its pod's: as by hand
                with contextlib.suppress(OSError):
                    container_cgroup_file(parent, c.id, "cpuset.cpus").write_text(args[0])

    def kill_proxy_under(self, through: CriClient, pod: tuple[str, Any], after: float) -> None:
        """SIGKILL the proxy `after` seconds into a create (and start) sent through it, then start
        it again: containerd may make the container all the same, which the proxy then finds."""
        answered: list[BaseException | None] = []

        def call() -> None:
            try:
                create(through, pod, f"{CUT}{next(self.numbers)}")
                answered.append(None)
            except grpc.RpcError as err:
                answered.append(err)

        caller = threading.Thread(target=call)
        caller.start()
        time.sleep(after)
        self.proxy.kill()
        caller.join(60)
        assert answered, "a call through a proxy that was killed got no answer"
        err = answered[0]
        if isinstance(err, grpc.RpcError):  # the connection went with the proxy
            assert err.code() is grpc.StatusCode.UNAVAILABLE, err
        self.proxy.start()

    def keep_creating(self, stop: threading.Event, errors: list[BaseException]) -> None:
        """A kubelet starting containers all day through the proxy, up to BUSY_MOST, in an LS pod
        of its own (the steps' pod stops would race its starts, which the kubelet's pod worker
        never lets happen); whatever it is answered it goes on (as the kubelet retries), on a new
        connection after an error (the proxy may have been killed)."""
        config = pod_sandbox_config(
            v1, BUSY, qos="burstable", labels={QOS: "LS"}, log_root=self.containerd.pod_log_dir
        )
        pod: tuple[str, Any] | None = None
        made = 0
        while not stop.is_set() and made < BUSY_MOST:
            try:
                with connect(self.proxy.address) as through:
                    while not stop.is_set() and made < BUSY_MOST:
                        if pod is None:
                            run = through.runtime.RunPodSandbox(
                                v1.RunPodSandboxRequest(config=config), timeout=30
                            )
                            pod = (run.pod_sandbox_id, config)
                        create(through, pod, f"{BUSY}{next(self.numbers)}")
                        made += 1
                        stop.wait(0.05)
            except grpc.RpcError:
                stop.wait(0.05)
            except BaseException as err:  # a bug in the test's kubelet: the test must say so
                errors.append(err)
                return

    def write_kubelet_file(self, how: str, direct: CriClient) -> None:
        """The kubelet's static policy giving each ready Guaranteed pod's containers CPU `how`, the
        none policy, a file cut short as a crash mid-write leaves it, or no file."""
        if how == "removed":
            self.kubelet_file.unlink(missing_ok=True)
            self.kubelet = None
        elif how == "half-written":
            self.kubelet_file.write_text('{"policyName": "static", "defaultCpuSet": "0-')
        else:
            entries = {
                config.metadata.uid: {"app": how}
                for _, config, kind in self.pods(direct)
                if kind == "guaranteed" and how != "none"
            }
            default = "0-1" if how == "none" else ("1" if how == "0" else "0")
            state = {"policyName": "static" if how != "none" else "none", "defaultCpuSet": default}
            self.kubelet = {**state, "entries": entries} if how != "none" else None
            staged = self.kubelet_file.with_suffix(".new")
            staged.write_text(json.dumps(self.kubelet or state))
            staged.rename(self.kubelet_file)  # the kubelet's checkpoint is written whole, then renamed

    def on_api(self, op: str, args: list[Any], direct: CriClient) -> None:
        """The scheduler's or the API server's doing; nothing on a day without the API."""
        api = self.api
        if api is None:
            return
        if op == "api":
            api.fault(args[0])  # "up" on the port it had: the kubeconfig names it
            return
        uids = [config.metadata.uid for _, config, _ in self.pods(direct)]
        held = [uid for uid in uids if api.pod(uid) is not None]
        if not held:
            return
        uid = held[args[0] % len(held)]
        pod = api.pod(uid)
        assert pod is not None
        meta = pod["metadata"]
        if op == "api-delete":
            api.delete_pod(uid)
            return
        emit = args[2]
        if op == "api-label":
            labels = {k: v for k, v in meta["labels"].items() if k != QOS}
            api.label(uid, labels | ({QOS: args[1]} if args[1] else {}), emit=emit)
        else:
            cpus = args[1]
            annotations = {k: v for k, v in meta["annotations"].items() if k != ALLOC}
            if cpus:
                annotations[ALLOC] = cpus if cpus == "not json" else json.dumps({"cpuset": cpus})
            api.annotate(uid, annotations, emit=emit)
        if not emit:
            api.expire()  # compaction: the watch is told 410, and a re-list finds the change

    def memory_mismatch(self, direct: CriClient) -> str | None:
        """A running container whose memory limit is not what the kubelet's last resize set: the
        proxy's own updates (its moves, its repairs, after a restart too) carry every resource,
        and must carry the kubelet's latest, not what the proxy knew before."""
        for c in self.containers(direct, v1.CONTAINER_RUNNING):
            want, parent = self.memory.get(c.id), self.parent_of(c)
            if want is None or parent is None:
                continue
            path = container_cgroup_file(parent, c.id, "memory.limit_in_bytes", controller="memory")
            try:
                have = int(path.read_text())
            except (OSError, ValueError):
                continue  # it exited meanwhile
            if have != want:
                return f"{c.metadata.name}: memory.limit_in_bytes {have}, the kubelet's resize set {want}"
        return None

    def api_mismatch(self) -> str | None:
        """A ready pod the API holds whose QoS label or allocation the proxy has not as the API has them."""
        if self.api is None:
            return None
        for pod in self.proxy.ctl_json("snapshot")["pods"]:
            held = self.api.pod(pod["uid"])
            if held is None:
                continue
            meta = held["metadata"]
            mine = (pod["labels"].get(QOS), pod["annotations"].get(ALLOC))
            theirs = (meta["labels"].get(QOS), meta["annotations"].get(ALLOC))
            if mine != theirs:
                return f"{pod['namespace']}/{pod['name']}: the proxy has {mine}, the API {theirs}"
        return None

    def reload(self, reserved: str, system: str) -> None:
        """The operator's SIGHUP after writing `reserved_cpus` and `system_cpus`. Values the node
        cannot take (every CPU reserved, a CPU it does not have, not a CPU list) are refused, the
        running configuration kept; the operator then puts the last good file back."""
        good = self.config.read_text()
        cpus = f'reserved_cpus = "{reserved}"\nsystem_cpus = "{system}"\n'
        self.config.write_text(CONFIG + cpus + self.table)
        refused = reserved == "0-1" or bool({reserved, system} & {"2", "one"})
        log, answer = self.proxy.log_path, "reload refused" if refused else "configuration reloaded"
        before = log.read_text().count(answer)
        assert self.proxy.proc is not None
        self.proxy.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: None if log.read_text().count(answer) > before else f"no {answer!r} in the log", 20)
        if refused:
            self.config.write_text(good)

    def kubelet_set(self, c: v1.Container) -> str:
        """What the kubelet's CPU manager sends a container: its entry, else the shared set."""
        if self.kubelet is None:
            return "0-1"
        known = self.configs.get(c.pod_sandbox_id)
        uid = known[0].metadata.uid if known is not None else ""
        return str(self.kubelet["entries"].get(uid, {}).get(c.metadata.name, self.kubelet["defaultCpuSet"]))

    def parent_of(self, c: v1.Container) -> str | None:
        known = self.configs.get(c.pod_sandbox_id)
        return str(known[0].linux.cgroup_parent) if known is not None else None


def empty_node(containerd: PrivateContainerd, within: float = 60.0) -> None:
    """Every pod removed, for the next day: again while containerd still refuses (a start it has
    under way for a call whose client is gone, after a proxy killed or a stall: "container is in
    starting state, can't be removed")."""
    deadline = time.monotonic() + within
    while True:
        try:
            with connect(containerd.address) as direct:
                remove_all_pods(direct)
            return
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # an example takes seconds: no shrinking
)
@example(  # the scheduler's changes in the API lost to compaction: only a re-list finds them
    first=["ls", "be"],
    steps=[
        ("container", 0, True, "proxy"),
        ("api-label", 0, "BE", False),
        ("api-alloc", 1, "1", False),
        ("kubelet-update", 0),
    ],
    busy=False,
    api=True,
)
@example(  # the proxy killed under creates, a process killed, containerd crashed, a resize kept
    first=["ls", "lsr"],
    steps=[
        ("kill-proxy-mid-create", 0, 0.005),
        ("container", 1, True, "proxy"),
        ("oom", 0),
        ("kill-proxy-mid-create", 1, 0.02),
        ("crash-containerd",),
        ("kubelet-update", 0),
        ("resize", 0, 96),  # the LSR pod's container (64 MiB at its create): its repair keeps 96
        ("drift", 0, "0-1"),
    ],
    busy=False,
    api=False,
)
@example(  # a reload the last change of the day: the system pod's CPUs move, nothing else changes
    first=["ls", "be", "system"],
    steps=[
        ("container", 2, True, "proxy"),
        ("kubelet-update", 0),
        ("config", "one", "0"),
        ("config", "", "0"),
    ],
    busy=False,
    api=False,
)
@given(
    first=st.lists(st.sampled_from(sorted(KINDS)), min_size=2, max_size=4),
    steps=st.lists(STEPS, min_size=4, max_size=20),
    busy=st.booleans(),
    api=st.booleans(),
)
def test_whatever_the_day_brings_the_node_settles_as_decided(
    containerd: PrivateContainerd, first: list[str], steps: list[Step], busy: bool, api: bool
) -> None:
    """The node begins with a few pods of the kinds `first` names, then takes `steps`; on a `busy`
    day a kubelet starts containers all the while; on an `api` day the proxy watches the API."""
    server = KubeApiServer(node=NODE).start() if api else None
    day = Day(containerd, f"chaos-{time.monotonic_ns()}", server)
    day.proxy.start()
    if server is not None:  # the API's changes are the day's, not what the proxy's first list finds
        wait_for(lambda: None if server.open_watches else "the proxy does not watch the API", 20)
    taken: list[str] = [f"busy={busy}", f"api={api}"]
    stop = threading.Event()
    errors: list[BaseException] = []
    kubelet = threading.Thread(target=day.keep_creating, args=(stop, errors))
    try:
        for n, step in enumerate([("pod", kind) for kind in first] + steps):
            if busy and n == len(first):
                kubelet.start()
            try:
                day.take(step)
            except grpc.RpcError as err:  # as the kubelet: an answer is an answer, it goes on
                if err.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                    raise AssertionError(f"{step}: {err.code().name} {err.details()}") from err
            taken.append(repr(step))
        stop.set()
        if kubelet.is_alive():
            kubelet.join(60)
        assert not errors, errors
        if server is not None:
            server.fault("up")  # back up by the day's end
        with connect(containerd.address) as direct:
            wait_for(
                lambda: mismatch(day.proxy, containerd) or day.api_mismatch() or day.memory_mismatch(direct)
            )
        assert day.proxy.stop() == 0, "the proxy did not stop cleanly"
        log = day.proxy.log_path.read_text()
        assert "Traceback" not in log, log[-4000:]
    except BaseException as err:
        log = day.proxy.log_path.read_text() if day.proxy.log_path.exists() else ""
        kept = Path(tempfile.gettempdir()) / f"cri-{day.proxy.log_path.name}"  # the bed's dir goes
        kept.write_text(log)
        raise AssertionError(f"after steps {taken}:\n{err}\nproxy log ({kept}) tail:\n{log[-3000:]}") from err
    finally:
        stop.set()
        if kubelet.is_alive():
            kubelet.join(60)
        day.proxy.stop()
        if server is not None:
            server.stop()
        if not containerd.running:
            containerd.start_daemon()
        empty_node(containerd)
        day.kubelet_file.unlink(missing_ok=True)
