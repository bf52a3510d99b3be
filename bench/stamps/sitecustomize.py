"""Put on PYTHONPATH by `bench/create_path.py` for the `cri-proxy serve` it starts: with
CRI_BENCH_STAMPS set, the frame relay's reads (the transport adapter's `data_received` and
`runtime_data`) and the moments its bytes are taken for a socket (the core's `take_runtime` and
`take_client`, right before the write) are stamped by `stamprec.Recorder`. Nothing else changes."""

import os
import sys
import time


def _install(path: str) -> None:
    from stamprec import Recorder

    from cri_proxy.relay import core, transport

    rec = Recorder(path)
    ns = time.perf_counter_ns
    link, link_core = transport.Link, core.LinkCore
    client_data, runtime_data = link.data_received, link.runtime_data
    take_runtime, take_client = link_core.take_runtime, link_core.take_client

    def data_received(self, data):  # type: ignore[no-untyped-def]
        t0 = ns()
        try:
            return client_data(self, data)
        finally:
            rec.read("c", len(data), t0, ns())

    def runtime_read(self, data):  # type: ignore[no-untyped-def]
        t0 = ns()
        try:
            return runtime_data(self, data)
        finally:
            rec.read("r", len(data), t0, ns())

    def to_runtime(self):  # type: ignore[no-untyped-def]
        out = take_runtime(self)
        if out:
            rec.wrote("wr", ns())
        return out

    def to_client(self):  # type: ignore[no-untyped-def]
        out = take_client(self)
        if out:
            rec.wrote("wc", ns())
        return out

    link.data_received = data_received
    link.runtime_data = runtime_read
    link_core.take_runtime = to_runtime
    link_core.take_client = to_client


if "serve" in sys.argv and os.environ.get("CRI_BENCH_STAMPS"):
    _install(os.environ["CRI_BENCH_STAMPS"])
