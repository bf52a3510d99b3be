#!/usr/bin/env python3
"""A byte pipe: a Unix socket whose connections are copied to and from the runtime's, unread.

The floor of any relay on this machine: what two more socket hops and one more process's
wake-ups cost, with no HTTP/2 or protobuf work at all (asyncio on uvloop, as `cri-proxy serve`).
`bench/relay.py --floor` times the hooked-create rows through it, so that a row's added p50 can be
read as this floor plus the proxy's own work.

    .venv/bin/python bench/pipe.py --listen /tmp/pipe.sock --to /run/containerd/containerd.sock
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import uvloop
from stamps.stamprec import Recorder


class _Half(asyncio.Protocol):
    """One side of a piped connection: what it reads is written to the other side."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Half | None = None
        self.early: list[bytes] = []  # read before the other side was connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.peer is not None and self.peer.early:  # what the other side read meanwhile, first
            self.transport.writelines(self.peer.early)
            self.peer.early = []

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.early.append(data)
        elif not peer.transport.is_closing():  # else the other side hung up: nobody to give it to
            peer.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None and not self.peer.transport.is_closing():
            self.peer.transport.close()


class _Client(_Half):
    """A client's connection: dials the runtime when it comes."""

    def __init__(self, to: str) -> None:
        super().__init__()
        self.to = to
        self.dialing: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.dialing = asyncio.ensure_future(self._dial())

    async def _dial(self) -> None:
        runtime = _Half()
        runtime.peer, self.peer = self, runtime
        try:
            await asyncio.get_running_loop().create_unix_connection(lambda: runtime, self.to)
        except OSError:
            if self.transport is not None:
                self.transport.close()


async def serve(listen: str, to: str) -> None:
    if os.path.exists(listen):
        os.unlink(listen)
    server = await asyncio.get_running_loop().create_unix_server(lambda: _Client(to), listen)
    async with server:
        await server.serve_forever()


def _stamp(rec: Recorder) -> None:
    """Every read stamped, and its write right before it, as the proxy's are (`--stamps`, for
    bench/create_path.py). Without `--stamps` the pipe's path is not touched."""

    def stamped(self: _Half, data: bytes) -> None:  # `_Half.data_received`, stamped
        t0 = time.perf_counter_ns()
        client = isinstance(self, _Client)
        peer = self.peer
        if peer is None or peer.transport is None:
            self.early.append(data)
        elif not peer.transport.is_closing():
            rec.wrote("wr" if client else "wc", time.perf_counter_ns())
            peer.transport.write(data)
        rec.read("c" if client else "r", len(data), t0, time.perf_counter_ns())

    _Half.data_received = stamped  # type: ignore[method-assign]


def start(
    work: Path, runtime_address: str, stamps: Path | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """This pipe in front of `runtime_address` (unix://), on work/pipe.sock: (process, endpoint)."""
    from common import wait_socket

    sock = work / "pipe.sock"
    to = runtime_address.removeprefix("unix://")
    more = ["--stamps", str(stamps)] if stamps is not None else []
    proc = subprocess.Popen([sys.executable, __file__, "--listen", str(sock), "--to", to, *more])
    wait_socket(sock, proc)
    return proc, f"unix://{sock}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--listen", required=True, help="the Unix socket to serve")
    parser.add_argument("--to", required=True, help="the runtime's Unix socket")
    parser.add_argument(
        "--stamps", help="stamp every read and write into this JSON file (bench/create_path.py)"
    )
    args = parser.parse_args()
    if args.stamps:
        _stamp(Recorder(args.stamps))
    uvloop.run(serve(args.listen, args.to))


if __name__ == "__main__":
    main()
