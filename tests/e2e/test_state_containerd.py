"""State that never loses a container, against the real containerd (2 CPUs: an LSR pod on CPU 1
puts every LS container on CPU 0).

Each test breaks something — the proxy SIGKILLed mid-create, containerd restarted mid-create,
starts racing updates, containers created or exiting behind the proxy's back, a pod whose
annotation is not UTF-8 — then waits (with a deadline) until the proxy knows exactly the
containers containerd has, nothing pending, and every running container's real `cpuset.cpus`
(its cgroup file) is what the rules decide.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import ProxyProcess
from containerd import CriClient, PrivateContainerd, connect, container_cgroup_file, read_container_cpuset
from converge import mismatch, wait_for
from kube import create, linux_resources, pod_sandbox_config, start_pod

from cri_api.v1 import api_pb2 as v1
from cri_proxy.enforce import lenient

pytestmark = pytest.mark.e2e

QOS = "koordinator.sh/qosClass"
ALLOC = "scheduling.koordinator.sh/resource-status"
PERIOD = 1.0  # reconcile_period_seconds of these proxies


@pytest.fixture
def proxy(request: pytest.FixtureRequest, containerd: PrivateContainerd) -> Iterator[ProxyProcess]:
    """An enforcing proxy with a short reconcile period and a state dir of its own per test."""
    config = containerd.workdir / "state-proxy.toml"
    config.write_text(f"reconcile_period_seconds = {PERIOD}\nexclusive_wait_seconds = 2.0\n")
    name = "state-" + hashlib.sha1(request.node.name.encode()).hexdigest()[:8]
    process = ProxyProcess(containerd, "--config", str(config), name=name).start()
    try:
        yield process
    finally:
        process.stop()


def pinned_story(proxy: ProxyProcess, cid: str) -> str:
    """What the proxy says of a container that should be pinned: its row and its log lines."""
    rows = [row for row in proxy.ctl_json("cpusets", "-o", "json") if row["id"] == cid]
    lines = [line for line in proxy.log_path.read_text().splitlines() if cid[:13] in line]
    return f"proxy row {rows}; log lines naming it: {lines[-15:]}"


def lsr_pod(cri: CriClient, containerd: PrivateContainerd, name: str = "lsr") -> tuple[str, str, Any]:
    return start_pod(
        cri.api,
        cri.runtime,
        name,
        "guaranteed",
        {QOS: "LSR"},
        {ALLOC: json.dumps({"cpuset": "1"})},
        log_root=containerd.pod_log_dir,
    )


def ls_pod(cri: CriClient, containerd: PrivateContainerd, name: str = "ls") -> tuple[str, Any]:
    config = pod_sandbox_config(v1, name, qos="burstable", log_root=containerd.pod_log_dir)
    return cri.runtime.RunPodSandbox(
        v1.RunPodSandboxRequest(config=config), timeout=30
    ).pod_sandbox_id, config


@contextlib.contextmanager
def creating(proxy: ProxyProcess, pod: tuple[str, Any], prefix: str) -> Iterator[list[str]]:
    """A kubelet-like client creating containers in `pod` through the proxy, one after another,
    retrying while the runtime or the proxy is away; yields the ids made so far."""
    stop = threading.Event()
    made: list[str] = []

    def keep_creating() -> None:
        n = 0
        while not stop.is_set():
            with connect(proxy.address) as cri:  # a new connection after a proxy restart
                while not stop.is_set():
                    n += 1
                    try:
                        made.append(create(cri, pod, f"{prefix}{n}"))
                    except grpc.RpcError:
                        time.sleep(0.05)  # the runtime or the proxy is away: kubelet retries too
                        break

    worker = threading.Thread(target=keep_creating)
    worker.start()
    try:
        yield made
    finally:
        stop.set()
        worker.join(60)


def test_containers_created_or_exiting_behind_the_proxys_back(
    containerd: PrivateContainerd, proxy: ProxyProcess
) -> None:
    with connect(proxy.address) as cri:
        lsr_pod(cri, containerd)
        ls = ls_pod(cri, containerd)
        web = create(cri, ls, "web")
        brief = create(cri, ls, "brief", command=("sleep", "1"))  # exits on its own
    with connect(containerd.address) as direct:
        sneaky = create(direct, ls, "sneaky")  # not through the proxy: no cpuset, on 0-1
        assert read_container_cpuset(ls[1].linux.cgroup_parent, sneaky) == "0-1"

    def settled() -> str | None:
        rows = {row["id"]: row for row in proxy.ctl_json("cpusets", "-o", "json")}
        if rows.get(brief, {}).get("state") != "exited":
            return f"brief is {rows.get(brief, {}).get('state')}, not exited yet"
        if rows.get(sneaky, {}).get("decided") is None:  # untracked until a periodic pass adopts it
            return f"sneaky is {rows.get(sneaky, {}).get('mark')}, not adopted yet"
        return mismatch(proxy, containerd)

    wait_for(settled)
    rows = {row["id"]: row for row in proxy.ctl_json("cpusets", "-o", "json")}
    assert (rows[sneaky]["state"], rows[sneaky]["decided"]) == ("running", "0")  # adopted, moved
    assert rows[brief]["state"] == "exited"
    assert read_container_cpuset(ls[1].linux.cgroup_parent, web) == "0"


def test_a_resize_of_a_container_learned_from_containerd_lands_as_it_does_directly(
    containerd: PrivateContainerd, proxy: ProxyProcess
) -> None:
    """A resize (every resource, a new memory limit, no swap limit: a kubelet's in-place resize
    that leaves the swap limit to the runtime; `crictl update --memory` alike) of a container
    the proxy learned from containerd (adopted here; after a restart alike): containerd's
    ContainerStatus reports the swap limit containerd set itself (the memory limit, 64 MiB),
    which the new limit must not be sent with. Through the proxy as directly, on a twin
    container: the same memory and swap limits, also once the proxy has repaired the container's
    cpuset with every resource it knows."""
    with connect(containerd.address) as direct:
        config = pod_sandbox_config(v1, "resized", qos="guaranteed", log_root=containerd.pod_log_dir)
        run = direct.runtime.RunPodSandbox(v1.RunPodSandboxRequest(config=config), timeout=30)
        pod = (run.pod_sandbox_id, config)
        mine, twin = create(direct, pod, "mine"), create(direct, pod, "twin")  # 64 MiB each

    def adopted() -> str | None:
        rows = {row["id"]: row for row in proxy.ctl_json("cpusets", "-o", "json")}
        return None if rows.get(mine, {}).get("decided") is not None else "not adopted yet"

    wait_for(adopted)
    resize = v1.UpdateContainerResourcesRequest(
        linux=linux_resources(v1, "guaranteed", memory_limit=96 << 20)
    )
    resize.container_id = mine
    with connect(proxy.address) as through:
        through.runtime.UpdateContainerResources(resize, timeout=30)  # before: EINVAL from runc
    resize.container_id = twin
    with connect(containerd.address) as direct:
        direct.runtime.UpdateContainerResources(resize, timeout=30)

    def limits(cid: str) -> dict[str, str]:
        names = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")  # memsw: with swap accounting
        files = {
            name: container_cgroup_file(config.linux.cgroup_parent, cid, name, "memory") for name in names
        }
        return {name: path.read_text().strip() for name, path in files.items() if path.exists()}

    assert limits(mine) == limits(twin) and limits(mine)["memory.limit_in_bytes"] == str(96 << 20)
    container_cgroup_file(config.linux.cgroup_parent, mine, "cpuset.cpus").write_text("0")  # by hand
    wait_for(
        lambda: None if read_container_cpuset(config.linux.cgroup_parent, mine) == "0-1" else "not repaired"
    )
    wait_for(lambda: mismatch(proxy, containerd))
    assert limits(mine) == limits(twin)  # the repair sent the resize's limits, not the ones it learned


def direct_update(containerd: PrivateContainerd, cid: str, memory: int) -> None:
    """What `crictl update --memory` sends, on containerd's own socket: behind the proxy's back."""
    with connect(containerd.address) as direct:
        linux = v1.LinuxContainerResources(memory_limit_in_bytes=memory)
        request = v1.UpdateContainerResourcesRequest(container_id=cid, linux=linux)
        direct.runtime.UpdateContainerResources(request, timeout=30)


def test_a_limit_changed_at_containerd_directly_is_not_undone_by_the_proxy(
    containerd: PrivateContainerd, proxy: ProxyProcess
) -> None:
    """An operator's `crictl update --memory` on containerd's own socket, behind the proxy's back:
    the next update of that container the proxy sends (the kubelet's cpuset-only update, merged;
    the repair of its cpuset, written by hand) carries every resource, and must carry the limit
    containerd holds now, not put back the one the proxy knew."""
    with connect(proxy.address) as through:
        config = pod_sandbox_config(v1, "changed", qos="guaranteed", log_root=containerd.pod_log_dir)
        run = through.runtime.RunPodSandbox(v1.RunPodSandboxRequest(config=config), timeout=30)
        cid = create(through, (run.pod_sandbox_id, config), "app")  # 64 MiB
    parent = config.linux.cgroup_parent
    memory = container_cgroup_file(parent, cid, "memory.limit_in_bytes", "memory")
    direct_update(containerd, cid, 48 << 20)
    assert memory.read_text().strip() == str(48 << 20)
    with connect(proxy.address) as through:  # the kubelet's CPU manager: the cpuset alone
        linux = v1.LinuxContainerResources(cpuset_cpus="0-1")
        request = v1.UpdateContainerResourcesRequest(container_id=cid, linux=linux)
        through.runtime.UpdateContainerResources(request, timeout=30)
    assert memory.read_text().strip() == str(48 << 20)  # before: 64 MiB, the create's, put back
    direct_update(containerd, cid, 40 << 20)
    container_cgroup_file(parent, cid, "cpuset.cpus").write_text("0")  # by hand: the proxy repairs it
    wait_for(lambda: None if read_container_cpuset(parent, cid) == "0-1" else "not repaired")
    assert memory.read_text().strip() == str(40 << 20)  # before: 48 MiB, the proxy's copy, put back
    said = "changed at the runtime directly"
    kept = [line for line in proxy.log_path.read_text().splitlines() if said in line]
    assert len(kept) == 2, kept
    assert f"memory_limit_in_bytes {64 << 20} -> {48 << 20}" in kept[0], kept
    assert f"memory_limit_in_bytes {48 << 20} -> {40 << 20}" in kept[1], kept


def test_proxy_sigkilled_while_creates_are_in_flight(
    containerd: PrivateContainerd, proxy: ProxyProcess
) -> None:
    """A checkpoint with PENDING records: the one the runtime made is adopted, the other dropped."""
    checkpoint = Path(proxy.args[proxy.args.index("--state-dir") + 1]) / "checkpoint.json"
    with connect(proxy.address) as cri:
        lsr_pod(cri, containerd)
        ls = ls_pod(cri, containerd)
        create(cri, ls, "web")
    assert containerd.pid is not None
    errors: list[grpc.RpcError] = []
    with contextlib.ExitStack() as stack:
        # connected and ready first: a client waits for the runtime's SETTINGS (relayed as they are)
        # before its first call, through the proxy as directly, and a stopped containerd sends none
        clients = {name: stack.enter_context(connect(proxy.address)) for name in ("made", "never")}
        for cri in clients.values():
            cri.runtime.Version(v1.VersionRequest(), timeout=10)

        def create_through_proxy(name: str) -> None:
            try:
                create(clients[name], ls, name, start=False)
            except grpc.RpcError as exc:
                errors.append(exc)

        os.kill(containerd.pid, signal.SIGSTOP)  # the creates hang in containerd
        try:
            calls = [threading.Thread(target=create_through_proxy, args=(n,)) for n in ("made", "never")]
            for call in calls:
                call.start()
            wait_for(
                lambda: (
                    None
                    if checkpoint.exists() and checkpoint.read_text().count('"pending"') == 2
                    else "no pending checkpointed"
                )
            )
            proxy.kill()
        finally:
            os.kill(containerd.pid, signal.SIGCONT)
        for call in calls:
            call.join(30)
    assert len(errors) == 2  # kubelet never heard back
    with connect(containerd.address) as direct:  # whatever containerd did with them: one made, one not
        found: dict[str, str] = {}

        def made_settled() -> str | None:
            listed = direct.runtime.ListContainers(v1.ListContainersRequest(), timeout=10).containers
            found.update({c.metadata.name: c.id for c in listed})
            if "made" not in found:
                try:
                    found["made"] = create(direct, ls, "made", start=False)
                except grpc.RpcError as exc:
                    return f"containerd still creating it: {exc.details()}"  # name reserved
            return None

        def never_settled() -> str | None:
            listed = direct.runtime.ListContainers(v1.ListContainersRequest(), timeout=10).containers
            found.update({c.metadata.name: c.id for c in listed})
            if "never" not in found:  # taking its name ourselves is the only way to know it is free
                try:
                    found["never"] = create(direct, ls, "never", start=False)
                except grpc.RpcError as exc:
                    return f"containerd still creating it: {exc.details()}"
            return None

        wait_for(made_settled)
        wait_for(never_settled)
        made = found["made"]
        direct.runtime.RemoveContainer(v1.RemoveContainerRequest(container_id=found["never"]), timeout=30)
    saved = json.loads(checkpoint.read_text())
    assert sorted(c["name"] for c in saved["containers"] if c["state"] == "pending") == ["made", "never"]

    proxy.start()
    wait_for(lambda: mismatch(proxy, containerd))
    rows = {row["id"]: row for row in proxy.ctl_json("cpusets", "-o", "json")}
    assert rows[made]["container"] == "made" and "never" not in {r["container"] for r in rows.values()}
    assert rows[made]["state"] == "created" and rows[made]["decided"] == "0"


def test_containerd_restarted_while_containers_are_created(
    containerd: PrivateContainerd, proxy: ProxyProcess
) -> None:
    with connect(proxy.address) as cri:
        _, lsr, lsr_config = lsr_pod(cri, containerd)
        ls = ls_pod(cri, containerd)
    with creating(proxy, ls, "c") as made:
        wait_for(lambda: None if len(made) >= 2 else "no container made yet")
        containerd.restart()
        count = len(made)
        wait_for(lambda: None if len(made) >= count + 3 else "no container made after the restart")
    wait_for(lambda: mismatch(proxy, containerd))

    # kubelet's static CPU manager re-sends its own cpuset: the LSR container stays pinned, LS too
    with connect(proxy.address) as cri:
        for cid in (lsr, made[-1]):
            cri.runtime.UpdateContainerResources(
                v1.UpdateContainerResourcesRequest(
                    container_id=cid, linux=v1.LinuxContainerResources(cpuset_cpus="0-1")
                ),
                timeout=30,
            )
    assert read_container_cpuset(lsr_config.linux.cgroup_parent, lsr) == "1", pinned_story(proxy, lsr)
    assert read_container_cpuset(ls[1].linux.cgroup_parent, made[-1]) == "0"
    wait_for(lambda: mismatch(proxy, containerd))


def test_starts_racing_updates_end_on_the_decided_cpus(
    containerd: PrivateContainerd, proxy: ProxyProcess
) -> None:
    """containerd 1.6 answers OK to an update landing around a start but keeps the old cgroup set."""
    with connect(proxy.address) as cri:
        ls = ls_pod(cri, containerd)
        waiting = [create(cri, ls, f"w{i}", start=False) for i in range(6)]

    def start_all() -> None:
        with connect(proxy.address) as cri:
            for cid in waiting:
                cri.runtime.StartContainer(v1.StartContainerRequest(container_id=cid), timeout=30)

    starter = threading.Thread(target=start_all)
    with connect(proxy.address) as cri:
        starter.start()  # the LSR pod's arrival sends every LS container an update meanwhile
        lsr_pod(cri, containerd)
    starter.join(60)
    wait_for(lambda: mismatch(proxy, containerd))
    assert {read_container_cpuset(ls[1].linux.cgroup_parent, cid) for cid in waiting} == {"0"}


def _raw(address: str, method: str, request: bytes) -> bytes:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(f"/runtime.v1.RuntimeService/{method}", None, None)
        reply: bytes = call(request, timeout=30)
        return reply


def test_an_annotation_that_is_not_utf8_does_not_stop_recovery(
    containerd: PrivateContainerd, proxy: ProxyProcess
) -> None:
    config = pod_sandbox_config(v1, "odd", qos="burstable", log_root=containerd.pod_log_dir)
    request = lenient.parse(
        "RunPodSandboxRequest", v1.RunPodSandboxRequest(config=config).SerializeToString()
    )
    entry = request.config.annotations.add()
    entry.key, entry.value = b"example.com/note", b"caf\xe9 \xff"  # Latin-1, as a careless client sends
    odd = lenient.text(
        lenient.parse(
            "RunPodSandboxResponse", _raw(containerd.address, "RunPodSandbox", request.SerializeToString())
        ).pod_sandbox_id
    )
    try:
        with connect(proxy.address) as cri:
            ls = ls_pod(cri, containerd)
            web = create(cri, ls, "web")
        proxy.kill()
        proxy.start()

        def recovered() -> str | None:
            problems = proxy.ctl_json("plan")["problems"]
            if not any(p["kind"] == "bad-text" and p["pod"] == "default/odd" for p in problems):
                return f"no bad-text problem for default/odd in {problems}"
            return None

        wait_for(recovered)
        with connect(proxy.address) as cri:  # and it goes on serving and deciding
            second = create(cri, ls, "second")
        rows = {row["id"]: row for row in proxy.ctl_json("cpusets", "-o", "json")}
        assert {web, second} <= rows.keys()
        assert read_container_cpuset(ls[1].linux.cgroup_parent, second) == "0-1"
    finally:  # the session's clean-up lists strictly: this pod must go first
        for method, message in (
            ("StopPodSandbox", v1.StopPodSandboxRequest(pod_sandbox_id=odd)),
            ("RemovePodSandbox", v1.RemovePodSandboxRequest(pod_sandbox_id=odd)),
        ):
            _raw(containerd.address, method, message.SerializeToString())


def test_a_container_left_on_exclusive_cpus_is_named(
    containerd: PrivateContainerd, proxy: ProxyProcess
) -> None:
    """A container the rules do not manage (its cgroup parent is no pod QoS tier) stays on every CPU
    when an LSR pod takes CPU 1: never a silent overlap."""
    config = pod_sandbox_config(v1, "outsider", qos="burstable", log_root=containerd.pod_log_dir)
    config.linux.cgroup_parent = f"/kubepods/unmanaged/pod{config.metadata.uid}"
    with connect(containerd.address) as direct:
        sandbox = direct.runtime.RunPodSandbox(
            v1.RunPodSandboxRequest(config=config), timeout=30
        ).pod_sandbox_id
        outsider = create(direct, (sandbox, config), "app")
    with connect(proxy.address) as cri:
        lsr_pod(cri, containerd)

    def named() -> str | None:
        problems = [p for p in proxy.ctl_json("plan")["problems"] if p["kind"] == "exclusive-overlap"]
        if not any(
            p["pod"] == "default/lsr" and "default/outsider app (on 1)" in p["message"] for p in problems
        ):
            return f"no exclusive-overlap naming default/outsider app: {problems}"
        return None

    wait_for(named)
    assert read_container_cpuset(config.linux.cgroup_parent, outsider) == "0-1"  # really still there
    assert "exclusivity not held" in proxy.log_path.read_text()


def test_kills_and_restarts_in_sequence_while_containers_are_created(
    containerd: PrivateContainerd, proxy: ProxyProcess
) -> None:
    with connect(proxy.address) as cri:
        _, lsr, lsr_config = lsr_pod(cri, containerd)
        ls = ls_pod(cri, containerd)

    def more(than: int) -> Callable[[], str | None]:
        return lambda: None if len(made) > than else f"no container made beyond {than}"

    with creating(proxy, ls, "k") as made:
        for kill_first in (True, False, True):
            wait_for(more(len(made) + 1))
            if kill_first:
                proxy.kill()
                containerd.restart()
            else:
                containerd.restart()
                proxy.kill()
            proxy.start()
        wait_for(more(len(made) + 1))
    wait_for(lambda: mismatch(proxy, containerd))
    with connect(proxy.address) as cri:  # kubelet-style cpuset-only update: still pinned
        cri.runtime.UpdateContainerResources(
            v1.UpdateContainerResourcesRequest(
                container_id=lsr, linux=v1.LinuxContainerResources(cpuset_cpus="0-1")
            ),
            timeout=30,
        )
    assert read_container_cpuset(lsr_config.linux.cgroup_parent, lsr) == "1", pinned_story(proxy, lsr)
    wait_for(lambda: mismatch(proxy, containerd))
