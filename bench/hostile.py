"""RSS of the proxy (frames mode) and of containerd under hostile raw HTTP/2 clients, same run.

Usage (root, a private containerd around it):
    .venv/bin/python bench/with_containerd.py .venv/bin/python bench/hostile.py [--seconds 4] [--only NAME]
        [--proxy-cli OTHER-VENV/bin/cri-proxy]

Each client is bounded in time and bytes and talks to a unix socket only. For each client and target it
prints the target's RSS before (baseline), the peak while the client runs, and 3 s after it has left.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from common import add_proxy_cli, rss_kib, start_proxy
from hpack import Encoder
from hyperframe.frame import ContinuationFrame, DataFrame, HeadersFrame, SettingsFrame

from tests.h2raw import never_reading_client

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PATH = "/runtime.v1.RuntimeService/Version"
MiB = 1 << 20


def rss_mib(pid: int) -> float:
    return rss_kib(pid) / 1024


def request_headers(enc: Encoder, extra: list[tuple[str, str]] | None = None) -> bytes:
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", PATH),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *(extra or []),
    ]
    return bytes(enc.encode(fields, huffman=False))  # pure-Python Huffman of 1 MiB takes > 20 s


def connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(PREFACE + SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 65535}).serialize())
    s.settimeout(0.5)
    return s


def send_until(s: socket.socket, chunks: Callable[[], bytes], seconds: float, cap: int) -> int:
    """Send what `chunks` makes until time, `cap` bytes, or the peer stops reading/closes; bytes sent."""
    sent, end = 0, time.monotonic() + seconds
    while time.monotonic() < end and sent < cap:
        data = chunks()
        try:
            s.sendall(data)
        except (TimeoutError, OSError):
            break
        sent += len(data)
    return sent


def flood_ignoring_flow(path: str, seconds: float) -> str:
    """Many requests, each followed by DATA far beyond the 64 KiB window; never reads."""
    s, enc, sid = connect(path), Encoder(), [1]

    def chunk() -> bytes:
        out = HeadersFrame(sid[0], data=request_headers(enc), flags=["END_HEADERS"]).serialize()
        out += DataFrame(sid[0], data=b"\0" * 16384).serialize() * 16  # 256 KiB on a 64 KiB window
        sid[0] += 2
        return out

    n = send_until(s, chunk, seconds, 256 * MiB)
    s.close()
    return f"sent {n / MiB:.0f} MiB on {(sid[0] - 1) // 2} streams"


def never_reads_respecting_flow(path: str, seconds: float) -> str:
    """Complete tiny Version calls as fast as possible, never reading a response."""
    return f"{never_reading_client(Path(path), seconds)} calls"


def big_header_blocks(path: str, seconds: float) -> str:
    """1 MiB header blocks (HEADERS + CONTINUATIONs of 16 KiB), one per stream, up to 64 of them."""
    s, sid, count = connect(path), 1, 0
    end = time.monotonic() + seconds
    block = request_headers(Encoder(), [("x-big", "a" * MiB)])  # never indexed again: no table state
    while time.monotonic() < end and count < 64:
        frames = [block[i : i + 16384] for i in range(0, len(block), 16384)]
        out = HeadersFrame(sid, data=frames[0]).serialize()
        for i, part in enumerate(frames[1:], 1):
            out += ContinuationFrame(
                sid, data=part, flags=["END_HEADERS"] if i == len(frames) - 1 else []
            ).serialize()
        try:
            s.sendall(out)
        except (TimeoutError, OSError):
            break
        sid, count = sid + 2, count + 1
    s.close()
    return f"{count} blocks of 1 MiB"


def endless_continuation(path: str, seconds: float) -> str:
    """One HEADERS without END_HEADERS, then CONTINUATION frames of 16 KiB forever (cap 256 MiB)."""
    s, enc = connect(path), Encoder()
    first = HeadersFrame(1, data=request_headers(enc)).serialize()
    cont = ContinuationFrame(1, data=b"\x40\x01x\x01y" * 3276).serialize()  # literal x: y, incremental
    s.sendall(first)
    n = send_until(s, lambda: cont * 16, seconds, 256 * MiB)
    s.close()
    return f"sent {n / MiB:.0f} MiB of CONTINUATION"


def idle_connections(path: str, seconds: float) -> str:
    """500 connections that send the preface and SETTINGS, then nothing, for `seconds`."""
    socks = []
    for _ in range(500):
        try:
            socks.append(connect(path))
        except OSError:
            break
    time.sleep(seconds)
    for s in socks:
        s.close()
    return f"{len(socks)} idle connections held {seconds:.0f} s"


CLIENTS: dict[str, Callable[[str, float], str]] = {
    "flood-ignoring-flow-control": flood_ignoring_flow,
    "never-reads-respecting-flow-control": never_reads_respecting_flow,
    "1MiB-header-blocks": big_header_blocks,
    "endless-continuation": endless_continuation,
    "idle-connections": idle_connections,
}


def measure(pid: int, path: str, client: Callable[[str, float], str], seconds: float) -> str:
    base = rss_mib(pid)
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib(pid))
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        what = client(path, seconds)
    except OSError as err:
        what = f"client error {err!r}"
    time.sleep(3)
    done.set()
    t.join()
    after = rss_mib(pid)
    return (
        f"baseline {base:6.1f}  peak {peak[0]:6.1f} (+{peak[0] - base:5.1f})  "
        f"after {after:6.1f} (+{after - base:5.1f}) MiB  [{what}]"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0, help="how long each client runs (default 4)")
    ap.add_argument("--only", action="append", choices=sorted(CLIENTS), help="run only these clients")
    add_proxy_cli(ap)
    args = ap.parse_args()
    ctrd_sock, ctrd_pid = os.environ["CONTAINERD_SOCK"], int(os.environ["CONTAINERD_PID"])
    tmp = Path(tempfile.mkdtemp(prefix="hostile-"))
    proxy, _ = start_proxy(
        tmp,
        f"unix://{ctrd_sock}",
        "--relay-mode",
        "frames",
        listen=tmp / "p.sock",
        log=tmp / "proxy.log",
        cli=args.proxy_cli,
    )
    try:
        for name in args.only or CLIENTS:
            print(f"{name}:", flush=True)
            print(
                f"  proxy      {measure(proxy.pid, str(tmp / 'p.sock'), CLIENTS[name], args.seconds)}",
                flush=True,
            )
            print(f"  containerd {measure(ctrd_pid, ctrd_sock, CLIENTS[name], args.seconds)}", flush=True)
        alive = proxy.poll() is None
        print(f"proxy still running: {alive}; proxy log {tmp / 'proxy.log'}")
    finally:
        proxy.terminate()
        proxy.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
