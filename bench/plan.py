"""Benchmark the decision engine: `decide` for 100 / 1,000 / 5,000 pods on a 256-CPU, 4-node machine.

Run: `.venv/bin/python bench/plan.py [--repeat N]`. Each pod has 3 containers; the class mix is
fixed, so time per container should stay flat as the node grows (linear total). Also times the
whole `cri-proxy plan` path (JSON text in, JSON text out) for comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from cri_proxy.cpu import ContainerInfo, CPUSet, NodeInputs, PodInfo, Topology, decide, parse_kubelet_state
from cri_proxy.cpu.keys import QOS_LABEL, RESOURCE_STATUS_ANNOTATION
from cri_proxy.cpu.snapshot import inputs_to_snapshot, load_snapshot, plan_to_json

SIZES = (100, 1_000, 5_000)
CPUS, NODES = 256, 4
PER_NODE = CPUS // NODES
CONTAINERS = ("init", "app", "sidecar")
EXCLUSIVE_SPAN = 96  # LSE/LSR CPUs cycle through 8-103; beyond 48 exclusive pods they overlap


def build(n_pods: int) -> NodeInputs:
    """A node with a fixed mix: 5% LSE, 15% LSR, 40% LS (half NUMA-bound), 30% BE, 5% SYSTEM,
    5% Guaranteed pinned by kubelet's static policy (v2 state)."""
    topology = Topology.build({n: CPUSet.range(n * PER_NODE, (n + 1) * PER_NODE - 1) for n in range(NODES)})
    pods: list[PodInfo] = []
    kubelet_entries: dict[str, dict[str, str]] = {}
    next_cpu = 8  # exclusive CPUs handed out round-robin above the reserved ones
    for i in range(n_pods):
        uid = f"0000{i:04d}-aaaa-bbbb-cccc-{i:012d}"
        slot = i % 20
        labels: dict[str, str] = {"app": f"app-{i % 50}"}
        annotations: dict[str, str] = {"kubernetes.io/config.seen": "2026-01-01T00:00:00Z"}
        cgroup = f"/kubepods/burstable/pod{uid}"
        if slot < 4:
            labels[QOS_LABEL] = "LSE" if slot == 0 else "LSR"
            cpus = CPUSet.range(next_cpu, next_cpu + 1)
            alloc = {"cpuset": str(cpus), "numaNodeResources": [{"node": next_cpu // PER_NODE}]}
            next_cpu = 8 + (next_cpu - 8 + 2) % EXCLUSIVE_SPAN
            annotations[RESOURCE_STATUS_ANNOTATION] = json.dumps(alloc)
            cgroup = f"/kubepods/pod{uid}"
        elif slot < 12:
            labels[QOS_LABEL] = "LS"
            if slot % 2:
                annotations[RESOURCE_STATUS_ANNOTATION] = json.dumps({"numaNode": [slot % NODES]})
        elif slot < 18:
            if slot % 2:
                labels[QOS_LABEL] = "BE"
            cgroup = f"/kubepods/besteffort/pod{uid}"
        elif slot == 18:
            labels[QOS_LABEL] = "SYSTEM"
        else:
            cgroup = f"/kubepods/pod{uid}"
            cpu = 200 + (i // 20) % 48
            kubelet_entries[uid] = {"app": f"{cpu}"}
        pods.append(
            PodInfo(
                uid=uid,
                name=f"pod-{i}",
                namespace=f"ns-{i % 10}",
                cgroup_parent=cgroup,
                labels=labels,
                annotations=annotations,
                containers=tuple(ContainerInfo(f"{uid}-{c}", c) for c in CONTAINERS),
            )
        )
    state = parse_kubelet_state(
        {"policyName": "static", "defaultCpuSet": "0-199", "entries": kubelet_entries}
    )
    return NodeInputs(
        topology=topology,
        pods=tuple(pods),
        reserved=CPUSet.range(0, 3),
        system=CPUSet.range(0, 1),
        kubelet=state,
    )


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of `repeat` runs, in seconds (one warm-up run first)."""
    fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(
        f"{'pods':>6} {'containers':>10} {'decide ms':>10} {'µs/pod':>8} {'µs/container':>13} "
        f"{'x time vs 100':>14} {'per-container vs 100':>21} {'plan (JSON in/out) ms':>22}"
    )
    base: float | None = None
    for n in SIZES:
        inputs = build(n)
        text = json.dumps(inputs_to_snapshot(inputs))
        plan = decide(inputs)
        assert len(plan.containers) == 3 * n
        t = timed(lambda inputs=inputs: decide(inputs), args.repeat)  # type: ignore[misc]
        full = timed(
            lambda text=text: json.dumps(plan_to_json(decide(load_snapshot(text)))),  # type: ignore[misc]
            max(3, args.repeat // 2),
        )
        per_container = t / (3 * n) * 1e6
        base = base or t / n
        print(
            f"{n:>6} {3 * n:>10} {t * 1e3:>10.2f} {t / n * 1e6:>8.2f} {per_container:>13.2f} "
            f"{t / (base * 100):>14.1f} {t / n / base:>21.2f} {full * 1e3:>22.1f}"
        )


if __name__ == "__main__":
    main()
