"""The demo behind scripts/demo: a pod and a container run through cri-proxy, step by step."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT))

from cri_proxy.client import CriClient  # noqa: E402
from cri_proxy.endpoints import socket_answers  # noqa: E402
from tests.processes import CLI, serve_command  # noqa: E402


def step(text: str) -> None:
    print(f"==> {text}", flush=True)


def wait_for(path: Path, proc: subprocess.Popen[bytes], what: str) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise SystemExit(f"demo: {what} exited with {proc.returncode}")
        if path.exists() and socket_answers(path):
            return
        time.sleep(0.05)
    raise SystemExit(f"demo: {what} did not start")


def containerd_usable() -> bool:
    return os.geteuid() == 0 and shutil.which("containerd") is not None and shutil.which("runc") is not None


def run_pod(client: CriClient, on_containerd: bool, log_root: Path) -> None:
    from kube import container_config, pod_sandbox_config

    pb, rt = client.pb, client.runtime
    v = rt.Version(pb.VersionRequest(version="v1"))
    step(f"Version through the proxy: {v.runtime_name} {v.runtime_version} (CRI {v.runtime_api_version})")
    pod = pod_sandbox_config(
        pb,
        "demo-web",
        qos="burstable",
        labels={"app": "demo", "koordinator.sh/qosClass": "LS"},
        log_root=log_root,
    )
    pod_id = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod), timeout=60).pod_sandbox_id
    step(f"RunPodSandbox: {pod_id[:13]} (cgroup parent {pod.linux.cgroup_parent})")
    config = container_config(pb, pod, "web")
    cid = rt.CreateContainer(
        pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod), timeout=60
    ).container_id
    rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
    step(f"CreateContainer + StartContainer: {cid[:13]}")
    status = rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid), timeout=10).status
    state, cpuset = pb.ContainerState.Name(status.state), status.resources.linux.cpuset_cpus
    step(f"ContainerStatus: {state}, cpuset {cpuset!r}")
    if on_containerd:
        out = rt.ExecSync(
            pb.ExecSyncRequest(container_id=cid, cmd=["cat", "/proc/self/status"], timeout=10), timeout=15
        )
        allowed = [ln for ln in out.stdout.decode().splitlines() if ln.startswith("Cpus_allowed_list")]
        step(f"ExecSync inside the container: {allowed[0] if allowed else out.stdout[:60]!r}")
    rt.UpdateContainerResources(
        pb.UpdateContainerResourcesRequest(
            container_id=cid, linux=pb.LinuxContainerResources(cpuset_cpus="0")
        ),
        timeout=30,
    )
    if on_containerd:
        from containerd import read_container_cpuset

        in_cgroup = read_container_cpuset(pod.linux.cgroup_parent, cid)
        step(
            f"UpdateContainerResources asking for cpuset 0: LS keeps its decision, cgroup says {in_cgroup!r}"
        )
    else:
        now = rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid), timeout=10).status
        kept = now.resources.linux.cpuset_cpus
        step(f"UpdateContainerResources asking for cpuset 0: LS keeps its decision, runtime has {kept!r}")
    listed = rt.ListContainers(pb.ListContainersRequest(), timeout=10).containers
    step(
        "ListContainers: "
        + json.dumps(
            [
                {"id": c.id[:13], "name": c.metadata.name, "state": pb.ContainerState.Name(c.state)}
                for c in listed
            ]
        )
    )
    rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=5), timeout=60)
    rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=60)
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    step("StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox: done")


def show_cpusets(proxy_endpoint: str, title: str) -> None:
    step(title)
    out = subprocess.run(
        [CLI, "ctl", "-r", proxy_endpoint, "cpusets"], capture_output=True, text=True, check=True
    )
    print("\n".join("    " + line for line in out.stdout.splitlines()), flush=True)


def cpuset_scenario(client: CriClient, proxy_endpoint: str, log_root: Path) -> None:
    """BE and LS pods share the node; an LSR pod takes the last CPU; it goes away again."""
    from kube import start_pod

    from cri_proxy.cpu import CPUSet
    from cri_proxy.sysfs import read_topology

    pb, rt = client.pb, client.runtime
    last_cpu = max(read_topology().online)

    def start(name: str, qos: str, labels: dict[str, str], annotations: dict[str, str]) -> str:
        return start_pod(pb, rt, name, qos, labels, annotations, log_root=log_root, timeout=60)[0]  # type: ignore[arg-type]

    pods = [
        start("batch", "besteffort", {"koordinator.sh/qosClass": "BE"}, {}),
        start("web", "burstable", {"koordinator.sh/qosClass": "LS"}, {}),
    ]
    show_cpusets(proxy_endpoint, "a BE pod and an LS pod: both on the share pools")
    allocation = json.dumps({"cpuset": str(CPUSet.of([last_cpu]))})
    lsr = start(
        "latency-critical",
        "guaranteed",
        {"koordinator.sh/qosClass": "LSR"},
        {"scheduling.koordinator.sh/resource-status": allocation},
    )
    show_cpusets(
        proxy_endpoint, f"an LSR pod allocated CPU {last_cpu} arrives: LS moves off it (BE may share it)"
    )
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=lsr), timeout=60)
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=lsr), timeout=60)
    time.sleep(0.5)  # the reconciler widens the pools once the pod is gone
    show_cpusets(proxy_endpoint, "the LSR pod is gone: the LS pool is whole again")
    for pod_id in pods:
        rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
        rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description="Run a pod through cri-proxy and show what happens.")
    parser.add_argument("--runtime", choices=("auto", "containerd", "fake"), default="auto")
    args = parser.parse_args()
    use_containerd = args.runtime == "containerd" or (args.runtime == "auto" and containerd_usable())
    work = Path(tempfile.mkdtemp(prefix="cri-proxy-demo-"))
    procs: list[subprocess.Popen[bytes]] = []
    containerd: Any = None
    try:
        if use_containerd:
            from containerd import PrivateContainerd

            step("starting a private containerd (Debian's containerd + runc, its own dirs and socket)")
            containerd = PrivateContainerd().start()
            runtime_endpoint, log_root = containerd.address, containerd.pod_log_dir
        else:
            step("starting the bundled fake runtime (no containerd here)")
            sock = work / "fake-runtime.sock"
            procs.append(
                subprocess.Popen(
                    [CLI, "fake-runtime", "--listen", f"unix://{sock}", "--log-level", "WARNING"]
                )
            )
            wait_for(sock, procs[-1], "the fake runtime")
            runtime_endpoint, log_root = f"unix://{sock}", work / "pod-logs"
        proxy_sock = work / "cri-proxy.sock"
        step(f"starting cri-proxy serve --listen unix://{proxy_sock} --runtime-endpoint {runtime_endpoint}")
        procs.append(subprocess.Popen(serve_command(work, runtime_endpoint, listen=proxy_sock)))
        wait_for(proxy_sock, procs[-1], "cri-proxy")
        with CriClient(f"unix://{proxy_sock}") as client:
            run_pod(client, use_containerd, log_root)
            cpuset_scenario(client, f"unix://{proxy_sock}", log_root)
        step("done: every call above went through cri-proxy")
        return 0
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        if containerd is not None:
            containerd.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
