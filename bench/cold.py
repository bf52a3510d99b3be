#!/usr/bin/env python3
"""How much slower a hooked CreateContainer's pre hook runs after the process has been away from it.

A proxy in this process (its hooks, policy and state; no sockets) on a node of ~1,000 containers
runs the pre hook of one new pod's CreateContainer (`HookRunner.pre`: parse, decide, record,
re-encode), its post hook, and removes the pod; before each create it waits one of three ways
(the ways and gaps in turns):
- `none`: not at all (the caches are as the last cycle left them);
- `sleep`: the process sleeps GAP ms, as the proxy does while the runtime creates a container;
- `spin`: the process runs a Python loop for GAP ms, touching almost nothing else.
It prints the pre hook's p50 for each way and gap, and its ratio to `none`.

If `spin` is as slow as `sleep`, what makes the hook slow after a gap is not other work of the
process nor the CPU idling, but time: the CPU's caches and predictors are taken over by the other
processes and tenants of the machine while the hook waits. A real create then pays for every
piece of code and data its path touches again, and the way to a faster create is to touch less.

    .venv/bin/python bench/cold.py                 # ~1 min
    .venv/bin/python bench/cold.py --gaps 1 10 --cycles 500
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "e2e")]

from kube import container_config, pod_sandbox_config  # noqa: E402
from loguru import logger  # noqa: E402

from cri_api.v1 import api_pb2 as pb  # noqa: E402
from cri_proxy.config import load  # noqa: E402
from cri_proxy.relay.methods import KNOWN  # noqa: E402
from cri_proxy.serve import Proxy  # noqa: E402

SERVICE = "/runtime.v1.RuntimeService/"


def wait(way: str, gap: float) -> None:
    if way == "sleep":
        time.sleep(gap)
    elif way == "spin":
        end = time.perf_counter() + gap
        while time.perf_counter() < end:
            pass


async def measure(cycles: int, ways: list[tuple[str, float]]) -> dict[tuple[str, float], float]:
    logger.remove()
    logger.add(open("/dev/null", "w"), level="INFO")  # noqa: SIM115  # lines formatted, not kept
    tmp = Path(tempfile.mkdtemp(prefix="cri-cold-"))
    config = load(
        None,
        {
            "state_dir": str(tmp / "state"),
            "kubelet_state_file": str(tmp / "cpu_manager_state"),
            "runtime_endpoint": f"unix://{tmp}/runtime.sock",
            "reconcile_period_seconds": 0,
        },
    )
    proxy = Proxy(config)
    runner = proxy.relay.forwarder.runner  # the one hook runner both relay modes use
    run_info, create_info = KNOWN[SERVICE + "RunPodSandbox"], KNOWN[SERVICE + "CreateContainer"]
    run_hooks = proxy.table.get(SERVICE + "RunPodSandbox")
    create_hooks = proxy.table.get(SERVICE + "CreateContainer")
    remove_info, remove_hooks = (
        KNOWN[SERVICE + "RemovePodSandbox"],
        proxy.table.get(SERVICE + "RemovePodSandbox"),
    )
    assert run_hooks is not None and create_hooks is not None and remove_hooks is not None
    serial = 0

    async def pod(name: str, containers: int, before: Any = None, remove: bool = False) -> list[float]:
        """A pod and its containers through the hooks; the pre hooks' times, each after `before`;
        `remove`: the pod is removed after (the node stays the same size)."""
        nonlocal serial
        sandbox = pod_sandbox_config(pb, name, qos="besteffort", labels={"bench": "cold"})
        serial += 1
        sandbox_id = f"{serial:064x}"
        reply = pb.RunPodSandboxResponse(pod_sandbox_id=sandbox_id).SerializeToString()
        await runner.post(run_info, run_hooks, pb.RunPodSandboxRequest(config=sandbox), reply)
        await asyncio.sleep(0)  # the plan after the change, as between two calls
        times = []
        for i in range(containers):
            config = container_config(pb, sandbox, f"c{i}")
            raw = pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox)
            if before is not None:
                before()
            began = time.perf_counter()
            out = await runner.pre(create_info, create_hooks, raw.SerializeToString())
            times.append(time.perf_counter() - began)
            serial += 1
            answer = pb.CreateContainerResponse(container_id=f"{serial:064x}").SerializeToString()
            await runner.post(create_info, create_hooks, out.request, answer)  # type: ignore[union-attr]
            await asyncio.sleep(0)
        if remove:
            request = pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id)
            await runner.post(remove_info, remove_hooks, request, b"")
            await asyncio.sleep(0)
        return times

    try:
        for i in range(100):
            await pod(f"node{i}", 10)
        times: dict[tuple[str, float], list[float]] = {way: [] for way in ways}
        for i in range(cycles):  # the ways in turns: the machine's moods hit them alike
            for way, gap in ways:
                before = (lambda way=way, gap=gap: wait(way, gap)) if way != "none" else None
                times[way, gap] += await pod(f"{way}{gap}-{i}", 1, before, remove=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # its state directory only: nothing to read after
    return {way: statistics.median(t) for way, t in times.items()}


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--cycles", type=int, default=300, help="creates per way and gap")
    parser.add_argument("--gaps", type=float, nargs="+", default=[0.5, 2, 10, 20], help="ms")
    args = parser.parse_args()
    ways = [("none", 0.0)] + [(way, gap / 1e3) for gap in args.gaps for way in ("sleep", "spin")]
    results = asyncio.run(measure(args.cycles, ways))
    hot = results["none", 0.0]
    print(f"CreateContainer pre hook, p50 of {args.cycles} creates each, a node of ~1,000 containers")
    for (way, gap), p50 in results.items():
        label = "none" if way == "none" else f"{way} {gap * 1e3:g} ms"
        print(f"  {label:<14} {p50 * 1e6:7.1f} us  ({p50 / hot:4.1f}x none)", flush=True)


if __name__ == "__main__":
    main()
