#!/usr/bin/env python3
"""Re-pinning speed: an exclusive pod arrives; how long until N containers are off its CPUs?

The proxy (`cri-proxy serve`, a real process) runs in front of the fake runtime with a realistic
25 ms UpdateContainerResources latency (N = 10, 100, 500) and, as root, in front of a private real
containerd (N = 20). Against it in the same run: a one-at-a-time loop of the same N updates sent
straight to the runtime. Prints both times and the speed-up.

    .venv/bin/python bench/reconcile.py            # fake runtime, and containerd when root
    .venv/bin/python bench/reconcile.py --no-containerd
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT))

from cri_api.v1 import api_pb2 as pb  # noqa: E402
from cri_api.v1 import api_pb2_grpc  # noqa: E402
from cri_proxy.endpoints import socket_answers  # noqa: E402
from tests.unit.enforce_support import fake_sysfs  # noqa: E402

CLI = str(Path(sys.executable).parent / "cri-proxy")
QOS = "koordinator.sh/qosClass"
ALLOC = "scheduling.koordinator.sh/resource-status"


def wait_socket(path: Path, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[1]} exited {proc.returncode}")
        if path.exists() and socket_answers(path):
            return
        time.sleep(0.05)
    raise SystemExit(f"{path} never answered")


def pod_config(name: str, qos: str, labels: dict[str, str], annotations: dict[str, str]) -> Any:
    uid = f"uid-{name}"
    parent = {"guaranteed": f"/kubepods/pod{uid}", "burstable": f"/kubepods/burstable/pod{uid}"}[qos]
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace="bench"),
        labels=labels,
        annotations=annotations,
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=parent,
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.NODE)
            ),
        ),
    )


def container_config(name: str, log: bool) -> Any:
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=name),
        image=pb.ImageSpec(image="localhost/busybox:latest"),
        command=["sleep", "3600"],
        log_path=f"{name}.log" if log else "",
        linux=pb.LinuxContainerConfig(
            resources=pb.LinuxContainerResources(
                cpu_shares=256, cpu_period=100000, memory_limit_in_bytes=64 << 20
            ),
            security_context=pb.LinuxContainerSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.NODE)
            ),
        ),
    )


def run_pods(rt: Any, n: int, start: bool, log_dir: Path | None) -> list[str]:
    ids = []
    for i in range(n):
        cfg = pod_config(f"ls-{i}", "burstable", {}, {})
        if log_dir is not None:
            cfg.log_directory = str(log_dir / f"ls-{i}")
        sandbox = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=60).pod_sandbox_id
        cid = rt.CreateContainer(
            pb.CreateContainerRequest(
                pod_sandbox_id=sandbox,
                config=container_config("main", log_dir is not None),
                sandbox_config=cfg,
            ),
            timeout=60,
        ).container_id
        if start:
            rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
        ids.append(cid)
    return ids


def introspect(channel: grpc.Channel) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(
        channel.unary_unary("/cri_proxy.v1.Introspect/Cpusets")(b"", timeout=30)
    )
    return rows


def measure(
    runtime_ep: str, work: Path, n: int, lsr_cpus: str, sysfs: Path | None, start: bool, log_dir: Path | None
) -> tuple[float, float]:
    proxy_sock = work / f"proxy-{n}.sock"
    args = [
        CLI,
        "serve",
        "--config",
        "/dev/null",
        "--listen",
        f"unix://{proxy_sock}",
        "--runtime-endpoint",
        runtime_ep,
        "--state-dir",
        str(work / f"state-{n}"),
        "--kubelet-state-file",
        str(work / "none"),
        "--log-level",
        "WARNING",
        "--exclusive-wait",
        "60",
    ]
    if sysfs is not None:
        args += ["--sysfs-root", str(sysfs)]
    proxy = subprocess.Popen(args)
    try:
        wait_socket(proxy_sock, proxy)
        channel = grpc.insecure_channel(f"unix://{proxy_sock}")
        rt = api_pb2_grpc.RuntimeServiceStub(channel)
        ids = run_pods(rt, n, start, log_dir)
        # the exclusive pod arrives: time until every LS container is off its CPUs
        cfg = pod_config(f"lsr-{n}", "guaranteed", {QOS: "LSR"}, {ALLOC: json.dumps({"cpuset": lsr_cpus})})
        rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=60)
        t0 = time.perf_counter()  # the pod exists: its post hook has asked for a pass
        while True:
            rows = [r for r in introspect(channel) if r["id"] in set(ids)]
            if rows and all(r["applied"] == r["decided"] for r in rows):
                break
            time.sleep(0.005)
        proxy_time = time.perf_counter() - t0
        target = rows[0]["decided"]
        channel.close()
        # the same N updates, one at a time, straight to the runtime
        direct = grpc.insecure_channel(runtime_ep)
        drt = api_pb2_grpc.RuntimeServiceStub(direct)
        linux = container_config("main", False).linux.resources
        linux.cpuset_cpus = target
        t0 = time.perf_counter()
        for cid in ids:
            drt.UpdateContainerResources(
                pb.UpdateContainerResourcesRequest(container_id=cid, linux=linux), timeout=60
            )
        loop_time = time.perf_counter() - t0
        for item in drt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=60).items:
            drt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=item.id), timeout=60)
            drt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=item.id), timeout=60)
        direct.close()
        return proxy_time, loop_time
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(60)


def report(label: str, n: int, proxy_time: float, loop_time: float) -> None:
    print(
        f"{label:<34} N={n:>4}  proxy re-pin {proxy_time * 1e3:8.1f} ms   one-at-a-time loop "
        f"{loop_time * 1e3:8.1f} ms   speed-up {loop_time / proxy_time:5.1f}x",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--no-containerd", action="store_true")
    parser.add_argument("--sizes", default="10,100,500")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cri-bench-reconcile-"))
    sysfs = fake_sysfs(work / "sys", {0: "0-7", 1: "8-15"})
    fake_sock = work / "fake.sock"
    fake = subprocess.Popen(
        [
            CLI,
            "fake-runtime",
            "--listen",
            f"unix://{fake_sock}",
            "--update-latency-ms",
            "25",
            "--log-level",
            "WARNING",
        ]
    )
    try:
        wait_socket(fake_sock, fake)
        print(
            f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; proxy concurrency 8 (default)",
            flush=True,
        )
        for n in (int(x) for x in args.sizes.split(",")):
            report(
                "fake runtime, 25 ms per update",
                n,
                *measure(f"unix://{fake_sock}", work, n, "2-3", sysfs, True, None),
            )
    finally:
        fake.send_signal(signal.SIGTERM)
        fake.wait(30)
    if args.no_containerd or os.geteuid() != 0:
        return
    from containerd import PrivateContainerd, missing_tools, run_setup_script

    if missing_tools():
        run_setup_script()
    with PrivateContainerd() as containerd:
        report(
            "real containerd (runc, cgroup v1)",
            20,
            *measure(containerd.address, work, 20, "1", None, True, containerd.pod_log_dir),
        )


if __name__ == "__main__":
    main()
