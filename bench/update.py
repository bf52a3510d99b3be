#!/usr/bin/env python3
"""The kubelet's own UpdateContainerResources through the proxy against the same call directly.

As root, in front of a private real containerd: one LS container; its CPU manager's cpuset-only
update sent through `cri-proxy serve` (which merges it into what the runtime holds, asked with a
ContainerStatus, and sends it whole) and, interleaved with it, the same update whole straight to
containerd. Prints both p50s and what the proxy adds.

    .venv/bin/python bench/update.py [--calls 150]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, start_proxy, stop_all

sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from cri_api.v1 import api_pb2 as pb

WARM = 10


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=150)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/update.py needs root (a private containerd)")
    from containerd import PrivateContainerd, connect, missing_tools, run_setup_script
    from kube import create, linux_resources, pod_sandbox_config

    if missing_tools():
        run_setup_script()
    work = Path(tempfile.mkdtemp(prefix="cri-bench-update-"))
    try:
        with PrivateContainerd() as containerd:
            proxy, endpoint = start_proxy(work, containerd.address, "--log-level", "WARNING")
            try:
                with connect(endpoint) as through, connect(containerd.address) as direct:
                    config = pod_sandbox_config(
                        pb, "update", qos="burstable", log_root=containerd.pod_log_dir
                    )
                    run = through.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=60)
                    cid = create(through, (run.pod_sandbox_id, config), "app")
                    kubelet = pb.UpdateContainerResourcesRequest(
                        container_id=cid, linux=pb.LinuxContainerResources(cpuset_cpus="0-1")
                    )
                    whole = pb.UpdateContainerResourcesRequest(
                        container_id=cid, linux=linux_resources(pb, "burstable", cpuset_cpus="0-1")
                    )
                    times: dict[str, list[float]] = {"proxy": [], "direct": []}
                    for n in range(WARM + args.calls):
                        for name, cri, request in (("proxy", through, kubelet), ("direct", direct, whole)):
                            began = time.perf_counter()
                            cri.runtime.UpdateContainerResources(request, timeout=60)
                            if n >= WARM:
                                times[name].append(time.perf_counter() - began)
                p50 = {name: statistics.median(t) * 1e3 for name, t in times.items()}
                print(
                    f"UpdateContainerResources (the kubelet's cpuset-only) x{args.calls}: direct p50"
                    f" {p50['direct']:.3f} ms | proxy p50 {p50['proxy']:.3f} ms | added p50"
                    f" {p50['proxy'] - p50['direct']:.3f} ms",
                    flush=True,
                )
            finally:
                stop_all([proxy], 60)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
