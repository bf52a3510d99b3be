"""How long one client's big header blocks stall another connection: direct to containerd vs the proxy.

Usage (root, a private containerd around it):
    .venv/bin/python bench/with_containerd.py \
        .venv/bin/python bench/headerblock.py [--seconds 5] [--only NAME]

One raw HTTP/2 client sends, connection after connection, the largest header block the proxy
accepts (just under its 2 MiB cap) of one kind, waits for the stream's end, and goes again. Meanwhile
another connection makes sequential Version calls; for each kind and target the script prints the
prober's worst and median call time while the attacker runs, beside its worst with nobody attacking.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from common import start_proxy
from hpack.hpack import encode_integer
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests import h2raw

VERSION = "/runtime.v1.RuntimeService/Version"
BLOCK = 2_000_000  # encoded bytes of the attacker's block: under the proxy's 2 MiB cap


def string(text: bytes, huffman: bool = False) -> bytes:
    if not huffman:
        return bytes(encode_integer(len(text), 7)) + text
    bits = "".join(format(REQUEST_CODES[b], f"0{REQUEST_CODES_LENGTH[b]}b") for b in text)
    bits += "1" * (-len(bits) % 8)
    coded = int(bits, 2).to_bytes(len(bits) // 8, "big")
    head = bytearray(encode_integer(len(coded), 7))
    head[0] |= 0x80
    return bytes(head) + coded


def literal(name: bytes, value: bytes, index: bool = False) -> bytes:
    return (b"\x40" if index else b"\x00") + string(name) + string(value)


def huge_literal() -> bytes:
    """One literal without indexing, its value ~2 MB of plain bytes."""
    return literal(b"x-big", b"a" * (BLOCK - 64))


def incremental() -> bytes:
    """Literals with incremental indexing of 4000-byte values: each evicts the one before."""
    one = [literal(b"x-inc-%d" % i, b"i" * 4000, index=True) for i in range(4)]
    count = BLOCK // len(one[0])
    return b"".join(one[i % 4] for i in range(count))


def many_small() -> bytes:
    """~125 000 small literal fields with new names (a header list of ~6 MB: containerd takes it)."""
    field = literal(b"x-f", b"v" * 8)
    return field * (BLOCK // len(field))


def huffman() -> bytes:
    """One literal whose ~2 MB value is Huffman-coded (5 bits a byte: 3.2 MB decoded)."""
    eight = string(b"a" * 8, huffman=True)[1:]  # 40 bits: 5 whole bytes
    coded = eight * ((BLOCK - 64) // len(eight))
    head = bytearray(encode_integer(len(coded), 7))
    head[0] |= 0x80
    return b"\x00" + string(b"x-huff") + bytes(head) + coded


def expanding() -> bytes:
    """A 4000-byte entry, then ~2 M one-byte references to it: ~8 GB of header list."""
    insert = literal(b"x-bomb", b"b" * 4000, index=True)
    return insert + b"\xbe" * (BLOCK - len(insert))


KINDS: dict[str, Callable[[], bytes]] = {
    "literal": huge_literal,
    "incremental": incremental,
    "many-small": many_small,
    "huffman": huffman,
    "expanding": expanding,
}


def frames(conn: h2raw.RawH2, sid: int, extra: bytes) -> bytes:
    block = conn.header_block(h2raw.request_headers(VERSION)) + extra
    first, rest = block[:16384], block[16384:]
    out = [h2raw.frame(h2raw.HEADERS, h2raw.END_STREAM, sid, first)]
    while rest:
        chunk, rest = rest[:16384], rest[16384:]
        out.append(h2raw.frame(h2raw.CONTINUATION, 0 if rest else h2raw.END_HEADERS, sid, chunk))
    return b"".join(out)


def attack(path: str, extra: bytes, stop: threading.Event, outcomes: list[str]) -> None:
    while not stop.is_set():
        try:
            with h2raw.RawH2(path) as conn:
                sid = conn.new_stream()
                conn.send(frames(conn, sid, extra))
                outcomes.append(str(conn.outcome(sid, 1)))
        except OSError as exc:
            outcomes.append(f"error {exc}")


def probe(path: str, seconds: float, stop: threading.Event | None = None) -> list[float]:
    times = []
    with h2raw.RawH2(path) as conn:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not (stop is not None and stop.is_set()):
            began = time.perf_counter()
            sid = conn.call(VERSION, b"")
            outcome = conn.outcome(sid, 60)
            times.append(time.perf_counter() - began)
            if str(outcome) != "status 0":
                raise SystemExit(f"prober's Version call ended {outcome}")
    return times


def measure(path: str, extra: bytes, seconds: float) -> str:
    idle = probe(path, 1.0)
    stop = threading.Event()
    outcomes: list[str] = []
    attacker = threading.Thread(target=attack, args=(path, extra, stop, outcomes))
    attacker.start()
    time.sleep(0.2)
    busy = probe(path, seconds)
    stop.set()
    attacker.join(120)
    seen = sorted(set(outcomes))
    return (
        f"worst {max(busy) * 1000:8.1f} ms  median {statistics.median(busy) * 1000:6.2f} ms  "
        f"calls {len(busy):5d}  (idle worst {max(idle) * 1000:5.1f} ms)  "
        f"attacker blocks {len(outcomes)}: {', '.join(seen)}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="how long each attacker runs (default 5)")
    ap.add_argument("--only", action="append", choices=sorted(KINDS), help="run only these kinds")
    args = ap.parse_args()
    ctrd_sock = os.environ["CONTAINERD_SOCK"]
    tmp = Path(tempfile.mkdtemp(prefix="headerblock-"))
    proxy, _ = start_proxy(
        tmp, f"unix://{ctrd_sock}", "--relay-mode", "frames", listen=tmp / "p.sock", log=tmp / "proxy.log"
    )
    try:
        with h2raw.RawH2(ctrd_sock) as conn:
            conn.wait(lambda: bool(conn.server_settings) or conn.settings_acked > 0, 5)
            print(f"containerd's SETTINGS: {conn.server_settings}")
        for name in args.only or KINDS:
            extra = KINDS[name]()
            print(f"{name} ({len(extra)} bytes of extra fields):", flush=True)
            print(f"  containerd {measure(ctrd_sock, extra, args.seconds)}", flush=True)
            print(f"  proxy      {measure(str(tmp / 'p.sock'), extra, args.seconds)}", flush=True)
        print(f"proxy still running: {proxy.poll() is None}; proxy log {tmp / 'proxy.log'}")
    finally:
        proxy.terminate()
        proxy.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
