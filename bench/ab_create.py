#!/usr/bin/env python3
"""Hooked CreateContainer, before and after: two checkouts' proxies in front of one runtime, in turns.

One proxy runs this checkout, the other the checkout given with `--against` (e.g. `git worktree add
/tmp/base main`; its `cri_proxy` comes first on that proxy's PYTHONPATH), both at their default log
level unless `--serve-args` says otherwise. Each round sends one CreateContainer direct and one
through each proxy, in an order that rotates, so that the machine's noise (large on a shared
2-vCPU VM, where runs a minute apart differ by more than most changes) hits the three alike.
Prints each proxy's added p50 against direct, the median of its paired differences, the same per
block of the run, and the paired median of this checkout minus the other.

    .venv/bin/python bench/ab_create.py --against /tmp/base --runtime fake -n 800
    .venv/bin/python bench/ab_create.py --against /tmp/base -n 400 --pod-each
    .venv/bin/python bench/ab_create.py --against /tmp/base --gap 0.02   # calls spaced as a kubelet's
    .venv/bin/python bench/ab_create.py --against /tmp/base --start -n 300  # create, start, create, ...
    .venv/bin/python bench/ab_create.py --against /tmp/base --call version -n 5000   # tiny calls
    .venv/bin/python bench/ab_create.py --against /tmp/base --call version -n 15 --run 1000
    .venv/bin/python bench/ab_create.py --against . --against-cli /tmp/v313/bin/cri-proxy  # Pythons

With `--run K` each path gets K calls in a row per turn (`--twice`: 2): a connection's own
housekeeping (a PING's ACK the client sends alone after a call, say) then costs that path's next
call, not whichever path's call comes next; one call per turn hides such costs.

Against containerd, keep the creates under ~5,000 (3 paths x -n x --run): the bench's
containerd runs out of open files beyond (one growing pod), and a pod each makes real sandboxes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import ROOT, idle_setting, runtime, start_proxy, stop_all
from relay import Target

from cri_api.v1 import api_pb2 as pb

ORDERS = (
    ("d", "a", "b"),
    ("a", "b", "d"),
    ("b", "d", "a"),
    ("d", "b", "a"),
    ("b", "a", "d"),
    ("a", "d", "b"),
)
WARM = 20  # rounds not counted (connections, caches, the first plans)


def start_pair(
    work: Path,
    endpoint: str,
    against: Path,
    serve_args: list[str],
    procs: list[Any],
    against_cli: str | None = None,
) -> dict[str, Target]:
    """Proxy a (this checkout) and b (`against`, run by `against_cli` when given) in front of
    `endpoint`, their processes put in `procs`."""
    targets: dict[str, Target] = {}
    for name, code, cli in (("a", ROOT, None), ("b", against, against_cli)):
        where = work / name
        where.mkdir()
        config = where / "proxy.toml"
        config.write_text("reconcile_period_seconds = 0\n")  # no periodic pass in the middle of a run
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = str(code)
        try:
            proc, address = start_proxy(
                where, endpoint, "--config", str(config), *serve_args, log=where / "proxy.log", cli=cli
            )
        finally:
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved
        procs.append(proc)
        targets[name] = Target(address)
    return targets


def timed(
    targets: dict[str, Target], n: int, gap: float, run: int, prepare: Callable[[str, int, int], Any]
) -> dict[str, list[float]]:
    """Seconds of each call per target ("d": direct), `n` rounds after the warm-up: each round
    calls every path in the order `ORDERS` rotates through, `run` calls in a row on each (two: as a
    kubelet's come), all timed. `prepare(target, round, slot)` readies a call, untimed, and
    returns it."""
    out: dict[str, list[float]] = {k: [] for k in targets}
    warm = WARM if run < WARM else 1  # rounds of long runs warm up in one
    for i in range(n + warm):
        slots = [slot for slot in ORDERS[i % len(ORDERS)] for _ in range(run)]
        for j, k in enumerate(slots):
            call = prepare(k, i, j)
            if gap:
                time.sleep(gap)
            t0 = time.perf_counter()
            call()
            if i >= warm:
                out[k].append(time.perf_counter() - t0)
    return out


def rounds(
    targets: dict[str, Target], n: int, pod_each: bool, gap: float, run: int = 1, start: bool = False
) -> dict[str, list[float]]:
    """CreateContainer on every path (see `timed`), in one pod per path or (`pod_each`) each in a
    pod of its own, made first on the same path and not timed; `start`: each container then
    started on the same path, not timed, as a kubelet starts one before it creates the next."""
    from kube import container_config, pod_sandbox_config

    run_pod = {
        k: t.channel.unary_unary("/runtime.v1.RuntimeService/RunPodSandbox") for k, t in targets.items()
    }
    create = {k: t.call("/runtime.v1.RuntimeService/CreateContainer") for k, t in targets.items()}
    start_one = {k: t.call("/runtime.v1.RuntimeService/StartContainer") for k, t in targets.items()}
    created: list[tuple[str, bytes]] = []  # the last create's path and answer, to start before the next call
    starts: dict[str, list[float]] = {k: [] for k in targets}  # each start's seconds, not in the creates'

    def new_pod(k: str, label: str) -> tuple[str, Any]:
        config = pod_sandbox_config(pb, f"ab-{label}", qos="besteffort", labels={"bench": "ab"})
        reply = run_pod[k](pb.RunPodSandboxRequest(config=config).SerializeToString(), timeout=60)
        return pb.RunPodSandboxResponse.FromString(reply).pod_sandbox_id, config

    shared = {k: new_pod(k, f"shared-{k}") for k in targets}
    # what the proxies inject into a BE container here (every online CPU), sent direct too
    cpus = Path("/sys/devices/system/cpu/online").read_text().strip()

    def prepare(k: str, i: int, j: int) -> Callable[[], object]:
        if created:
            path, answer = created.pop()
            reply = pb.CreateContainerResponse.FromString(answer)
            body = pb.StartContainerRequest(container_id=reply.container_id).SerializeToString()
            t0 = time.perf_counter()
            start_one[path](body, timeout=60)
            starts[path].append(time.perf_counter() - t0)
        pod_id, pod = new_pod(k, f"{k}{i}-{j}") if pod_each else shared[k]
        config = container_config(pb, pod, f"c{k}{i}-{j}")
        if k == "d":
            config.linux.resources.cpuset_cpus = cpus
        request = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod)
        body = request.SerializeToString()
        if not start:
            return lambda: create[k](body, timeout=60)

        def call() -> None:
            created.append((k, create[k](body, timeout=60)))

        return call

    out = timed(targets, n, gap, run, prepare)
    if start:
        d = statistics.median(starts["d"])
        added = ", ".join(f"{k} {(statistics.median(starts[k]) - d) * 1e3:.3f}" for k in ("a", "b"))
        print(f"StartContainer (not in the creates' time) direct p50 {d * 1e3:.3f} ms, added p50: {added} ms")
    return out


def version_rounds(targets: dict[str, Target], n: int, gap: float, run: int = 1) -> dict[str, list[float]]:
    """Version on every path (see `timed`)."""
    version = {k: t.call("/runtime.v1.RuntimeService/Version") for k, t in targets.items()}
    body = pb.VersionRequest(version="v1").SerializeToString()
    return timed(targets, n, gap, run, lambda k, i, j: lambda: version[k](body, timeout=60))


def report(out: dict[str, list[float]], names: dict[str, str], blocks: int = 5) -> None:
    d = out["d"]
    n = len(d)
    size = max(1, n // blocks)
    ms: Callable[[float], str] = lambda s: f"{s * 1e3:.3f}"  # noqa: E731
    print(f"direct p50 {ms(statistics.median(d))} ms")
    for k in ("a", "b"):
        p = out[k]
        added = statistics.median(p) - statistics.median(d)
        paired = statistics.median(y - x for x, y in zip(d, p, strict=True))
        per = [
            statistics.median(p[i : i + size]) - statistics.median(d[i : i + size])
            for i in range(0, n - size + 1, size)
        ]
        ratio = statistics.median(p) / statistics.median(d)
        mean = statistics.fmean(p) / statistics.fmean(d)
        print(
            f"  {k} {names[k]}: added p50 {ms(added)} ms (ratio {ratio:.2f}, of the means {mean:.2f})"
            f" | paired median {ms(paired)} ms"
            f" | per block of {size}: {', '.join(ms(x) for x in per)}"
        )
    diff = statistics.median(x - y for x, y in zip(out["a"], out["b"], strict=True))
    print(f"  a - b, paired median: {ms(diff)} ms (negative: this checkout is faster)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--against", type=Path, required=True, help="the other checkout (its root)")
    parser.add_argument("--runtime", choices=("containerd", "fake"), default="containerd")
    parser.add_argument("--call", choices=("create", "version"), default="create", help="the call timed")
    parser.add_argument("-n", type=int, default=400, help="rounds (one call per path each)")
    parser.add_argument("--pod-each", action="store_true", help="each create in a pod of its own")
    parser.add_argument("--twice", action="store_true", help="two calls in a row on each path (--run 2)")
    parser.add_argument("--run", type=int, default=1, help="calls in a row on each path per turn")
    parser.add_argument(
        "--start", action="store_true", help="start each container after its create (not timed)"
    )
    parser.add_argument(
        "--runtime-root",
        default=None,
        help="where containerd keeps its own (default /tmp); /dev/shm: no disk fsync in its creates",
    )
    parser.add_argument("--gap", type=float, default=0.0, help="seconds between calls (not timed)")
    parser.add_argument("--serve-args", default="", help="more `cri-proxy serve` flags for both proxies")
    parser.add_argument(
        "--against-cli",
        default=None,
        help="the `cri-proxy` script proxy b runs from: another venv's, say on another Python",
    )
    args = parser.parse_args()
    run = 2 if args.twice else args.run
    if run < 1:
        raise SystemExit(f"--run {args.run}: at least 1")
    if not (args.against / "cri_proxy").is_dir():
        raise SystemExit(f"--against {args.against}: no cri_proxy package there")

    work = Path(tempfile.mkdtemp(prefix="cri-ab-"))
    with runtime(args.runtime, work, args.runtime_root) as address:
        procs: list[Any] = []
        try:
            targets = start_pair(
                work, address, args.against, args.serve_args.split(), procs, args.against_cli
            )
            targets["d"] = Target(address)
            names = {
                "a": str(ROOT),
                "b": str(args.against) + (f" ({args.against_cli})" if args.against_cli else ""),
            }
            if args.call == "version":
                print(
                    f"Version x{args.n} x{run} on {args.runtime}, gap {args.gap} s; "
                    f"{idle_setting()}; logs in {work}"
                )
                report(version_rounds(targets, args.n, args.gap, run), names)
                return
            shape = (
                ("a pod each" if args.pod_each else "one growing pod")
                + (f", {run} in a row" if run > 1 else "")
                + (", each started" if args.start else "")
            )
            print(
                f"CreateContainer x{args.n} on {args.runtime}, {shape}, gap {args.gap} s; "
                f"{idle_setting()}; logs in {work}"
            )
            report(rounds(targets, args.n, args.pod_each, args.gap, run, args.start), names)
        finally:
            stop_all(procs)


if __name__ == "__main__":
    main()
