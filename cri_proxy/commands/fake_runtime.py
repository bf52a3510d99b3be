"""`cri-proxy fake-runtime`: an in-memory CRI runtime for tests, benchmarks and the demo."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "fake-runtime",
        help="run an in-memory CRI runtime (tests, benchmarks, demo)",
        description="An in-memory CRI runtime: keeps pods and containers, records resource updates, "
        "streams container events. Starts no processes.",
    )
    p.add_argument("--listen", default="unix:///run/cri-proxy/fake-runtime.sock", help="endpoint to serve on")
    p.add_argument("--latency-ms", type=float, default=0.0, help="delay added to every call")
    p.add_argument(
        "--update-latency-ms",
        type=float,
        default=0.0,
        help="extra delay for UpdateContainerResources (real runtimes: 20-30 ms)",
    )
    p.add_argument("--seed-pods", type=int, default=0, help="pods to create at start")
    p.add_argument("--seed-containers-per-pod", type=int, default=1, help="running containers per seeded pod")
    p.add_argument("--seed-label-bytes", type=int, default=0, help="padding label size on seeded containers")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cri_proxy.commands.serve import asyncio_run
    from cri_proxy.errors import CriProxyError
    from cri_proxy.fake_runtime.server import FakeOptions
    from cri_proxy.fake_runtime.server import run as run_fake
    from cri_proxy.logs import drain_log, setup_logging

    setup_logging(args.log_level)
    opts = FakeOptions(
        listen=args.listen,
        latency=args.latency_ms / 1000,
        update_latency=args.update_latency_ms / 1000,
        seed_pods=args.seed_pods,
        seed_containers_per_pod=args.seed_containers_per_pod,
        seed_label_bytes=args.seed_label_bytes,
    )
    try:
        try:
            asyncio_run(run_fake(opts))
        finally:
            drain_log()  # the lines held, before any of ours
    except CriProxyError as exc:
        print(f"cri-proxy fake-runtime: {exc}")
        return 1
    return 0
