#!/usr/bin/env python3
"""The ready hook's cost on a create's path: `EnforceHooks.ready_create` of a real proxy, warm and
with the caches cold.

A create that goes on ready (`Hooks.ready`) waits for this hook between the relay's read and its
write to the runtime; `bench/core.py --create` stands a trivial hook in for it. Here a full proxy
(`tests/unit/enforce_support.node`: the bundled fake runtime, the real state, policy and hooks)
holds one best-effort pod whose next create was read ahead, as between a kubelet's calls; the hook
is then asked for a kubelet-sized create in that pod (`bench/core.py`'s request) `--calls` times
in a row (warm), and as many times with `--cold` MB of memory written before each (as the runtime
and the client do between two creates on a node). Prints the median wall µs of each.

    .venv/bin/python bench/ready.py                        # ~5 s
    .venv/bin/python bench/ready.py --against /tmp/base    # before/after: another checkout's hooks too

With `--against DIR` (e.g. `git worktree add /tmp/base main`) the hook of that checkout is measured
as well, in a child process, in turns with this one (`--rounds`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


async def measure(calls: int, cold: int) -> tuple[float, float]:
    """(warm, cold) median wall µs of one `ready_create`."""
    from core import create_request

    from cri_api.v1 import api_pb2 as pb
    from cri_proxy.relay.methods import KNOWN
    from tests.unit.enforce_support import node

    info = KNOWN["/runtime.v1.RuntimeService/CreateContainer"]
    with tempfile.TemporaryDirectory(prefix="cri-ready-") as tmp:
        async with node(Path(tmp)) as n:
            sandbox, _ = await n.run_pod("bench", "besteffort", containers=())
            request = pb.CreateContainerRequest.FromString(create_request())
            request.pod_sandbox_id = sandbox
            raw = request.SerializeToString()
            hooks, policy = n.proxy.hooks, n.proxy.policy
            policy.plan()
            policy.prepare([sandbox])  # as the hooks do after a change, between calls
            if hooks.ready_create(raw, info) is None:
                raise SystemExit("the create does not go on ready: nothing to measure")
            block = os.urandom(1 << 20)
            source = block * cold
            sink = bytearray(len(source))
            clock = time.perf_counter
            figures = []
            for flush in (False, True):
                times = []
                for _ in range(calls):
                    if flush:
                        sink[:] = source
                    began = clock()
                    hooks.ready_create(raw, info)
                    times.append((clock() - began) * 1e6)
                figures.append(statistics.median(times))
            return figures[0], figures[1]


def measure_in(root: Path, args: argparse.Namespace) -> tuple[float, float]:
    """The same with the hooks of the checkout at `root`, in a child process."""
    argv = [sys.executable, __file__, "--root", str(root), "--figures"]
    argv += ["--calls", str(args.calls), "--cold", str(args.cold)]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout.split()
    return float(out[-2]), float(out[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=300, help="calls per measure (default 300)")
    ap.add_argument("--cold", type=int, default=16, help="MB of memory written before each cold call")
    ap.add_argument("--against", type=Path, help="another checkout whose hook is measured in turns")
    ap.add_argument("--rounds", type=int, default=3, help="turns of each with --against (default 3)")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose hook is measured")
    ap.add_argument("--figures", action="store_true", help="print the two figures only")
    args = ap.parse_args()
    sys.path[:0] = [str(args.root.resolve()), str(Path(__file__).resolve().parent)]
    from loguru import logger

    logger.remove()  # the proxy's start and stop lines are not the bench's output
    if args.figures:
        print(*asyncio.run(measure(args.calls, args.cold)))
        return
    here: list[tuple[float, float]] = []
    there: list[tuple[float, float]] = []
    for _ in range(args.rounds if args.against else 1):
        here.append(asyncio.run(measure(args.calls, args.cold)))
        if args.against:
            there.append(measure_in(args.against, args))

    def shown(figures: list[tuple[float, float]]) -> str:
        warm = statistics.median(f[0] for f in figures)
        cold = statistics.median(f[1] for f in figures)
        return f"warm {warm:.1f} µs, cold {cold:.1f} µs"

    line = f"ready_create, {args.calls} calls a measure, {args.cold} MB written before each cold one: "
    line += shown(here)
    if args.against:
        line += f" | {args.against}: {shown(there)}"
    print(line, flush=True)


if __name__ == "__main__":
    main()
