#!/usr/bin/env python3
"""Load: the kubelet's steady CRI mix through `cri-proxy serve` against a 500-container fake runtime.

Loopback only (Unix sockets in a temp directory), bounded in time (`--seconds`, default 60) and
count (`--max-calls`). Runs, all at once:

- the fake runtime (a subprocess) seeded with 250 pods x 2 running containers;
- `cri-proxy serve` (a subprocess; state dir and kubelet state file in the temp directory);
- 16 clients (4 processes x 4 threads, one channel each) looping over the kubelet's steady mix:
  ListPodSandbox, ListContainers, ContainerStatus of a random container (x4), ListContainerStats;
- 50 GetContainerEvents watchers through the proxy (one process, asyncio, 5 channels x 10 streams);
- a light churn through the proxy (`--churn`, pod life cycles per second: RunPodSandbox,
  CreateContainer, StartContainer, StopContainer, RemoveContainer, StopPodSandbox,
  RemovePodSandbox) so the watchers have events to count: every watcher must see every event;
- an interleaved sampler (main process, one call every `--sample-ms`) sending the same mix to the
  runtime directly and through the proxy, alternately: the overhead under load.

Prints calls/s, latency p50/p99 through the proxy, the sampler's overhead, errors, events lost, and
the proxy process's RSS, open file descriptors and CPU seconds per 1,000 calls (from /proc).

    .venv/bin/python bench/load.py                  # 60 s
    .venv/bin/python bench/load.py --seconds 10     # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
from common import proc_figures, start_fake_runtime, start_proxy, stop_all

from cri_api.v1 import api_pb2 as pb

RS = "/runtime.v1.RuntimeService/"
MIX = (  # (method, weight): the kubelet's steady state, PLEG relists, status and stats
    ("ListPodSandbox", 1),
    ("ListContainers", 1),
    ("ContainerStatus", 4),
    ("ListContainerStats", 1),
)
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
TIMEOUT = 30.0
EVENTS_PER_CYCLE = 4  # created, started, stopped, deleted


# -- helpers ---------------------------------------------------------------------------------------
def percentile(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def request_for(method: str, container_ids: list[str], rng: random.Random) -> bytes:
    if method == "ContainerStatus":
        return pb.ContainerStatusRequest(container_id=rng.choice(container_ids)).SerializeToString()
    return b""


def mix_methods() -> list[str]:
    return [m for m, w in MIX for _ in range(w)]


# -- clients (child processes) ---------------------------------------------------------------------
def client_thread(
    target: str, container_ids: list[str], start_at: float, deadline: float, max_calls: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
    calls = {m: channel.unary_unary(RS + m) for m, _ in MIX}
    latencies: dict[str, list[float]] = {m: [] for m, _ in MIX}
    errors: Counter[str] = Counter()
    methods = mix_methods()
    time.sleep(max(0.0, start_at - time.time()))
    n = 0
    while n < max_calls and time.time() < deadline:
        method = rng.choice(methods)
        request = request_for(method, container_ids, rng)
        t0 = time.perf_counter()
        try:
            calls[method](request, timeout=TIMEOUT)
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            # a churned container removed between listing and status is the runtime's NOT_FOUND
            errors[f"{method} {code.name}"] += 1
        latencies[method].append(time.perf_counter() - t0)
        n += 1
    channel.close()
    return {"latencies": latencies, "errors": errors}


def client_process(
    target: str,
    container_ids: list[str],
    threads: int,
    start_at: float,
    deadline: float,
    max_calls: int,
    seed: int,
    out: Any,
) -> None:
    results: list[dict[str, Any]] = []

    def one(i: int) -> None:
        results.append(client_thread(target, container_ids, start_at, deadline, max_calls, seed * 100 + i))

    workers = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    out.put(results)


# -- watchers (a child process) --------------------------------------------------------------------
def watcher_process(target: str, watchers: int, channels: int, stop_at: float, out: Any) -> None:
    async def main() -> dict[str, Any]:
        chans = [grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) for _ in range(channels)]
        counts = [0] * watchers
        errors: Counter[str] = Counter()

        async def watch(i: int) -> None:
            call = chans[i % channels].unary_stream(RS + "GetContainerEvents")(b"")
            try:
                async for _ in call:
                    counts[i] += 1
            except grpc.aio.AioRpcError as exc:
                if exc.code() is not grpc.StatusCode.CANCELLED:
                    errors[exc.code().name] += 1

        tasks = [asyncio.ensure_future(watch(i)) for i in range(watchers)]
        await asyncio.sleep(max(0.0, stop_at - time.time()))
        ended_early = sum(t.done() for t in tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in chans:
            await c.close(None)
        return {"counts": counts, "errors": errors, "ended_early": ended_early}

    out.put(asyncio.run(main()))


# -- churn (a thread in the main process) ----------------------------------------------------------
class Churn:
    """Pod life cycles through the proxy at a fixed rate; each makes 4 container events."""

    def __init__(self, target: str, per_second: float) -> None:
        from cri_api.v1 import api_pb2_grpc

        self.channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        self.rt = api_pb2_grpc.RuntimeServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.period = 1.0 / per_second if per_second > 0 else 0.0
        self.cycles = 0
        self.calls = 0
        self.errors: Counter[str] = Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def cycle(self, i: int) -> None:
        uid = f"churn-{i}"
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=uid, uid=uid, namespace="default"),
            labels={"io.kubernetes.pod.uid": uid},
            linux=pb.LinuxPodSandboxConfig(cgroup_parent=f"/kubepods/burstable/pod{uid}"),
        )
        rt, t = self.rt, TIMEOUT
        sandbox = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=t).pod_sandbox_id
        cconfig = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="main"),
            image=pb.ImageSpec(image="localhost/busybox:latest"),
            linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(cpu_shares=256)),
        )
        cid = rt.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=sandbox, config=cconfig, sandbox_config=config),
            timeout=t,
        ).container_id
        rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=t)
        rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0), timeout=t)
        rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=t)
        rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sandbox), timeout=t)
        rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox), timeout=t)
        self.calls += 7

    def run(self) -> None:
        if not self.period:
            return
        next_at = time.perf_counter()
        while not self.stop.is_set():
            try:
                self.cycle(self.cycles)
                self.cycles += 1
            except grpc.RpcError as exc:
                self.errors[exc.code().name] += 1  # type: ignore[attr-defined]
            next_at += self.period
            self.stop.wait(max(0.0, next_at - time.perf_counter()))


# -- the interleaved sampler (a thread in the main process) ----------------------------------------
class Sampler:
    """The same mix, one call at a time, alternating direct and through the proxy."""

    def __init__(self, direct: str, proxy: str, container_ids: list[str], interval: float) -> None:
        self.channels = [grpc.insecure_channel(a, options=CHANNEL_OPTIONS) for a in (direct, proxy)]
        self.calls = [{m: ch.unary_unary(RS + m) for m, _ in MIX} for ch in self.channels]
        self.samples: tuple[list[float], list[float]] = ([], [])
        self.errors: Counter[str] = Counter()
        self.container_ids = container_ids
        self.interval = interval
        self.proxy_calls = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        rng = random.Random(1)
        methods = mix_methods()
        i = 0
        while not self.stop.is_set():
            method = rng.choice(methods)
            request = request_for(method, self.container_ids, rng)
            order = (0, 1) if i % 2 == 0 else (1, 0)
            for side in order:
                t0 = time.perf_counter()
                try:
                    self.calls[side][method](request, timeout=TIMEOUT)
                except grpc.RpcError as exc:
                    self.errors[f"{('direct', 'proxy')[side]} {method} {exc.code().name}"] += 1  # type: ignore[attr-defined]
                self.samples[side].append(time.perf_counter() - t0)
                self.proxy_calls += side
            i += 1
            self.stop.wait(self.interval)


# -- main ------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="load duration (default 60)")
    parser.add_argument("--max-calls", type=int, default=2_000_000, help="mix calls in all, at most")
    parser.add_argument("--processes", type=int, default=4, help="client processes (default 4)")
    parser.add_argument("--threads", type=int, default=4, help="client threads per process (default 4)")
    parser.add_argument("--watchers", type=int, default=50, help="GetContainerEvents streams (default 50)")
    parser.add_argument("--pods", type=int, default=250, help="seeded pods (default 250)")
    parser.add_argument("--containers-per-pod", type=int, default=2, help="seeded containers per pod")
    parser.add_argument("--churn", type=float, default=1.0, help="pod life cycles per second (default 1)")
    parser.add_argument("--sample-ms", type=float, default=20.0, help="sampler pause between pairs")
    parser.add_argument("--relay-mode", choices=("grpc", "frames"), default=None)
    parser.add_argument(
        "--baseline", action="store_true", help="clients, watchers and churn straight to the runtime"
    )
    args = parser.parse_args()
    clients = args.processes * args.threads

    work = Path(tempfile.mkdtemp(prefix="cri-load-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        fake, direct = start_fake_runtime(
            work,
            "--seed-pods",
            str(args.pods),
            "--seed-containers-per-pod",
            str(args.containers_per_pod),
            "--log-level",
            "WARNING",
        )
        procs.append(fake)
        relay_mode = ["--relay-mode", args.relay_mode] if args.relay_mode else []
        proxy, target = start_proxy(work, direct, "--log-level", "WARNING", *relay_mode)
        procs.append(proxy)
        with grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as ch:
            listed = pb.ListContainersResponse.FromString(
                ch.unary_unary(RS + "ListContainers")(b"", timeout=TIMEOUT)
            )
            for m, _ in MIX:  # warm-up
                ch.unary_unary(RS + m)(request_for(m, [listed.containers[0].id], random.Random()), timeout=60)
        container_ids = [c.id for c in listed.containers]
        time.sleep(2.0)  # let the proxy's first reconcile pass over the seeded containers finish
        print(
            f"fake runtime: {len(container_ids)} containers in {args.pods} pods; proxy pid {proxy.pid} "
            f"(relay mode {args.relay_mode or 'default'}); {clients} clients "
            f"({args.processes} processes x {args.threads} threads), {args.watchers} watchers, "
            f"churn {args.churn}/s, {args.seconds:.0f} s; python {sys.version.split()[0]}, "
            f"grpcio {grpc.__version__}, {os.cpu_count()} CPUs",
            flush=True,
        )
        print("mix: " + ", ".join(f"{m} x{w}" for m, w in MIX), flush=True)

        load_target = direct if args.baseline else target  # the sampler still compares both
        if args.baseline:
            print("BASELINE: the load goes straight to the runtime, not through the proxy", flush=True)
        ctx = mp.get_context("spawn")
        out: Any = ctx.Queue()
        at_start = proc_figures(proxy.pid)
        start_at = time.time() + 3.0  # client processes need a moment to start
        deadline = start_at + args.seconds
        watcher = ctx.Process(
            target=watcher_process, args=(load_target, args.watchers, 5, deadline + 3.0, out), daemon=True
        )
        watcher.start()
        per_thread = max(1, args.max_calls // clients)
        workers = [
            ctx.Process(
                target=client_process,
                args=(load_target, container_ids, args.threads, start_at, deadline, per_thread, p, out),
                daemon=True,
            )
            for p in range(args.processes)
        ]
        for w in workers:
            w.start()
        sampler = Sampler(direct, target, container_ids, args.sample_ms / 1000)
        churn = Churn(load_target, args.churn)
        time.sleep(max(0.0, start_at - time.time()))
        cpu0 = proc_figures(proxy.pid)["cpu_s"]
        began = time.perf_counter()
        sampler.thread.start()
        churn.thread.start()
        time.sleep(max(0.0, deadline - time.time()))
        sampler.stop.set()
        churn.stop.set()
        sampler.thread.join(60)
        churn.thread.join(60)
        for ch in [*sampler.channels, churn.channel]:  # every client connection closed before "at the end"
            ch.close()
        results: list[Any] = []
        for _ in workers:
            results.extend(out.get(timeout=120))
        elapsed = time.perf_counter() - began
        cpu1 = proc_figures(proxy.pid)["cpu_s"]
        watched = out.get(timeout=120)
        for w in [*workers, watcher]:
            w.join(30)
        at_end = proc_figures(proxy.pid)
        time.sleep(5.0)
        idle = proc_figures(proxy.pid)

        # -- figures ------------------------------------------------------------------------------
        latencies: dict[str, list[float]] = {m: [] for m, _ in MIX}
        errors: Counter[str] = Counter()
        for r in results:
            for m, xs in r["latencies"].items():
                latencies[m].extend(xs)
            errors.update(r["errors"])
        mix_calls = sum(len(xs) for xs in latencies.values())
        every = [x for xs in latencies.values() for x in xs]
        print(
            f"\n{'straight to the runtime' if args.baseline else 'through the proxy'}: "
            f"{mix_calls} mix calls in {elapsed:.1f} s"
            f" = {mix_calls / elapsed:.0f} calls/s"
        )
        print(f"  {'method':<20} {'calls':>7} {'p50 ms':>8} {'p99 ms':>8}")
        for m, xs in [*latencies.items(), ("all", every)]:
            print(
                f"  {m:<20} {len(xs):>7} {percentile(xs, 0.5) * 1e3:8.2f} {percentile(xs, 0.99) * 1e3:8.2f}"
            )
        d, p = sampler.samples
        print(
            f"sampler ({len(d)} pairs, interleaved, same mix): direct p50 {percentile(d, 0.5) * 1e3:.2f} ms "
            f"p99 {percentile(d, 0.99) * 1e3:.2f} | proxy p50 {percentile(p, 0.5) * 1e3:.2f} ms "
            f"p99 {percentile(p, 0.99) * 1e3:.2f} | overhead p50 "
            f"{(percentile(p, 0.5) - percentile(d, 0.5)) * 1e3:+.2f} ms "
            f"p99 {(percentile(p, 0.99) - percentile(d, 0.99)) * 1e3:+.2f} ms"
        )
        expected = churn.cycles * EVENTS_PER_CYCLE
        counts = watched["counts"]
        print(
            f"churn: {churn.cycles} pod life cycles ({churn.calls} calls); watchers: {len(counts)} streams, "
            f"events per stream min {min(counts)} max {max(counts)} (expected {expected}), "
            f"streams ended early {watched['ended_early']}"
        )
        all_errors = errors + sampler.errors + churn.errors + watched["errors"]
        print(f"errors: {sum(all_errors.values())}" + (f" {dict(all_errors)}" if all_errors else ""))
        total = mix_calls + sampler.proxy_calls + churn.calls
        cpu = cpu1 - cpu0
        print(
            f"proxy CPU: {cpu:.1f} s for {total} calls = {cpu / total * 1000:.2f} s per 1,000 calls "
            f"({cpu / elapsed * 100:.0f}% of one CPU)"
        )
        for label, fig in (("before the load", at_start), ("at the end", at_end), ("5 s later", idle)):
            print(f"proxy {label:<16} RSS {fig['rss_mib']:6.1f} MiB, open fds {fig['fds']:4.0f}")
    finally:
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
