"""How long `cri-proxy ctl version` takes next to `crictl version`, on the same socket.

Both are run against one `cri-proxy fake-runtime` (or ENDPOINT, e.g. a proxy in front of
containerd), interleaved (crictl, ctl, crictl, ctl, ...) so machine noise falls on both alike.
Prints min and median wall time of each, the ratio of the medians (goal: ctl <= 3x crictl), and
the floor: `python -c pass` with the same interpreter and site packages, and ctl's own import
time from `python -X importtime`. Bytecode caches are written and used, as in an installed package.

    .venv/bin/python bench/ctl_startup.py [--crictl PATH] [--runs N] [--endpoint ENDPOINT]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import CLI, start_fake_runtime, stop_all

DEFAULT_CRICTL = "/work/tools/bin/crictl-1.36.0"


def timed(argv: list[str], env: dict[str, str]) -> float:
    began = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, env=env, check=False)
    spent = time.perf_counter() - began
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {out.returncode}: {out.stderr.decode()[-500:]}")
    return spent


def import_ms(endpoint: str, env: dict[str, str]) -> float:
    """ctl's own import time (the sum of -X importtime's top-level rows, after site)."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", CLI, "ctl", "-r", endpoint, "version"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    total = 0
    for line in out.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and not parts[2].startswith("  ") and parts[1].strip().isdigit():
            name = parts[2].strip()
            if name not in ("site", "encodings", "encodings.utf_8", "_signal", "io", "zipimport"):
                total += int(parts[1])
    return total / 1000


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--crictl", default=os.environ.get("CRICTL", DEFAULT_CRICTL))
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--endpoint", help="measure against this endpoint instead of a fake runtime")
    args = parser.parse_args()
    if not Path(args.crictl).exists():
        raise SystemExit(f"no crictl at {args.crictl} (--crictl PATH, or $CRICTL)")
    # bytecode caches as an installed package has them (pip compiles at install): a run with
    # PYTHONDONTWRITEBYTECODE would compile every module of ctl on every start
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["CRI_CONFIG_FILE"] = "/dev/null"
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        endpoint = args.endpoint
        if endpoint is None:
            fake, endpoint = start_fake_runtime(Path(tmp))
            procs.append(fake)
        try:
            crictl = [args.crictl, "-r", endpoint, "version"]
            ctl = [CLI, "ctl", "-r", endpoint, "version"]
            python = [sys.executable, "-c", "pass"]
            for argv in (crictl, ctl, python):  # warm the page cache
                timed(argv, env)
            times: dict[str, list[float]] = {"crictl": [], "ctl": [], "python": []}
            for _ in range(args.runs):
                times["crictl"].append(timed(crictl, env))
                times["ctl"].append(timed(ctl, env))
                times["python"].append(timed(python, env))
            imports = statistics.median(import_ms(endpoint, env) for _ in range(5))
        finally:
            stop_all(procs)
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    low = {k: min(v) * 1000 for k, v in times.items()}
    print(f"{'':24} {'min ms':>8} {'median ms':>10}")
    print(f"{'crictl version':24} {low['crictl']:8.1f} {med['crictl']:10.1f}")
    print(f"{'cri-proxy ctl version':24} {low['ctl']:8.1f} {med['ctl']:10.1f}")
    print(f"{'python -c pass (floor)':24} {low['python']:8.1f} {med['python']:10.1f}")
    print(f"ctl's imports (importtime): {imports:.1f} ms")
    print(
        f"ratio ctl / crictl: median {med['ctl'] / med['crictl']:.2f}x, min {low['ctl'] / low['crictl']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
