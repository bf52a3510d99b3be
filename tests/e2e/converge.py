"""What the proxy, containerd and the cgroups must agree on once a node has settled, and waiting
for it with a deadline: the oracle of the end-to-end state tests."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import ProxyProcess
from containerd import PrivateContainerd, connect, read_container_cpuset

from cri_api.v1 import api_pb2 as v1

CONVERGE = 45.0  # deadline: two reconcile periods, plus the pending grace (20 s) for a call whose
# answer was lost with the runtime connection, on a machine shared by many tests
STATES = {
    v1.CONTAINER_CREATED: "created",
    v1.CONTAINER_RUNNING: "running",
    v1.CONTAINER_EXITED: "exited",
    v1.CONTAINER_UNKNOWN: "unknown",
}


def wait_for(check: Callable[[], str | None], within: float = CONVERGE) -> None:
    """Until `check` says nothing is wrong (None); fails with its last word at the deadline."""
    deadline = time.monotonic() + within
    while True:
        wrong = check()
        if wrong is None:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"not within {within} s: {wrong}")
        time.sleep(0.1)


def mismatch(proxy: ProxyProcess, containerd: PrivateContainerd) -> str | None:
    """What differs between the proxy's state, containerd's containers and their cgroups; None: nothing."""
    rows = {row["id"]: row for row in proxy.ctl_json("cpusets", "-o", "json")}
    with connect(containerd.address) as cri:
        listed = cri.runtime.ListContainers(v1.ListContainersRequest(), timeout=10).containers
        runtime = {c.id: STATES[c.state] for c in listed}
        pods = cri.runtime.ListPodSandbox(v1.ListPodSandboxRequest(), timeout=10).items
        ready = {p.id for p in pods if p.state == v1.SANDBOX_READY}
    pending = [row["container"] for row in rows.values() if row["state"] == "pending"]
    if pending:
        return f"pending: {pending}"
    # the view lists what the runtime has even when the proxy does not track it: marked, not hidden
    untracked = [
        (row["container"], row["mark"]) for row in rows.values() if row["mark"] in ("UNTRACKED", "GONE")
    ]
    if untracked:
        return f"not tracked as the runtime has them: {untracked}"
    known = {cid: row["state"] for cid, row in rows.items()}
    if known != runtime:
        differ = sorted(
            (cid[:13], known[cid], runtime[cid])
            for cid in known.keys() & runtime.keys()
            if known[cid] != runtime[cid]
        )
        return (
            f"states differ (proxy, containerd): {differ}; "
            f"proxy {sorted(known.items())} vs containerd {sorted(runtime.items())}: "
            f"unknown to the proxy {sorted(runtime.keys() - known.keys())}, "
            f"gone from containerd {sorted(known.keys() - runtime.keys())}"
        )
    snapshot = proxy.ctl_json("snapshot")  # what the proxy itself holds live (the views show the runtime's)
    parents = {c["id"]: p["cgroup_parent"] for p in snapshot["pods"] for c in p["containers"]}
    # the rules' containers: those created or running in a ready pod (a stopped pod's created
    # containers stay created in containerd)
    live = {c.id for c in listed if c.pod_sandbox_id in ready and runtime[c.id] in ("created", "running")}
    if parents.keys() != live:
        return (
            f"the proxy holds live {sorted(parents.keys() - live)} that containerd does not, "
            f"and not {sorted(live - parents.keys())} that it does"
        )
    for cid, row in rows.items():
        if row["state"] != "running" or row["decided"] is None or cid not in parents:
            continue
        try:
            real = read_container_cpuset(parents[cid], cid)
        except FileNotFoundError:  # it exited after the listing: the next look sees it exited
            return f"{row['pod']} {row['container']}: its cgroup went away after the listing"
        if real != row["decided"]:
            return f"{row['pod']} {row['container']}: cgroup has {real}, decided {row['decided']}"
    # the live decisions (kept up by each change, reusing what did not change) must be what
    # `cri-proxy plan` decides afresh from the same inputs
    fresh = replay(proxy, snapshot)["containers"]
    for cid in parents:
        row, again = rows[cid], fresh[cid]
        if (row["qos"], row["decided"]) != (again["qos"], again["cpuset_cpus"]):
            return (
                f"{row['pod']} {row['container']}: the proxy decided {row['qos']} {row['decided']}, "
                f"`plan` on its snapshot {again['qos']} {again['cpuset_cpus']} ({again['why']})"
            )
    return None


def replay(proxy: ProxyProcess, snapshot: Any) -> Any:
    """`cri-proxy plan --snapshot -` on `snapshot`, which must succeed; its decisions as JSON."""
    argv = [proxy.args[0], "plan", "--snapshot", "-"]
    done = subprocess.run(
        argv, input=json.dumps(snapshot), capture_output=True, text=True, timeout=30, check=True
    )
    return json.loads(done.stdout)
