#!/usr/bin/env python3
"""What the periodic merge costs: one listing of the runtime merged into the node state.

The fake runtime (in-process, over a Unix socket) holds N pods x 5 running containers. Timed in
the same run: the two bare lists (ListContainers + ListPodSandbox, strict protobuf, the floor);
the periodic merge of a known node (the same two lists read leniently + the merge); the full
recovery of an unknown node (plus a status of every sandbox and container). Median of 7 each;
prints milliseconds and the ratios to the bare lists.

    .venv/bin/python bench/sync.py            # N = 100 and 500
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc.aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from cri_proxy.enforce.sync import Syncer
from cri_proxy.fake_runtime.server import FakeOptions, FakeRuntime
from cri_proxy.state.model import NodeState

REPEAT = 7


async def median_ms(job: Callable[[], Awaitable[object]]) -> float:
    times = []
    for _ in range(REPEAT):
        began = time.perf_counter()
        await job()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


async def one(pods: int) -> None:
    with tempfile.TemporaryDirectory(prefix="cri-proxy-bench-sync-") as tmp:
        endpoint = f"unix://{tmp}/runtime.sock"
        fake = FakeRuntime(FakeOptions(listen=endpoint, seed_pods=pods, seed_containers_per_pod=5))
        await fake.start()
        try:
            async with grpc.aio.insecure_channel(endpoint) as channel:
                stub = v1_grpc.RuntimeServiceStub(channel)  # type: ignore[no-untyped-call]

                async def bare() -> None:
                    await stub.ListContainers(v1.ListContainersRequest())
                    await stub.ListPodSandbox(v1.ListPodSandboxRequest())

                known = NodeState()
                await Syncer(known, channel).sync(full=True)

                async def periodic() -> None:
                    await Syncer(known, channel).sync(full=False)

                async def full() -> None:
                    await Syncer(NodeState(), channel).sync(full=True)

                floor = await median_ms(bare)
                cheap = await median_ms(periodic)
                whole = await median_ms(full)
        finally:
            await fake.stop(0)
    n = pods * 5
    print(
        f"{pods:4d} pods, {n:4d} containers: bare lists {floor:7.1f} ms; periodic merge {cheap:7.1f} ms "
        f"({cheap / floor:.1f}x); full recovery {whole:7.1f} ms ({whole / floor:.1f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, nargs="*", default=[100, 500])
    args = parser.parse_args()
    from loguru import logger

    logger.remove()
    for pods in args.pods:
        asyncio.run(one(pods))


if __name__ == "__main__":
    main()
