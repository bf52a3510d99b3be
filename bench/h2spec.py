#!/usr/bin/env python3
"""h2spec (the HTTP/2 conformance suite) against containerd directly and through the proxy, compared.

A private containerd (root), a proxy in front of it per relay mode asked for, a loopback TCP
bridge (socat) to each Unix socket, h2spec run against every target at once with the path of a
CRI call (`-P /runtime.v1.RuntimeService/Version`); each target's JUnit report is kept and the
cases that pass directly but fail through a proxy are listed. Not part of CI: h2spec and socat
are outside tools (h2spec v2.6.0 builds in GOPATH mode against Debian's golang-go,
golang-github-fatih-color-dev, golang-github-spf13-cobra-dev and golang-golang-x-net-dev).

    .venv/bin/python bench/h2spec.py --h2spec /tmp/h2spec                  # frames mode
    .venv/bin/python bench/h2spec.py --h2spec /tmp/h2spec --mode frames --mode grpc
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from common import free_port, runtime, start_proxy, stop_all

PATH = "/runtime.v1.RuntimeService/Version"


def wait_port(port: int, deadline: float = 10.0) -> None:
    """Until the bridge listens (h2spec gives up on a refused connection)."""
    end = time.monotonic() + deadline
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def results(report: Path) -> dict[str, bool]:
    """Each case's id (`section/number`, as h2spec names it) -> passed (skipped cases left out)."""
    out: dict[str, bool] = {}
    for suite in ET.parse(report).getroot().iter("testsuite"):
        package = suite.get("package", "")
        for n, case in enumerate(suite.iter("testcase"), 1):
            if case.find("skipped") is not None:
                continue
            out[f"{package}/{n}"] = case.find("failure") is None and case.find("error") is None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--h2spec", default=shutil.which("h2spec") or "h2spec", help="the h2spec binary")
    parser.add_argument("--mode", action="append", choices=("frames", "grpc"), help="relay modes (frames)")
    parser.add_argument("--timeout", type=int, default=5, help="h2spec's -o, seconds per case")
    parser.add_argument("--out", type=Path, help="where the reports go (default: a temp dir)")
    args = parser.parse_args()
    if shutil.which("socat") is None:
        raise SystemExit("socat not found (apt-get install socat)")
    modes = args.mode or ["frames"]
    work = Path(tempfile.mkdtemp(prefix="cri-h2spec-"))
    out = args.out or work
    out.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    with runtime("containerd", work) as address:
        try:
            targets = {"direct": address.removeprefix("unix://")}
            for mode in modes:
                where = work / mode
                where.mkdir()
                proc, proxy = start_proxy(where, address, "--relay-mode", mode, log=where / "proxy.log")
                procs.append(proc)
                targets[mode] = proxy.removeprefix("unix://")
            runs = []
            for name, path in targets.items():
                port = free_port()
                bridge = ["socat", f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork", f"UNIX-CONNECT:{path}"]
                with (out / f"socat-{name}.log").open("wb") as noise:  # h2spec's cases break pipes
                    procs.append(subprocess.Popen(bridge, stdout=noise, stderr=noise))
                wait_port(port)
                report = out / f"h2spec-{name}.xml"
                argv = [args.h2spec, "-h", "127.0.0.1", "-p", str(port), "-P", PATH, "-o", str(args.timeout)]
                with (out / f"h2spec-{name}.txt").open("wb") as log:
                    runs.append(
                        (name, report, subprocess.Popen([*argv, "-j", str(report)], stdout=log, stderr=log))
                    )
            for _, _, run in runs:
                run.wait()
        finally:
            stop_all(procs)
    found = {name: results(report) for name, report, _ in runs}
    direct = found["direct"]
    print(f"h2spec {PATH} -o {args.timeout}; reports in {out}")
    for name, cases in found.items():
        passed = sum(cases.values())
        line = f"  {name}: {passed} passed, {len(cases) - passed} failed"
        if name != "direct":
            lost = sorted(c for c, ok in direct.items() if ok and not cases.get(c, False))
            gained = sorted(c for c, ok in cases.items() if ok and not direct.get(c, False))
            line += (
                f"; passing direct, failing here: {len(lost)} {lost}; the other way: {len(gained)} {gained}"
            )
        print(line, flush=True)


if __name__ == "__main__":
    main()
