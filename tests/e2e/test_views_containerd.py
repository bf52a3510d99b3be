"""The proxy's views and honest updates against the real containerd (2 CPUs here).

A cpuset changed behind the proxy's back (straight to containerd) is marked DRIFT in `ctl cpusets`
and moves the container in `ctl cpus`; `ctl update --cpuset-cpus` on a managed container is refused
with its class and the rules' cpuset (the cgroup keeps its set), a CPU that is not online is
refused, `--force` pins the set (the cgroup gets it and keeps it), and a raw CRI update through the
proxy is replaced and counted. An operator's pin survives a proxy restart (checkpointed) until
`ctl update --unpin` removes it.

The views tell the cgroup's truth: a container's `cpuset.cpus` written straight into its cgroup
(behind the runtime's back too) is DRIFT with the cgroup's set until the periodic pass repairs it
(logged with pod and container); a container that exits on its own shows `exited`; one created at
containerd behind the proxy is UNTRACKED until a periodic pass adopts it; in dry-run a drift is
DRY-RUN, left as it is, and status and /healthz say dry-run.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ProxyProcess
from containerd import CriClient, PrivateContainerd, connect, container_cgroup_file, read_container_cpuset
from kube import container_config, pod_sandbox_config, start_pod

pytestmark = pytest.mark.e2e


def _configured(containerd: PrivateContainerd, name: str, config: str, *extra: str) -> ProxyProcess:
    """A proxy (not started) reading `config` from <workdir>/<name>.toml."""
    path = containerd.workdir / f"{name}.toml"
    path.write_text(config)
    process = ProxyProcess(containerd, *extra, name=name)
    process.args[process.args.index("/dev/null")] = str(path)
    return process


@pytest.fixture
def views_proxy(containerd: PrivateContainerd) -> Iterator[ProxyProcess]:
    """An enforcing proxy whose periodic repair pass does not run during a test."""
    process = _configured(containerd, "views", "reconcile_period_seconds = 3600\n").start()
    try:
        yield process
    finally:
        process.stop()


def _wait(check: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Until `check()` is true, or fail after `timeout` seconds naming `what`."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out ({timeout} s) waiting for {what}")
        time.sleep(0.1)


def _pod(cri: CriClient, containerd: PrivateContainerd, name: str, qos: str) -> tuple[str, Any]:
    _, cid, pod = start_pod(cri.api, cri.runtime, name, qos, log_root=containerd.pod_log_dir)
    return cid, pod


def _ctl(proxy: ProxyProcess, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [proxy.args[0], "ctl", "-r", proxy.address, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def _row(proxy: ProxyProcess, cid: str) -> dict[str, Any]:
    (row,) = [r for r in proxy.ctl_json("cpusets", "-o", "json") if r["id"] == cid]
    return row


def test_a_cpuset_changed_behind_the_proxys_back_is_marked(
    containerd: PrivateContainerd, views_proxy: ProxyProcess
) -> None:
    with connect(views_proxy.address) as cri:
        cid, pod = _pod(cri, containerd, "drift", "burstable")
    assert read_container_cpuset(pod.linux.cgroup_parent, cid) == "0-1"
    row = _row(views_proxy, cid)
    assert (row["decided"], row["actual"], row["mark"]) == ("0-1", "0-1", "")
    with connect(containerd.address) as direct:  # behind the proxy's back
        direct.runtime.UpdateContainerResources(
            direct.api.UpdateContainerResourcesRequest(
                container_id=cid, linux=direct.api.LinuxContainerResources(cpuset_cpus="1")
            ),
            timeout=30,
        )
    assert read_container_cpuset(pod.linux.cgroup_parent, cid) == "1"
    row = _row(views_proxy, cid)
    assert (row["decided"], row["actual"], row["mark"]) == ("0-1", "1", "DRIFT")
    table = _ctl(views_proxy, "cpusets").stdout.splitlines()
    assert table[0].split()[:8] == ["POD", "CONTAINER", "ID", "STATE", "QOS", "DECIDED", "ACTUAL", "MARK"]
    (line,) = [line for line in table if cid[:13] in line]
    assert line.split()[5:8] == ["0-1", "1", "DRIFT"]
    cpus = {r["cpu"]: r for r in views_proxy.ctl_json("cpus", "-o", "json")["cpus"]}
    assert set(cpus) == {0, 1}
    assert "default/drift app" in cpus[1]["containers"] and "default/drift app" not in cpus[0]["containers"]
    problems = views_proxy.ctl_json("problems", "-o", "json")["problems"]
    assert any(p["kind"] == "cpuset-drift" and p["pod"] == "default/drift" for p in problems)
    status = views_proxy.ctl_json("status", "-o", "json")
    assert status["marks"].get("drift") == 1 and status["dry_run"] is False


def test_updates_through_the_proxy_are_honest(
    containerd: PrivateContainerd, views_proxy: ProxyProcess
) -> None:
    with connect(views_proxy.address) as cri:
        cid, pod = _pod(cri, containerd, "upd", "burstable")
        cgroup = lambda: read_container_cpuset(pod.linux.cgroup_parent, cid)  # noqa: E731
        refused = _ctl(views_proxy, "update", "--cpuset-cpus", "0", cid)
        assert refused.returncode == 1, refused
        assert "default/upd app" in refused.stderr and "is LS" in refused.stderr
        assert "rules give it 0-1" in refused.stderr and "--force" in refused.stderr
        assert cgroup() == "0-1"
        offline = _ctl(views_proxy, "update", "--force", "--cpuset-cpus", "7", cid)
        assert offline.returncode == 1 and "CPUs 7 that are not online" in offline.stderr, offline
        # a raw CRI update (crictl, kubelet): the decision replaces the asked cpuset, and it is counted
        cri.runtime.UpdateContainerResources(
            cri.api.UpdateContainerResourcesRequest(
                container_id=cid, linux=cri.api.LinuxContainerResources(cpuset_cpus="0")
            ),
            timeout=30,
        )
        assert cgroup() == "0-1"
        assert views_proxy.ctl_json("status", "-o", "json")["cpuset_updates_replaced"] == 1
        # offline CPUs in a raw CRI update: refused by the proxy, naming them
        with pytest.raises(Exception) as err:
            cri.runtime.UpdateContainerResources(
                cri.api.UpdateContainerResourcesRequest(
                    container_id=cid, linux=cri.api.LinuxContainerResources(cpuset_cpus="7")
                ),
                timeout=30,
            )
        assert "INVALID_ARGUMENT" in str(err.value) and "CPUs 7" in str(err.value)
        forced = _ctl(views_proxy, "update", "--force", "--cpuset-cpus", "0", cid)
        assert forced.returncode == 0 and forced.stdout.strip() == cid, forced
        assert cgroup() == "0"
        row = _row(views_proxy, cid)
        assert (row["decided"], row["actual"], row["mark"]) == ("0", "0", "")
        assert "pinned by an operator" in row["why"]


def test_an_operator_pin_survives_a_proxy_restart_until_unpinned(containerd: PrivateContainerd) -> None:
    proxy = _configured(containerd, "pins", "reconcile_period_seconds = 1\n").start()
    try:
        with connect(proxy.address) as cri:
            cid, pod = _pod(cri, containerd, "pinned", "burstable")
        cgroup = lambda: read_container_cpuset(pod.linux.cgroup_parent, cid)  # noqa: E731
        assert cgroup() == "0-1"
        forced = _ctl(proxy, "update", "--force", "--cpuset-cpus", "1", cid)
        assert forced.returncode == 0 and forced.stdout.strip() == cid, forced
        assert cgroup() == "1"
        assert proxy.stop() == 0
        saved = json.loads(
            (Path(proxy.args[proxy.args.index("--state-dir") + 1]) / "checkpoint.json").read_text()
        )
        assert {c["id"]: c["pin"] for c in saved["containers"]} == {cid: "1"}
        proxy.start()
        # the passes after the restart (recovery's, then a periodic one) read the cgroup and apply the
        # decision: without the pin they would put the rules' 0-1 back
        _wait(lambda: proxy.ctl_json("status", "-o", "json")["reconcile"]["passes"] >= 2, "two passes")
        assert cgroup() == "1"
        row = _row(proxy, cid)
        assert (row["decided"], row["actual"], row["actual_source"], row["mark"], row["pinned"]) == (
            "1",
            "1",
            "cgroup",
            "",
            "1",
        )
        assert "pinned by an operator" in row["why"] and "rules: 0-1" in row["why"]
        assert proxy.ctl_json("status", "-o", "json")["pins"] == 1
        unpinned = _ctl(proxy, "update", "--unpin", cid)
        assert unpinned.returncode == 0 and unpinned.stdout.strip() == cid, unpinned
        _wait(lambda: cgroup() == "0-1", "the rules' cpuset back in the cgroup")
        row = _row(proxy, cid)
        assert (row["decided"], row["pinned"]) == ("0-1", None) and "pinned" not in row["why"]
        again = _ctl(proxy, "update", "--unpin", cid)
        assert again.returncode == 1 and "has no operator pin" in again.stderr, again
        assert proxy.ctl_json("status", "-o", "json")["pins"] == 0
    finally:
        proxy.stop()


def _rows(proxy: ProxyProcess) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in proxy.ctl_json("cpusets", "-o", "json")}


def _write_cgroup_cpuset(pod: Any, cid: str, cpus: str) -> None:
    """Behind everyone's back: the container's cgroup gets another set; containerd does not know."""
    container_cgroup_file(pod.linux.cgroup_parent, cid, "cpuset.cpus").write_text(cpus)
    assert read_container_cpuset(pod.linux.cgroup_parent, cid) == cpus


def _run_container(cri: CriClient, pod_id: str, pod: Any, name: str, command: tuple[str, ...]) -> str:
    api = cri.api
    config = container_config(api, pod, name, command=command)
    cid = cri.runtime.CreateContainer(
        api.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod), timeout=30
    ).container_id
    cri.runtime.StartContainer(api.StartContainerRequest(container_id=cid), timeout=30)
    return str(cid)


def test_the_views_show_the_cgroups_truth_until_the_proxy_repairs_it(containerd: PrivateContainerd) -> None:
    proxy = _configured(containerd, "truth", "reconcile_period_seconds = 3600\n").start()
    try:
        with connect(proxy.address) as cri:
            pod_id, cid, pod = start_pod(
                cri.api, cri.runtime, "truth", "burstable", log_root=containerd.pod_log_dir
            )
            brief_pod = pod_sandbox_config(cri.api, "brief", log_root=containerd.pod_log_dir)
            brief_id = cri.runtime.RunPodSandbox(
                cri.api.RunPodSandboxRequest(config=brief_pod), timeout=30
            ).pod_sandbox_id
            brief = _run_container(cri, brief_id, brief_pod, "once", ("true",))
        assert read_container_cpuset(pod.linux.cgroup_parent, cid) == "0-1"
        _write_cgroup_cpuset(pod, cid, "1")
        row = _rows(proxy)[cid]
        assert (row["decided"], row["actual"], row["actual_source"], row["mark"]) == (
            "0-1",
            "1",
            "cgroup",
            "DRIFT",
        )
        problems = proxy.ctl_json("problems", "-o", "json")["problems"]
        (drift,) = [p for p in problems if p["kind"] == "cpuset-drift"]
        assert drift["pod"] == "default/truth" and "app" in drift["message"], drift
        table = _ctl(proxy, "problems").stdout
        assert "cpuset-drift" in table and "default/truth" in table
        # a container that exits on its own is shown exited (and not as drift)
        _wait(lambda: _rows(proxy)[brief]["state"] == "exited", "the brief container shown exited")
        assert _rows(proxy)[brief]["mark"] == ""
        # a container created at containerd behind the proxy, in a pod it manages: listed, untracked
        with connect(containerd.address) as direct:
            side = _run_container(direct, pod_id, pod, "side", ("sleep", "3600"))
        row = _rows(proxy)[side]
        assert (row["pod"], row["container"], row["mark"], row["decided"]) == (
            "default/truth",
            "side",
            "UNTRACKED",
            None,
        )
        # a short period (reload): the periodic pass adopts `side` and repairs the drift from the cgroup
        (containerd.workdir / "truth.toml").write_text("reconcile_period_seconds = 1\n")
        assert proxy.proc is not None
        proxy.proc.send_signal(signal.SIGHUP)
        _wait(lambda: read_container_cpuset(pod.linux.cgroup_parent, cid) == "0-1", "the drift repaired")
        _wait(lambda: "its cgroup has cpuset '1'" in proxy.log_path.read_text(), "the repair logged")
        lines = proxy.log_path.read_text().splitlines()
        said = next(line for line in lines if "its cgroup has cpuset '1'" in line)
        assert f"default/truth app ({cid[:13]})" in said and "repairing" in said, said
        _wait(lambda: _rows(proxy)[side]["mark"] == "" and _rows(proxy)[cid]["mark"] == "", "no marks left")
        rows = _rows(proxy)
        assert (rows[side]["qos"], rows[side]["decided"], rows[side]["actual"]) == ("LS", "0-1", "0-1")
        assert (rows[cid]["decided"], rows[cid]["actual"]) == ("0-1", "0-1")
        problems = proxy.ctl_json("problems", "-o", "json")["problems"]
        assert not [p for p in problems if p["kind"] == "cpuset-drift"], problems
        assert proxy.ctl_json("status", "-o", "json")["reconcile"]["repaired"] >= 1
    finally:
        proxy.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_in_dry_run_a_drift_is_shown_as_dry_run_and_left(containerd: PrivateContainerd) -> None:
    import urllib.request

    port = _free_port()
    config = f'dry_run = true\nreconcile_period_seconds = 1\nmetrics_address = "127.0.0.1:{port}"\n'
    proxy = _configured(containerd, "dry", config).start()
    try:
        with connect(proxy.address) as cri:
            cid, pod = _pod(cri, containerd, "dry", "burstable")
        _write_cgroup_cpuset(pod, cid, "1")
        row = _rows(proxy)[cid]
        assert (row["decided"], row["actual"], row["mark"], row["dry_run"]) == ("0-1", "1", "DRY-RUN", True)
        table = _ctl(proxy, "cpusets").stdout
        assert "DRY-RUN" in table and "dry-run: the proxy decides and reports, changes nothing" in table
        status = proxy.ctl_json("status", "-o", "json")
        assert status["dry_run"] is True and status["marks"].get("dry-run") == 1, status
        assert "dry_run" in _ctl(proxy, "status").stdout
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as reply:
            assert reply.status == 200 and "dry-run" in reply.read().decode()
        # periodic passes read the drift and change nothing
        _wait(lambda: proxy.ctl_json("status", "-o", "json")["reconcile"]["passes"] >= 2, "two passes")
        assert read_container_cpuset(pod.linux.cgroup_parent, cid) == "1"
        assert _rows(proxy)[cid]["mark"] == "DRY-RUN"
    finally:
        proxy.stop()
