"""containerd stopped and restarted under the proxy: UNAVAILABLE meanwhile, then everything caught up."""

from __future__ import annotations

import json
import threading
import time

import grpc
import pytest
from conftest import ProxyProcess
from containerd import PrivateContainerd, connect, read_container_cpuset
from kube import start_pod

pytestmark = pytest.mark.e2e


def _wait(predicate: object, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():  # type: ignore[operator]
                return
        except (grpc.RpcError, FileNotFoundError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_containerd_restart_under_the_proxy(containerd: PrivateContainerd, enforcer: ProxyProcess) -> None:
    with connect(enforcer.address) as cri:
        api, rt = cri.api, cri.runtime
        placed = {}
        for name, qos in (("be", "besteffort"), ("ls", "burstable")):
            _, cid, pod = start_pod(api, rt, name, qos, log_root=containerd.pod_log_dir)  # type: ignore[arg-type]
            placed[cid] = pod.linux.cgroup_parent
        assert {read_container_cpuset(parent, cid) for cid, parent in placed.items()} == {"0-1"}

        # a call in flight when containerd goes away fails, it does not hang or crash the proxy
        in_flight: list[object] = []
        cid0 = next(iter(placed))

        def long_exec() -> None:
            try:
                rt.ExecSync(
                    api.ExecSyncRequest(container_id=cid0, cmd=["sleep", "3"], timeout=10), timeout=20
                )
                in_flight.append("ok")
            except grpc.RpcError as exc:
                in_flight.append(exc.code())

        worker = threading.Thread(target=long_exec)
        worker.start()
        time.sleep(0.5)
        containerd.terminate()
        worker.join(25)
        assert in_flight and in_flight[0] != "ok"

        # the proxy closes the link as containerd closed it; a call the channel sends before it
        # sees that close fails with the transport's reset (UNAVAILABLE too, as a direct call
        # would), and the next goes on a new connection, answered by the proxy's own stand-in
        details = []
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as err:
                rt.Version(api.VersionRequest(), timeout=5)
            assert err.value.code() is grpc.StatusCode.UNAVAILABLE
            details.append(err.value.details() or "")
            if containerd.address in details[-1]:
                break
        assert containerd.address in details[-1], details

        # while the runtime is away the kubelet pins CPU 1 for a Guaranteed pod: the decision moves
        # BE and LS to CPU 0, and the updates cannot be sent yet
        state = {"policyName": "static", "defaultCpuSet": "0", "entries": {"uid-elsewhere": {"main": "1"}}}
        (containerd.workdir / "cpu_manager_state").write_text(json.dumps(state))
        time.sleep(1.5)

        containerd.start_daemon()
        _wait(
            lambda: rt.Version(api.VersionRequest(), timeout=5).runtime_name == "containerd",
            what="calls through the proxy to work again without restarting it",
        )
        _wait(
            lambda: {read_container_cpuset(parent, cid) for cid, parent in placed.items()} == {"0"},
            what="the missed decisions to be applied once containerd is back",
        )
