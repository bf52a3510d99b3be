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

    def reads(fn, side):  # type: ignore[no-untyped-def]
        def stamped(self, data):  # type: ignore[no-untyped-def]
            t0 = ns()
            try:
                return fn(self, data)
            finally:
                rec.read(side, len(data), t0, ns())

        return stamped

    def takes(fn, side):  # type: ignore[no-untyped-def]
        def stamped(self):  # type: ignore[no-untyped-def]
            out = fn(self)
            if out:
                rec.wrote(side, ns())
            return out

        return stamped

    link.data_received = reads(link.data_received, "c")
    link.runtime_data = reads(link.runtime_data, "r")
    link_core.take_runtime = takes(link_core.take_runtime, "wr")
    link_core.take_client = takes(link_core.take_client, "wc")


if "serve" in sys.argv and os.environ.get("CRI_BENCH_STAMPS"):
    _install(os.environ["CRI_BENCH_STAMPS"])
