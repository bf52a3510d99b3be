"""A re-bind through the Kubernetes API, against the real containerd (2 CPUs here).

`cri-proxy serve` runs with `[kubernetes] enabled = true` and a kubeconfig pointing at the test API
server (tests/unit/kube_api_server.py: the pods list/watch protocol, from memory). An LSR pod is
created through CRI allocated CPU 1, an LS pod lands on CPU 0; the scheduler re-binds the LSR pod
to CPU 0 in the API: the containers' cgroup cpusets swap, and `ctl plan` says why.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ProxyProcess
from containerd import PrivateContainerd, connect, read_container_cpuset
from kube import start_pod

try:
    from tests.unit.kube_api_server import KubeApiServer
except ImportError:  # run as `pytest tests/e2e/...` without the repository on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.unit.kube_api_server import KubeApiServer

pytestmark = pytest.mark.e2e

QOS = "koordinator.sh/qosClass"
ALLOC = "scheduling.koordinator.sh/resource-status"
NODE = "e2e-node"


@pytest.fixture
def api_server() -> Iterator[KubeApiServer]:
    with KubeApiServer(node=NODE) as server:
        yield server


@pytest.fixture
def follower(
    containerd: PrivateContainerd, api_server: KubeApiServer, tmp_path: Path
) -> Iterator[ProxyProcess]:
    kubeconfig = api_server.kubeconfig(tmp_path / "kubeconfig")
    config = tmp_path / "config.toml"
    config.write_text(f'[kubernetes]\nenabled = true\nnode_name = "{NODE}"\nkubeconfig = "{kubeconfig}"\n')
    # a later --config wins over ProxyProcess's `--config /dev/null`
    process = ProxyProcess(containerd, "--config", str(config), name="follower").start()
    try:
        yield process
    finally:
        code = process.stop()
        assert code == 0, f"cri-proxy exited {code}: {process.log_path.read_text()[-2000:]}"


def _eventually(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def test_a_rebind_in_the_api_moves_the_cgroup_cpusets(
    containerd: PrivateContainerd, api_server: KubeApiServer, follower: ProxyProcess
) -> None:
    uid = str(uuid.uuid4())
    api_server.put_pod("lsr", uid, {QOS: "LSR"}, {ALLOC: json.dumps({"cpuset": "1"})})
    _eventually(lambda: api_server.open_watches == 1, "the proxy lists and watches the API")
    lists = api_server.list_requests()
    assert lists[0].params["fieldSelector"] == f"spec.nodeName={NODE}"

    with connect(follower.address) as cri:
        logs = containerd.pod_log_dir
        _, ls, ls_pod = start_pod(cri.api, cri.runtime, "ls", "burstable", log_root=logs)
        lsr_alloc = {ALLOC: json.dumps({"cpuset": "1"})}
        _, lsr, lsr_pod = start_pod(
            cri.api, cri.runtime, "lsr", "guaranteed", {QOS: "LSR"}, lsr_alloc, uid=uid, log_root=logs
        )

        def cpus() -> tuple[str, str]:
            return (
                read_container_cpuset(lsr_pod.linux.cgroup_parent, lsr),
                read_container_cpuset(ls_pod.linux.cgroup_parent, ls),
            )

        assert cpus() == ("1", "0")

        api_server.annotate(uid, {ALLOC: json.dumps({"cpuset": "0"})})  # the scheduler re-binds
        _eventually(lambda: cpus() == ("0", "1"), "the LSR container on CPU 0, the LS one on 1")

    plan = follower.ctl_json("plan")
    assert plan["containers"][lsr]["cpuset_cpus"] == "0"
    assert plan["containers"][lsr]["why"].endswith("(allocation from the Kubernetes API)")
    assert "api-unreachable" not in {p["kind"] for p in plan["problems"]}
