#!/usr/bin/env python3
"""The frame relay's own CPU per tiny call: its sans-IO link core fed from memory, no sockets.

An h2 client and server (the `h2` library) make `--calls` unary Version calls through nothing but
bytes: each call's client bytes (request HEADERS + DATA; then, in a read of their own, the
WINDOW_UPDATEs for the answer and any PING's ACK) and runtime bytes (response HEADERS, DATA,
trailers, WINDOW_UPDATEs) are recorded once, then fed to a fresh LinkCore `--repeat` times in the
adapter's turns (`receive_from_client`/`take_runtime`; `receive_from_runtime` with `answers_later`,
`take_client`, `read_answers`); it prints the best and median CPU microseconds per call. What it
leaves out is the two Unix-socket hops and the event loop (bench/relay.py measures the whole proxy).

    .venv/bin/python bench/core.py                  # ~1 s
    .venv/bin/python bench/core.py --vary-timeout   # a new grpc-timeout value per call (grpc-go's way)
    .venv/bin/python bench/core.py --probe          # answers as containerd (grpc-go) writes them
    .venv/bin/python bench/core.py --profile        # cProfile of one run, by own time
    .venv/bin/python bench/core.py --against /tmp/main   # before/after: another checkout's core too
    .venv/bin/python bench/core.py --create --cold 16    # a hooked create, caches cold: wall µs

With `--against DIR` (e.g. `git worktree add /tmp/main main`) the core of that checkout is measured
as well, in a child process, in turns with this one (`--rounds`), and the ratio of the two best
figures is printed: this checkout / DIR. By default the core has an observer (as `serve` with
metrics has) and decodes both directions.

`--create` relays CreateContainer calls instead (a kubelet-sized request, ~1 KB), hooked with a
ready hook that appends a cpuset (`Hooks.ready`, as `EnforceHooks.ready_create` answers: the usual
create's path without the enforcement's own work). `--cold MB` writes that much memory before each
call, as the runtime and the client do between two calls on a node, and times each read on its
own: the wall µs from a create's read to its request queued for the runtime, and from the answer's
read to it queued for the client, and then the answer's reading after its write (`read_answers`:
its frames followed, its header blocks decoded, the hook after the call asked for), right after
(the median of the runs' medians; for each checkout with --against).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import h2.config
import h2.connection

if TYPE_CHECKING:
    from cri_proxy.relay.core import LinkCore

ROOT = Path(__file__).resolve().parents[1]
VERSION = "/runtime.v1.RuntimeService/Version"
CREATE = "/runtime.v1.RuntimeService/CreateContainer"
Call = tuple[bytes, bytes, bytes]  # one call's request read, answer read and the client's read after it


def create_request() -> bytes:
    """A CreateContainer request of a kubelet's size: ids, metadata, labels, annotations, mounts."""
    from cri_api.v1 import api_pb2 as pb

    config = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="app", attempt=0),
        image=pb.ImageSpec(image="registry.example/app:1.0"),
        labels={"io.kubernetes.pod.name": "web-0", "io.kubernetes.pod.namespace": "default"},
        annotations={f"io.kubernetes.container.k{i}": "v" * 40 for i in range(8)},
        mounts=[
            pb.Mount(container_path=f"/m{i}", host_path=f"/var/lib/kubelet/pods/x/m{i}") for i in range(4)
        ],
    )
    return pb.CreateContainerRequest(pod_sandbox_id="a" * 64, config=config).SerializeToString()


def conversation(
    calls: int, vary_timeout: bool, create: bool = False, probe: bool = False
) -> tuple[tuple[bytes, bytes], list[Call]]:
    """(the connection's opening bytes, then each call's), as an h2 client and server write them.
    `probe`: the server answers a Version call as grpc-go does, its connection WINDOW_UPDATE and a
    PING (its probe on the request's DATA) ahead of the answer, in the answer's read."""
    body = create_request() if create else b"\n\2v1"
    message = len(body).to_bytes(5, "big") + body
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
            (":path", CREATE if create else VERSION),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("user-agent", "grpc-go/1.59.0"),
            ("grpc-timeout", timeout),
        ]
        client.send_headers(sid, headers)
        client.send_data(sid, message, end_stream=True)
        request = client.data_to_send()
        server.receive_data(request)
        early = b""
        if create:  # as grpc-go does: the connection's window given back as the request is read
            server.increment_flow_control_window(len(message) + 64)  # and the hook's patch
            early = server.data_to_send()
            client.receive_data(early)
        elif probe:
            server.increment_flow_control_window(len(message))
            server.ping(i.to_bytes(8, "big"))
            early = server.data_to_send()
            client.receive_data(early)  # its ACK goes in the client's read after the answer
        server.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
        server.send_data(sid, b"\0\0\0\0\x20" + b"x" * 32)
        server.send_headers(sid, [("grpc-status", "0"), ("grpc-message", "")], end_stream=True)
        response = server.data_to_send()
        client.receive_data(response)
        client.increment_flow_control_window(37)
        if not create and not probe:
            server.increment_flow_control_window(9)
        c_more, r_more = client.data_to_send(), server.data_to_send()
        server.receive_data(c_more)
        client.receive_data(r_more)
        out.append((request, early + response + r_more, c_more))
    return opening, out


def new_core(opening: tuple[bytes, bytes], observe: bool) -> LinkCore:
    """A core past the connection's opening, hooking CreateContainer as `serve` does (its ready
    hook answering every create with a cpuset patch)."""
    from cri_api.v1 import api_pb2 as pb
    from cri_proxy.relay.core import Limits, LinkCore
    from cri_proxy.relay.hooks import Hooks, Ready

    async def post(*_: object) -> None:
        return None

    patch = pb.CreateContainerRequest(
        config=pb.ContainerConfig(
            linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(cpuset_cpus="0-1"))
        )
    ).SerializeToString()
    ready = Ready(patch, lambda sent: None)
    hooks = Hooks(post=post, ready=lambda message, info: ready)

    measured: list[tuple[str, int, float, float]] = []

    def observer(path: str, code: int, total: float, upstream: float) -> None:
        measured.append((path, code, total, upstream))
        if len(measured) > 1000:
            measured.clear()

    core = LinkCore(
        lambda path: hooks if path == CREATE else None,
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
    on a busy machine, where the process waits for a core now and then), in the adapter's turns:
    the request read; the answer read, passed on before it is read (`answers_later`); the client's
    read after it (its ACKs and credit, held for the next request's write)."""
    now = 1.0
    began = time.process_time()
    for request, response, after in calls:
        core.receive_from_client(request, now)
        core.take_runtime()
        core.receive_from_runtime(response, now + 0.0004, answers_later=True)
        core.take_client()
        core.read_answers()
        if core.events:  # the hooks' events (a ready create's), which the adapter takes
            core.take_events()
        if after:
            core.receive_from_client(after, now + 0.0005)
            if core.out_r:
                core.take_runtime()
    return time.process_time() - began


def run_cold(core: LinkCore, calls: list[Call], megabytes: int) -> tuple[float, float, float]:
    """Median wall µs of each call's request read, answer read and the answer's reading after its
    write (`read_answers`: its frames followed, its header blocks decoded, the hook after it asked
    for), `megabytes` of memory written before each of the first two (the core's code and data out
    of the CPU's caches, as between two calls on a node; the third follows the second at once)."""
    junk = bytearray(megabytes << 20)
    lines = len(range(0, len(junk), 64))
    ones, twos = b"\1" * lines, b"\2" * lines  # a byte in every cache line of `junk`
    clock = time.perf_counter
    requests: list[float] = []
    answers: list[float] = []
    reading: list[float] = []
    now = 1.0
    for request, response, after in calls:
        junk[::64] = ones
        began = clock()
        core.receive_from_client(request, now)
        core.take_runtime()
        requests.append(clock() - began)
        at = 0  # the runtime's WINDOW_UPDATEs first: a read of their own, before the answer's
        while at < len(response) and response[at + 3] == 8:
            at += 9 + int.from_bytes(response[at : at + 3], "big")
        core.receive_from_runtime(response[:at], now + 0.0002)
        core.take_client()
        junk[::64] = twos
        began = clock()
        core.receive_from_runtime(response[at:], now + 0.0004, answers_later=True)
        core.take_client()
        answers.append(clock() - began)
        began = clock()
        core.read_answers()
        core.take_events()
        reading.append(clock() - began)
        core.receive_from_client(after, now + 0.0005)
        core.take_runtime()
    return tuple(statistics.median(x) * 1e6 for x in (requests, answers, reading))  # type: ignore[return-value]


def measure(args: argparse.Namespace) -> list[float]:
    """CPU µs per call of each of `--repeat` runs, each on a fresh core; with --cold, the request
    read's wall µs (median of the run), the answer read's and the answer's reading after its write,
    for each run."""
    opening, calls = conversation(args.calls, args.vary_timeout, args.create, args.probe)
    if args.cold:
        runs = (
            run_cold(new_core(opening, not args.no_observer), calls, args.cold) for _ in range(args.repeat)
        )
        return [x for three in runs for x in three]  # request, answer, after, request, ...
    return [
        run(new_core(opening, not args.no_observer), calls) / len(calls) * 1e6 for _ in range(args.repeat)
    ]


def measure_in(root: Path, args: argparse.Namespace) -> list[float]:
    """The same runs with the core of the checkout at `root`, in a child process."""
    argv = [sys.executable, __file__, "--root", str(root), "--figures"]
    argv += ["--calls", str(args.calls), "--repeat", str(args.repeat)]
    argv += ["--vary-timeout"] * args.vary_timeout + ["--no-observer"] * args.no_observer
    argv += ["--create"] * args.create + ["--probe"] * args.probe + ["--cold", str(args.cold)]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return [float(line) for line in out.split()]


def summary(figures: list[float], cold: bool) -> str:
    """Runs' figures as printed: with --cold the request's, the answer's and the answer's after
    its write (`read_answers`) wall µs, else CPU µs per call."""
    if cold:
        request, answer, after = (statistics.median(figures[i::3]) for i in range(3))
        return f"request {request:.1f} µs, answer {answer:.1f} µs, after its write {after:.1f} µs"
    return f"best {min(figures):.1f} µs, median {statistics.median(figures):.1f} µs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000, help="calls per run (default 2000)")
    ap.add_argument("--repeat", type=int, help="runs, each on a fresh core (default 15; 5 with --cold)")
    ap.add_argument("--vary-timeout", action="store_true", help="a new grpc-timeout value per call")
    ap.add_argument("--no-observer", action="store_true", help="no metrics observer on the core")
    ap.add_argument("--create", action="store_true", help="hooked CreateContainer calls (a ready hook)")
    ap.add_argument(
        "--probe", action="store_true", help="grpc-go's WINDOW_UPDATE and PING ahead of an answer"
    )
    ap.add_argument("--cold", type=int, default=0, help="MB of memory written before each call: wall µs")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one run instead")
    ap.add_argument("--against", type=Path, help="another checkout whose core is measured in turns")
    ap.add_argument("--rounds", type=int, default=3, help="turns of each with --against (default 3)")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose core is measured")
    ap.add_argument("--figures", action="store_true", help="print each run's figure only")
    args = ap.parse_args()
    sys.path.insert(0, str(args.root.resolve()))
    if args.profile:
        opening, calls = conversation(args.calls, args.vary_timeout, probe=args.probe)
        core = new_core(opening, not args.no_observer)
        profile = cProfile.Profile()
        profile.runcall(run, core, calls)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    if args.repeat is None:
        args.repeat = 5 if args.cold else 15  # with --cold each call writes MBs first: seconds a run
    if args.figures:
        print("\n".join(f"{x:.3f}" for x in measure(args)))
        return
    here: list[float] = []
    there: list[float] = []
    for _ in range(args.rounds if args.against else 1):
        here += measure(args)
        if args.against:
            there += measure_in(args.against, args)
    shape = (
        f"{'varying' if args.vary_timeout else 'fixed'} grpc-timeout,"
        f" {'with' if not args.no_observer else 'no'} observer{', probed' if args.probe else ''}"
    )
    what = "hooked CreateContainer (ready)" if args.create else "Version"
    line = f"link core, {args.calls} {what} calls x{len(here) // 3 if args.cold else len(here)} ({shape})"
    if args.cold:
        line += f", {args.cold} MB written before each read (wall, median of the runs' medians): "
    else:
        line += ": CPU per call "
    line += summary(here, args.cold)
    if args.against:
        line += f" | {args.against}: {summary(there, args.cold)}"
        if not args.cold:
            line += f" | ratio (best) {min(here) / min(there):.2f}"
    print(line, flush=True)


if __name__ == "__main__":
    main()
