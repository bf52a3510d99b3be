#!/usr/bin/env python3
"""Where a create's added time goes: the client's times and the relay's own stamps, on one clock.

A private containerd, `cri-proxy serve` with its reads and writes stamped (`bench/stamps/`: a
`sitecustomize` that wraps the transport adapter's reads and the core's `take_*`, only in this
bench's proxy) and the byte pipe stamped the same way (`bench/pipe.py --stamps`). For each relay,
`--rounds` creates direct and through it, interleaved (d,r | r,d), each in one pod of its own
path's; `--started`: each container started after its create, as a kubelet starts a container
before it creates the next. Per relayed create, p50 in µs:

    in       the client's call to the relay's read of the request
    request  that read to the request taken for the runtime's socket
    runtime  that to the relay's read that ends the answer
    answer   that read to the answer taken for the client's socket
    out      that to the client's return
    busy     how long the relay's read that wrote the answer went on after it (the answer's
             frames read, the hooks after the call): "late" is the share of creates whose client
             returned after that

and with `--started`, per relayed start, "start's request": its first read to its request taken
for the runtime's socket (where work put off from the create would show).

    .venv/bin/python bench/create_path.py --started --runtime-root /dev/shm   # ~2 minutes, root
    .venv/bin/python bench/create_path.py --started --proxy-cli /tmp/v313/bin/cri-proxy  # another Python

The relays are measured one after the other, not interleaved with each other: compare each with
its own direct creates. `docs/performance.md` (thirty-first and thirty-second rounds) has its figures.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import pipe
from common import ROOT, add_proxy_cli, runtime, start_proxy, stop_all

sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from kube import container_config, pod_sandbox_config

from cri_api.v1 import api_pb2 as pb

Row = tuple[str, int, int, int]  # (side: c, r, wr, wc; ns in; ns out; bytes)
REQUEST = 900  # bytes: a create's request is the only client read this big here


def creates(direct: str, relay: str, rounds: int, started: bool, label: str) -> list[tuple[str, int, int]]:
    """Interleaved creates direct ("d") and through the relay ("r"): (path, ns called, ns returned);
    and `started`, each create's start ("ds", "rs")."""
    paths = {"d": grpc.insecure_channel(direct), "r": grpc.insecure_channel(relay)}
    call = {
        (k, m): ch.unary_unary(f"/runtime.v1.RuntimeService/{m}")
        for k, ch in paths.items()
        for m in ("RunPodSandbox", "CreateContainer", "StartContainer")
    }
    pods: dict[str, tuple[str, Any]] = {}
    for k in paths:
        config = pod_sandbox_config(pb, f"bench-path-{label}-{k}", qos="besteffort", labels={"bench": "path"})
        request = pb.RunPodSandboxRequest(config=config).SerializeToString()
        reply = call[(k, "RunPodSandbox")](request, timeout=60)
        pods[k] = (pb.RunPodSandboxResponse.FromString(reply).pod_sandbox_id, config)
    cpus = Path("/sys/devices/system/cpu/online").read_text().strip()
    out = []
    for i in range(rounds):
        for k in ("d", "r") if i % 2 == 0 else ("r", "d"):
            pod_id, config = pods[k]
            cfg = container_config(pb, config, f"c{k}{i}")
            cfg.linux.resources.cpuset_cpus = cpus  # what the proxy sets: the same work on each path
            body = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=cfg, sandbox_config=config)
            raw = body.SerializeToString()
            t0 = time.perf_counter_ns()
            reply = call[(k, "CreateContainer")](raw, timeout=60)
            out.append((k, t0, time.perf_counter_ns()))
            if started:
                cid = pb.CreateContainerResponse.FromString(reply).container_id
                start = pb.StartContainerRequest(container_id=cid).SerializeToString()
                t0 = time.perf_counter_ns()
                call[(k, "StartContainer")](start, timeout=60)
                out.append((k + "s", t0, time.perf_counter_ns()))
    for ch in paths.values():
        ch.close()
    return out


def read_stamps(path: Path, deadline: float = 15.0) -> list[Row]:
    """The relay's stamps once its recorder has written them all: the same count in two reads
    further apart than its writes (every 2 s), or what was read by `deadline` seconds."""
    end = time.monotonic() + deadline
    rows: list[Row] = []
    while time.monotonic() < end:
        time.sleep(2.5)
        with contextlib.suppress(OSError, json.JSONDecodeError):  # not there yet, or caught mid-write
            now = [tuple(r) for r in json.loads(path.read_text())]
            if rows and len(now) == len(rows):
                break
            rows = now
    return sorted(rows, key=lambda r: r[1])


def _request(
    rows: list[Row], starts: list[int], t0: int, t1: int, size: int
) -> tuple[list[Row], Row, Row] | None:
    """The relay's stamps within a call made at `t0` that returned at `t1`, its request's read (the
    first client read of `size` bytes or more) and that request's write to the runtime (the relay's
    next); None when either is not there."""
    window = rows[bisect.bisect_left(starts, t0) : bisect.bisect_left(starts, t1)]
    read = next((r for r in window if r[0] == "c" and r[3] >= size), None)
    if read is None:
        return None
    sent = next((r for r in window if r[0] == "wr" and r[1] >= read[1]), None)
    return None if sent is None else (window, read, sent)


def report(name: str, calls: list[tuple[str, int, int]], rows: list[Row]) -> None:
    starts = [r[1] for r in rows]
    parts: dict[str, list[int]] = {k: [] for k in ("in", "request", "runtime", "answer", "out", "busy")}
    late = total = 0
    for k, t0, t1 in calls:
        if k != "r":
            continue
        found = _request(rows, starts, t0, t1, REQUEST)
        if found is None:
            continue
        window, read, sent = found
        answered = [r[1] for r in window if r[0] == "wc" and r[1] > sent[1]]
        if not answered:
            continue
        wc = answered[-1]
        reads = [r for r in window if r[0] == "r" and sent[1] < r[1] <= wc]
        if not reads:
            continue
        last = reads[-1]
        parts["in"].append(read[1] - t0)
        parts["request"].append(sent[1] - read[1])
        parts["runtime"].append(last[1] - sent[1])
        parts["answer"].append(wc - last[1])
        parts["out"].append(t1 - wc)
        parts["busy"].append(last[2] - wc)
        total += 1
        late += t1 > last[2]
    # a start's request: its first client read to the relay's next write to the runtime
    start_requests = []
    for k, t0, t1 in calls:
        found = _request(rows, starts, t0, t1, 0) if k == "rs" else None
        if found is not None:
            start_requests.append(found[2][1] - found[1][1])
    if start_requests:
        parts["start's request"] = start_requests
    d = [t1 - t0 for k, t0, t1 in calls if k == "d"]
    r = [t1 - t0 for k, t0, t1 in calls if k == "r"]
    added = (statistics.median(r) - statistics.median(d)) / 1e3
    figures = " | ".join(f"{k} {statistics.median(v) / 1e3:.0f}" for k, v in parts.items() if v)
    print(
        f"{name}: {total} of {len(r)} creates stamped | direct p50 {statistics.median(d) / 1e3:.0f} µs,"
        f" added {added:.0f} µs | p50 µs: {figures} | late {late / max(total, 1):.0%}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=150, help="creates per path and relay (default 150)")
    parser.add_argument("--started", action="store_true", help="start each container after its create")
    parser.add_argument("--runtime-root", help="containerd's root directory (e.g. /dev/shm)")
    add_proxy_cli(parser)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("create_path.py needs root: it runs a private containerd")
    work = Path(tempfile.mkdtemp(prefix="cri-bench-path-"))
    procs = []
    shape = "started" if args.started else "created"
    with runtime("containerd", work, args.runtime_root) as address:
        config = work / "proxy.toml"
        config.write_text("reconcile_period_seconds = 0\n")
        stamped = {"proxy": work / "proxy-stamps.json", "pipe": work / "pipe-stamps.json"}
        os.environ["CRI_BENCH_STAMPS"] = str(stamped["proxy"])
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "bench" / "stamps"), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        try:
            proxy, proxy_address = start_proxy(
                work, address, "--config", str(config), log=work / "proxy.log", cli=args.proxy_cli
            )
        finally:
            del os.environ["CRI_BENCH_STAMPS"]
        procs.append(proxy)
        piped, pipe_address = pipe.start(work, address, stamps=stamped["pipe"])
        procs.append(piped)
        try:
            for name, relay in (("proxy", proxy_address), ("pipe", pipe_address)):
                calls = creates(address, relay, args.rounds, args.started, name)
                report(f"{name} ({shape})", calls, read_stamps(stamped[name]))
        finally:
            stop_all(procs)


if __name__ == "__main__":
    main()
