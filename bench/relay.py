#!/usr/bin/env python3
"""Relay overhead: the same CRI calls straight to the runtime and through `cri-proxy serve`.

Interleaved in one run (direct, proxy, direct, proxy, ...) so machine noise hits both paths alike;
prints p50/p99 per path and the proxy/direct ratio. Runs against a private real containerd
(as root, via the e2e harness) or, with --runtime fake, against the bundled fake runtime.

    .venv/bin/python bench/relay.py                 # real containerd, ~2 minutes
    .venv/bin/python bench/relay.py --runtime fake  # no root needed
    .venv/bin/python bench/relay.py --floor         # and the create rows through a byte pipe
    .venv/bin/python bench/relay.py --floor --runtime-root /dev/shm  # containerd on tmpfs
    .venv/bin/python bench/relay.py --proxy-cli /tmp/v313/bin/cri-proxy  # the proxy on another Python

The hooked CreateContainer row separates the relay from the hook: the proxy's own counters
(`cri_proxy_hook_seconds` / `cri_proxy_hook_runs` on its /metrics) give the hooks' mean time per
call, so "relay" is the added p50 less the pre hook's mean (the post hook runs after the answer
went out); each create row's added p50 comes with a 95 % bootstrap interval, which on a shared
2-vCPU VM is 0.4 to 0.75 ms wide for 400 creates a path. Every container is created through the proxy,
so that the proxy knows the node as it would in production and no adoption (a pass re-pinning
1,000 containers it learnt from a listing) runs in the middle of a measurement. With `--floor` the
three create rows are run again through `bench/pipe.py`, a relay that parses nothing: what two
more hops cost here, which no relay avoids. With `--runtime-root /dev/shm` containerd keeps its
database and snapshots on tmpfs: a create no longer waits for the disk's fsyncs (~3.5 ms instead of
~10, and much of the spread goes with them): a create row's 95 % interval is ±0.1 to 0.25 ms instead
of ±0.2 to 0.4, though the same row still moves by up to 0.25 ms from run to run. The proxy does the
same work either way.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from common import (
    ROOT,
    add_proxy_cli,
    free_port,
    idle_setting,
    proc_figures,
    rss_kib,
    runtime,
    start_proxy,
    stop_all,
)

sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from cri_api.v1 import api_pb2 as pb

BIG_ANNOTATION = 16 * 1024


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def added_interval(d: list[float], p: list[float], rounds: int = 1000) -> tuple[float, float]:
    """A 95 % bootstrap interval of p50(p) - p50(d), each path resampled on its own: how far the
    added p50 of this one run may be from the machine's, given the spread of its calls."""
    rng = random.Random(0)
    diffs = sorted(
        percentile(rng.choices(p, k=len(p)), 0.5) - percentile(rng.choices(d, k=len(d)), 0.5)
        for _ in range(rounds)
    )
    return diffs[int(0.025 * rounds)], diffs[int(0.975 * rounds) - 1]


class Target:
    def __init__(self, address: str) -> None:
        opts = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
        self.channel = grpc.insecure_channel(address, options=opts)
        self.calls: dict[str, Callable[..., bytes]] = {}

    def call(self, path: str) -> Callable[..., bytes]:
        if path not in self.calls:
            self.calls[path] = self.channel.unary_unary(path)
        return self.calls[path]


PROXY_PID = 0  # the proxy's process: its CPU time per call is printed (steadier than latency on a busy VM)


def proxy_cpu() -> float:
    return proc_figures(PROXY_PID)["cpu_s"] if PROXY_PID else 0.0


def measure(name: str, path: str, request: bytes, direct: Target, proxy: Target, n: int) -> dict[str, float]:
    d_call, p_call = direct.call(path), proxy.call(path)
    size = len(d_call(request, timeout=30))
    for _ in range(max(3, n // 20)):  # warm-up, both paths
        d_call(request, timeout=30)
        p_call(request, timeout=30)
    d: list[float] = []
    p: list[float] = []
    cpu0 = proxy_cpu()
    for i in range(n):
        order = ((d_call, d), (p_call, p)) if i % 2 == 0 else ((p_call, p), (d_call, d))
        for fn, out in order:
            t0 = time.perf_counter()
            fn(request, timeout=30)
            out.append(time.perf_counter() - t0)
    cpu = (proxy_cpu() - cpu0) / n
    row = {
        "direct_p50": percentile(d, 0.5),
        "direct_p99": percentile(d, 0.99),
        "proxy_p50": percentile(p, 0.5),
        "proxy_p99": percentile(p, 0.99),
        "bytes": size,
    }
    row["ratio_p50"] = row["proxy_p50"] / row["direct_p50"]
    row["ratio_p99"] = row["proxy_p99"] / row["direct_p99"]
    row["overhead_p50_us"] = (row["proxy_p50"] - row["direct_p50"]) * 1e6
    # each proxy call against the direct call next to it in time: noise that comes and goes (other
    # work on a shared machine) falls on both of a pair, so this one moves less from run to run
    row["ratio_paired"] = statistics.median(b / a for a, b in zip(d, p, strict=True))
    print(
        f"{name:<28} {size:>9} B  direct p50 {row['direct_p50'] * 1e3:7.3f} ms"
        f" p99 {row['direct_p99'] * 1e3:7.3f}"
        f" | proxy p50 {row['proxy_p50'] * 1e3:7.3f} ms p99 {row['proxy_p99'] * 1e3:7.3f}"
        f" | ratio p50 {row['ratio_p50']:.2f} p99 {row['ratio_p99']:.2f}"
        f" (+{row['overhead_p50_us']:.0f} µs) | paired ratio median {row['ratio_paired']:.2f}"
        f" | proxy CPU {cpu * 1e6:.0f} µs a call",
        flush=True,
    )
    return row


def sequential(direct: Target, proxy: Target, n: int) -> None:
    """`n` Version calls one after another on each path (in blocks, interleaved): total time ratio."""
    path = "/runtime.v1.RuntimeService/Version"
    request = pb.VersionRequest(version="v1").SerializeToString()
    d_call, p_call = direct.call(path), proxy.call(path)
    totals = {"direct": 0.0, "proxy": 0.0}
    block = 1000
    cpu0 = proxy_cpu()
    for i in range(0, n, block):
        order = (
            (("direct", d_call), ("proxy", p_call))
            if (i // block) % 2 == 0
            else (("proxy", p_call), ("direct", d_call))
        )
        for name, fn in order:
            t0 = time.perf_counter()
            for _ in range(min(block, n - i)):
                fn(request, timeout=30)
            totals[name] += time.perf_counter() - t0
    print(
        f"{n} sequential Version: direct {totals['direct']:.2f} s, proxy {totals['proxy']:.2f} s,"
        f" ratio {totals['proxy'] / totals['direct']:.2f}"
        f" | proxy CPU {(proxy_cpu() - cpu0) / n * 1e6:.0f} µs a call",
        flush=True,
    )


def hook_counters(metrics: str) -> dict[tuple[str, str], tuple[float, float]]:
    """(method, hook) -> (runs, seconds) from the proxy's /metrics; (method, "ready") -> (the pre
    hook's runs that went on ready, 0): their hook's work came after the request's write."""
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
    runs: dict[tuple[str, str], float] = {}
    seconds: dict[tuple[str, str], float] = {}
    for m in re.finditer(r"^cri_proxy_hook_(runs|seconds)_total\{(.*?)\} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        key = (labels["method"], labels["hook"])
        into = runs if m.group(1) == "runs" else seconds
        into[key] = into.get(key, 0.0) + float(m.group(3))
        if m.group(1) == "runs" and labels.get("outcome") == "ready":
            runs[(labels["method"], "ready")] = runs.get((labels["method"], "ready"), 0.0) + float(m.group(3))
    return {k: (runs.get(k, 0.0), seconds.get(k, 0.0)) for k in runs.keys() | seconds.keys()}


def hooked_create(
    direct: Target,
    proxy: Target,
    n: int,
    metrics: str | None,
    blocks: int = 5,
    pod_each: bool = False,
    started: bool = False,
) -> list[tuple[Target, str]]:
    """CreateContainer (hooked in the proxy) direct and through the proxy, interleaved: added p50,
    and how much of it is the hooks' own time (the proxy's counters) and how much the relay's.
    All in one pod that grows to `n` containers per path, or (`pod_each`) each in a pod of its own,
    made first on the same path and not timed: the kubelet's usual shape, a pod of a few containers.
    `started`: one new pod whose containers are each started on their path after the create (not
    in the create's time; the starts' added p50 is printed apart), as a kubelet starts a pod's
    container before it creates the next. Returns the pods made, each with its path, for
    `remove_pods`. `metrics` None: `proxy` is `bench/pipe.py`, which sets no cpuset, so its
    requests carry one, as direct ones do."""
    from kube import container_config, pod_sandbox_config

    path = "/runtime.v1.RuntimeService/CreateContainer"
    run_pod = {
        name: target.channel.unary_unary("/runtime.v1.RuntimeService/RunPodSandbox")
        for name, target in (("d", direct), ("p", proxy))
    }

    def new_pod(name: str, label: str) -> tuple[str, Any]:
        config = pod_sandbox_config(pb, f"bench-hooked-{label}", qos="besteffort", labels={"bench": "hooked"})
        reply = run_pod[name](pb.RunPodSandboxRequest(config=config).SerializeToString(), timeout=60)
        return pb.RunPodSandboxResponse.FromString(reply).pod_sandbox_id, config

    shared = new_pod("p", "started" if started else "shared")
    made: list[tuple[Target, str]] = [(proxy, shared[0])]
    d_call, p_call = direct.call(path), proxy.call(path)
    start = {
        name: target.call("/runtime.v1.RuntimeService/StartContainer")
        for name, target in (("d", direct), ("p", proxy))
    }
    d: list[float] = []
    p: list[float] = []
    starts: dict[str, list[float]] = {"d": [], "p": []}  # `started`: each start's seconds, by path
    # what the proxy injects into a BE container here (the BE pool: every online CPU, none reserved),
    # sent direct too: the runtime then does the same work on both paths (it sets a cpuset), and the
    # proxy finds nothing to re-pin when it adopts the direct ones
    cpus = Path("/sys/devices/system/cpu/online").read_text().strip()
    before = hook_counters(metrics) if metrics else {}
    cpu0 = proxy_cpu()
    for i in range(n):
        for name, fn, out in (
            (("d", d_call, d), ("p", p_call, p)) if i % 2 == 0 else (("p", p_call, p), ("d", d_call, d))
        ):
            pod_id, pod = new_pod(name, f"{name}{i}") if pod_each else shared
            if pod_each:
                made.append((direct if name == "d" else proxy, pod_id))
            cfg = container_config(pb, pod, f"h{name}{i}")
            if name == "d" or metrics is None:
                cfg.linux.resources.cpuset_cpus = cpus
            request = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=cfg, sandbox_config=pod)
            t0 = time.perf_counter()
            reply = fn(request.SerializeToString(), timeout=60)
            out.append(time.perf_counter() - t0)
            if started:
                cid = pb.CreateContainerResponse.FromString(reply).container_id
                body = pb.StartContainerRequest(container_id=cid).SerializeToString()
                t0 = time.perf_counter()
                start[name](body, timeout=60)
                starts[name].append(time.perf_counter() - t0)
    cpu = (proxy_cpu() - cpu0) / n
    time.sleep(0.5)  # the last post hook
    after = hook_counters(metrics) if metrics else {}
    # this row's hook runs and their seconds, by hook ("ready": the pre runs that went on ready)
    runs: dict[str, float] = {}
    secs: dict[str, float] = {}
    for which in ("pre", "post", "ready"):
        runs0, secs0 = before.get(("CreateContainer", which), (0.0, 0.0))
        runs1, secs1 = after.get(("CreateContainer", which), (0.0, 0.0))
        runs[which], secs[which] = runs1 - runs0, secs1 - secs0
    hook = {which: secs[which] / runs[which] if runs[which] > 0 else 0.0 for which in ("pre", "post")}
    ready = runs["ready"] / runs["pre"] if runs["pre"] > 0 else 0.0  # their pre hook's work: after the write
    dp, pp = percentile(d, 0.5), percentile(p, 0.5)
    lo, hi = added_interval(d, p)
    interval = f"95 % interval {lo * 1e3:.2f} to {hi * 1e3:.2f}; "
    size = max(1, n // blocks)  # the added p50 of each block of the run: how stable it is
    added = [
        (percentile(p[i : i + size], 0.5) - percentile(d[i : i + size], 0.5)) * 1e3
        for i in range(0, n - size + 1, size)
    ]
    # the order alternates d,p | p,d: a create in an odd round comes right after one on the other
    # path, in an even round after one on its own path (the client's channel and the proxy warm;
    # with a pod each, every create also comes right after its pod's RunPodSandbox on its path):
    # added p50 with both paths warm, and with both cold
    warm = percentile(p[1::2], 0.5) - percentile(d[0::2], 0.5)
    cold = percentile(p[0::2], 0.5) - percentile(d[1::2], 0.5)
    # a direct create after one through the relay less one after a direct one: the relay's work
    # after its answer that lands on the next call whatever its path (on a node, its own next
    # call): when it is well above zero, the row's added p50 reads lower than the relay costs,
    # and `warm` is the figure to read (docs/performance.md, thirty-fourth round)
    spill = percentile(d[1::2], 0.5) - percentile(d[0::2], 0.5)
    shape = "a pod each" if pod_each else "one pod, each started" if started else "one growing pod"
    paired = statistics.median(b - a for a, b in zip(d, p, strict=True))
    start_line = ""
    if started:  # the starts, timed apart from the creates (hooked after the call only)
        sd, sp = percentile(starts["d"], 0.5), percentile(starts["p"], 0.5)
        start_line = f" | StartContainer direct p50 {sd * 1e3:.3f} ms, added p50 {(sp - sd) * 1e3:.3f} ms"
    figures = (
        f" | added p50 {(pp - dp) * 1e3:.3f} ms ({interval}per block of {size}: "
        f"{', '.join(f'{a:.2f}' for a in added)}; median {statistics.median(added):.3f})"
        f" | paired added median {paired * 1e3:.3f} ms"
        f" | direct p50 after the relay's create less after a direct one {spill * 1e3:.3f} ms"
    )
    if metrics is None:  # the byte pipe: the floor of any relay here, with none of the proxy's work
        print(
            f"CreateContainer (byte pipe; {shape}; both with cpuset {cpus}) x{n}"
            f" direct p50 {dp * 1e3:.3f} ms | pipe p50 {pp * 1e3:.3f} ms{figures}{start_line}",
            flush=True,
        )
        return made
    print(
        f"CreateContainer (hooked; {shape};"
        f" direct with cpuset {cpus}) x{n}"
        f" direct p50 {dp * 1e3:.3f} ms | proxy p50 {pp * 1e3:.3f} ms{figures}"
        f" | added p50 with each path's previous call on that path {warm * 1e3:.3f} ms,"
        f" on the other path {cold * 1e3:.3f} ms"
        f" | hook mean pre {hook['pre'] * 1e3:.3f} ms ({ready:.0%} of creates ready: after the write),"
        f" post {hook['post'] * 1e3:.3f} ms (after the answer)"
        f" | relay = added - pre on the path {(pp - dp - hook['pre'] * (1 - ready)) * 1e3:.3f} ms"
        f" | proxy CPU {cpu * 1e3:.3f} ms a create{' (with its RunPodSandbox)' if pod_each else ''}"
        f"{' (with its start)' if started else ''}{start_line}",
        flush=True,
    )
    return made


def remove_pods(pods: list[tuple[Target, str]]) -> None:
    """Stop and remove `pods`, each on its path, and wait until their shims are gone: the next
    measure starts on a node of the pods it had before, not with hundreds more (a node runs ~110
    at most), whose shims and clean-up take the CPUs the measure's calls want."""
    shims = "containerd-shim"

    def count() -> int:
        return sum(1 for p in Path("/proc").glob("[0-9]*/comm") if _comm(p).startswith(shims))

    def one(pod: tuple[Target, str]) -> None:
        target, pod_id = pod
        request = pb.StopPodSandboxRequest(pod_sandbox_id=pod_id).SerializeToString()
        target.call("/runtime.v1.RuntimeService/StopPodSandbox")(request, timeout=60)
        request = pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id).SerializeToString()
        target.call("/runtime.v1.RuntimeService/RemovePodSandbox")(request, timeout=60)

    before = count()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, pods))
    deadline = time.monotonic() + 60
    while count() > max(0, before - len(pods)) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # the runtime's own clean-up after the last one


def _comm(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # the process ended meanwhile
        return ""


def populate(address: str, pods: int, per_pod: int, annotation_bytes: int = 0, label: str = "") -> str:
    """Create pods with created (not started) containers through `address`; returns the last pod id."""
    from kube import container_config, pod_sandbox_config

    channel = grpc.insecure_channel(address)
    from cri_api.v1 import api_pb2_grpc

    rt = api_pb2_grpc.RuntimeServiceStub(channel)
    last = ""
    annotations = {"bench/padding": "x" * annotation_bytes} if annotation_bytes else {}

    def one(pod_id: str, pod: object, i: int) -> None:
        cfg = container_config(pb, pod, f"c{i}", annotations=annotations)
        rt.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=cfg, sandbox_config=pod), timeout=60
        )

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for p in range(pods):
            pod = pod_sandbox_config(
                pb, f"bench{label}-{p}", qos="besteffort", labels={"bench": label or "plain"}
            )
            last = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod), timeout=60).pod_sandbox_id
            list(pool.map(lambda i, pod_id=last, pod=pod: one(pod_id, pod, i), range(per_pod)))
    channel.close()
    return last


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runtime", choices=("containerd", "fake"), default="containerd")
    parser.add_argument("-n", type=int, default=1000, help="samples per path for tiny calls")
    parser.add_argument("--sequential", type=int, default=20000, help="sequential Version calls per path")
    parser.add_argument(
        "--runtime-root",
        default=None,
        help="where containerd keeps its own (default /tmp); /dev/shm: no disk fsync in its creates",
    )
    parser.add_argument("--creates", type=int, default=400, help="hooked CreateContainer calls per path")
    parser.add_argument(
        "--relay-mode", choices=("grpc", "frames"), default=None, help="passed to `cri-proxy serve`"
    )
    add_proxy_cli(parser)
    parser.add_argument(
        "--floor",
        action="store_true",
        help="the create rows again through a byte pipe (bench/pipe.py): what any relay adds here",
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="cri-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    with runtime(args.runtime, work, args.runtime_root) as runtime_address:
        try:
            run(args, work, runtime_address, procs)
        finally:
            stop_all(procs)


def proxy_python(cli: str | None) -> str:
    """The Python version the proxy runs on: this one's, or that of `cli`'s venv."""
    if not cli:
        return sys.version.split()[0]
    python = Path(cli).parent / "python"
    script = "import sys; print(sys.version.split()[0])"
    version = subprocess.run([str(python), "-c", script], capture_output=True)
    return version.stdout.decode().strip() or f"? ({python})"


def run(
    args: argparse.Namespace, work: Path, runtime_address: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    """Every measure against `runtime_address`; the proxy started goes into `procs`."""
    relay_mode = ["--relay-mode", args.relay_mode] if args.relay_mode else []
    metrics = f"127.0.0.1:{free_port()}"
    # no periodic pass during the run (it re-reads every container's cpuset: 2,000 status calls
    # to the runtime every 30 s, in the middle of a measurement); passes on changes still run
    config = work / "proxy.toml"
    config.write_text("reconcile_period_seconds = 0\n")
    # at its default log level, as on a node (a line per CreateContainer), into the work dir
    proxy_proc, proxy_address = start_proxy(
        work,
        runtime_address,
        "--config",
        str(config),
        "--metrics-address",
        metrics,
        *relay_mode,
        log=work / "proxy.log",
        cli=args.proxy_cli,
    )
    procs.append(proxy_proc)
    global PROXY_PID
    PROXY_PID = proxy_proc.pid
    direct, proxy = Target(runtime_address), Target(proxy_address)
    print(
        f"runtime: {args.runtime} ({runtime_address}, its root in {args.runtime_root or '/tmp'});"
        f" proxy pid {proxy_proc.pid}"
        f" (relay mode {args.relay_mode or 'default'}; log {work / 'proxy.log'}); "
        f"python {sys.version.split()[0]}, grpcio {grpc.__version__}, {os.cpu_count()} CPUs"
        f" ({idle_setting()})"
        f"; proxy python {proxy_python(args.proxy_cli)}",
        flush=True,
    )
    rss_start = rss_kib(proxy_proc.pid)

    rs = "/runtime.v1.RuntimeService/"
    empty = b""
    measure(
        "Version",
        rs + "Version",
        pb.VersionRequest(version="v1").SerializeToString(),
        direct,
        proxy,
        args.n,
    )
    if args.sequential:
        sequential(direct, proxy, args.sequential)
    populate(proxy_address, 1, 10)  # through the proxy: it knows the node as in production
    measure("ListPodSandbox (1 pod)", rs + "ListPodSandbox", empty, direct, proxy, args.n)
    measure("ListImages", "/runtime.v1.ImageService/ListImages", empty, direct, proxy, args.n)
    measure("ListContainers (10)", rs + "ListContainers", empty, direct, proxy, args.n)
    populate(proxy_address, 11, 90)  # 10 + 990 = 1,000 containers
    measure("ListContainers (1,000)", rs + "ListContainers", empty, direct, proxy, max(50, args.n // 5))
    big_pod = populate(proxy_address, 1, 256, annotation_bytes=BIG_ANNOTATION, label="big")
    big = pb.ListContainersRequest(filter=pb.ContainerFilter(pod_sandbox_id=big_pod)).SerializeToString()
    measure("ListContainers (~4 MiB)", rs + "ListContainers", big, direct, proxy, max(30, args.n // 10))
    if args.creates:
        hooked_create(direct, proxy, args.creates, metrics)
        remove_pods(hooked_create(direct, proxy, args.creates, metrics, pod_each=True))
        hooked_create(direct, proxy, args.creates // 2, metrics, started=True)
        if args.floor:
            floor(args, work, runtime_address, direct, procs)
    print(f"proxy RSS: {rss_start} KiB at start, {rss_kib(proxy_proc.pid)} KiB at end", flush=True)


def floor(
    args: argparse.Namespace,
    work: Path,
    runtime_address: str,
    direct: Target,
    procs: list[subprocess.Popen[bytes]],
) -> None:
    """The three create rows through `bench/pipe.py` instead of the proxy: the hops alone."""
    import pipe

    pipe_proc, pipe_address = pipe.start(work, runtime_address)
    procs.append(pipe_proc)
    piped = Target(pipe_address)
    # each row's pods removed after it: the containers these rows add would take containerd past its
    # open files (it keeps each created container's log pipes open)
    remove_pods(hooked_create(direct, piped, args.creates, None))
    remove_pods(hooked_create(direct, piped, args.creates, None, pod_each=True))
    remove_pods(hooked_create(direct, piped, args.creates // 2, None, started=True))


if __name__ == "__main__":
    main()
