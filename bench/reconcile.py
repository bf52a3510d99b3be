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
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from common import ROOT, start_fake_runtime, start_proxy, stop_all

sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from cri_api.v1 import api_pb2 as pb
from cri_api.v1 import api_pb2_grpc
from tests.unit.enforce_support import fake_sysfs

QOS = "koordinator.sh/qosClass"
ALLOC = "scheduling.koordinator.sh/resource-status"


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
    sysfs_root = ["--sysfs-root", str(sysfs)] if sysfs is not None else []
    proxy, endpoint = start_proxy(
        work,
        runtime_ep,
        "--log-level",
        "WARNING",
        "--exclusive-wait",
        "60",
        "--admin-listen",
        f"unix://{work}/admin-{n}.sock",
        *sysfs_root,
        listen=work / f"proxy-{n}.sock",
        state_dir=work / f"state-{n}",
    )
    try:
        channel = grpc.insecure_channel(endpoint)
        admin = grpc.insecure_channel(f"unix://{work}/admin-{n}.sock")  # introspection
        rt = api_pb2_grpc.RuntimeServiceStub(channel)
        ids = run_pods(rt, n, start, log_dir)
        # the exclusive pod arrives: time until every LS container is off its CPUs
        cfg = pod_config(f"lsr-{n}", "guaranteed", {QOS: "LSR"}, {ALLOC: json.dumps({"cpuset": lsr_cpus})})
        rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=60)
        t0 = time.perf_counter()  # the pod exists: its post hook has asked for a pass
        while True:
            rows = [r for r in introspect(admin) if r["id"] in set(ids)]
            if rows and all(r["applied"] == r["decided"] for r in rows):
                break
            time.sleep(0.005)
        proxy_time = time.perf_counter() - t0
        target = rows[0]["decided"]
        channel.close()
        admin.close()
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
        stop_all([proxy], 60)


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
    try:
        measure_all(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the proxies' state dirs and sockets


def measure_all(args: argparse.Namespace, work: Path) -> None:
    sysfs = fake_sysfs(work / "sys", {0: "0-7", 1: "8-15"})
    fake, fake_ep = start_fake_runtime(work, "--update-latency-ms", "25", "--log-level", "WARNING")
    try:
        print(
            f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; proxy concurrency 8 (default)",
            flush=True,
        )
        for n in (int(x) for x in args.sizes.split(",")):
            report(
                "fake runtime, 25 ms per update",
                n,
                *measure(fake_ep, work, n, "2-3", sysfs, True, None),
            )
    finally:
        stop_all([fake])
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
