#!/usr/bin/env python3
"""The frame relay's own CPU per tiny call: its sans-IO link core fed from memory, no sockets.

An h2 client and server (the `h2` library) make `--calls` unary Version calls through nothing but
bytes: each call's client bytes (request HEADERS + DATA, then the WINDOW_UPDATEs for the answer)
and runtime bytes (response HEADERS, DATA, trailers, WINDOW_UPDATEs) are recorded once, then fed to
a fresh LinkCore (`receive_from_client`/`take_runtime`, `receive_from_runtime`/`take_client`)
`--repeat` times; it prints the best and median CPU microseconds per call. What it leaves out is the
two Unix-socket hops and the event loop (bench/relay.py measures the whole proxy).

    .venv/bin/python bench/core.py                  # ~1 s
    .venv/bin/python bench/core.py --vary-timeout   # a new grpc-timeout value per call (grpc-go's way)
    .venv/bin/python bench/core.py --profile        # cProfile of one run, by own time

By default the core has an observer (as `serve` with metrics has) and decodes both directions.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import h2.config
import h2.connection

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cri_proxy.relay.core import Limits, LinkCore
from cri_proxy.relay.hooks import Hooks

VERSION = "/runtime.v1.RuntimeService/Version"
CREATE = "/runtime.v1.RuntimeService/CreateContainer"
Call = tuple[bytes, bytes]  # (the client's bytes, the runtime's bytes) of one call


def conversation(calls: int, vary_timeout: bool) -> tuple[Call, list[Call]]:
    """(the connection's opening bytes, then each call's), as an h2 client and server write them."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    client.initiate_connection()
    server.initiate_connection()
    c_open = client.data_to_send()
    server.receive_data(c_open)
    r_open = server.data_to_send()
    client.receive_data(r_open)
    c_ack = client.data_to_send()
    server.receive_data(c_ack)
    opening = (c_open + c_ack, r_open + server.data_to_send())
    out: list[Call] = []
    for i in range(calls):
        sid = client.get_next_available_stream_id()
        timeout = f"{1_999_000 - i}u" if vary_timeout else "2S"
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", VERSION),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("user-agent", "grpc-go/1.59.0"),
            ("grpc-timeout", timeout),
        ]
        client.send_headers(sid, headers)
        client.send_data(sid, b"\0\0\0\0\4\n\2v1", end_stream=True)
        request = client.data_to_send()
        server.receive_data(request)
        server.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
        server.send_data(sid, b"\0\0\0\0\x20" + b"x" * 32)
        server.send_headers(sid, [("grpc-status", "0"), ("grpc-message", "")], end_stream=True)
        response = server.data_to_send()
        client.receive_data(response)
        client.increment_flow_control_window(37)
        server.increment_flow_control_window(9)
        c_more, r_more = client.data_to_send(), server.data_to_send()
        server.receive_data(c_more)
        client.receive_data(r_more)
        out.append((request + c_more, response + r_more))
    return opening, out


def new_core(opening: Call, observe: bool) -> LinkCore:
    """A core past the connection's opening, hooking CreateContainer as `serve` does."""

    async def post(*_: object) -> None:
        return None

    measured: list[tuple[str, int, float, float]] = []

    def observer(path: str, code: int, total: float, upstream: float) -> None:
        measured.append((path, code, total, upstream))
        if len(measured) > 1000:
            measured.clear()

    core = LinkCore(
        lambda path: Hooks(post=post) if path == CREATE else None,
        Limits(),
        observer=observer if observe else None,
        decode_runtime=True,
    )
    core.receive_from_client(opening[0], 1.0)
    core.take_runtime()
    core.receive_from_runtime(opening[1], 1.0)
    core.take_client()
    return core


def run(core: LinkCore, calls: list[Call]) -> float:
    """CPU seconds of this process to relay every call once (CPU, not wall time: the figure holds
    on a busy machine, where the process waits for a core now and then)."""
    now = 1.0
    began = time.process_time()
    for request, response in calls:
        core.receive_from_client(request, now)
        core.take_runtime()
        core.receive_from_runtime(response, now + 0.0004)
        core.take_client()
    return time.process_time() - began


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000, help="calls per run (default 2000)")
    ap.add_argument("--repeat", type=int, default=15, help="runs, each on a fresh core (default 15)")
    ap.add_argument("--vary-timeout", action="store_true", help="a new grpc-timeout value per call")
    ap.add_argument("--no-observer", action="store_true", help="no metrics observer on the core")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one run instead")
    args = ap.parse_args()
    opening, calls = conversation(args.calls, args.vary_timeout)
    observe = not args.no_observer
    if args.profile:
        core = new_core(opening, observe)
        profile = cProfile.Profile()
        profile.runcall(run, core, calls)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    per_call = []
    for _ in range(args.repeat):
        per_call.append(run(new_core(opening, observe), calls) / len(calls) * 1e6)
    print(
        f"link core, {len(calls)} Version calls x{args.repeat}"
        f" ({'varying' if args.vary_timeout else 'fixed'} grpc-timeout,"
        f" {'with' if observe else 'no'} observer):"
        f" best {min(per_call):.1f} µs/call, median {statistics.median(per_call):.1f} µs/call",
        flush=True,
    )


if __name__ == "__main__":
    main()
