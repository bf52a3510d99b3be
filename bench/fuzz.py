#!/usr/bin/env python3
"""Fuzz the intercepted CRI methods through an in-process proxy in front of the fake runtime.

The generators and checks of tests/unit/test_bad_input.py (random bytes, flipped bytes, truncated
messages, bad wire types, lengths past the end, overlong varints, field 0, non-UTF-8 strings), for
every intercepted method in runtime.v1 and v1alpha2, alternating fail policies `ignore` and `fail`.
Every input is checked as in the tests: an answer within the call timeout, INVALID_ARGUMENT
(`fail`) or the runtime's own answer (`ignore`) for what does not decode, the node state unchanged
by it, consistent after every input, Version still answered, no hook error logged. Prints counts,
not asserts; "check failures" must be 0.

    .venv/bin/python bench/fuzz.py                 # 10,000 inputs, about a minute
    .venv/bin/python bench/fuzz.py --count 50000 --seconds 600
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

from common import rss_kib
from loguru import logger

from cri_proxy.relay.forward import FailPolicy
from cri_proxy.relay.methods import KNOWN
from tests.unit.test_bad_input import GENERATORS, PATHS, decodes, fuzzer


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=10_000, help="inputs to send (default 10,000)")
    parser.add_argument("--seconds", type=float, default=600.0, help="stop after this long (default 600)")
    parser.add_argument("--seed", type=int, default=8, help="random seed (default 8)")
    args = parser.parse_args()

    logger.remove()  # the proxy's own log lines would dominate the run
    rng = random.Random(args.seed)
    kinds = sorted(GENERATORS)
    policies = (FailPolicy.IGNORE, FailPolicy.FAIL)
    by_kind: Counter[tuple[str, str]] = Counter()
    by_method: Counter[str] = Counter()
    undecodable = 0
    failures: list[str] = []
    rss_start = rss_kib()
    with tempfile.TemporaryDirectory(prefix="cri-fuzz-") as tmp, fuzzer(Path(tmp)) as f:
        rss_ready = rss_kib()
        began = time.perf_counter()
        sent = 0
        while sent < args.count and time.perf_counter() - began < args.seconds:
            path = rng.choice(PATHS)
            kind = rng.choice(kinds)
            policy = policies[sent % 2]
            raw = GENERATORS[kind](rng, f.seeds[path], KNOWN[path])
            undecodable += not decodes(KNOWN[path], raw)
            sent += 1
            by_method[path.rsplit(".", 1)[0].split("/")[1] + " " + KNOWN[path].name] += 1
            try:
                outcome = f.one(path, raw, policy)
            except Exception as exc:  # a broken check or an exception escaping: count and go on
                outcome = "CHECK FAILED"
                f.hook_errors.clear()
                if len(failures) < 10:
                    failures.append(f"{path} {kind} {policy.value} {raw[:64].hex()}: {exc!r:.300}")
            by_kind[(kind, outcome)] += 1
        elapsed = time.perf_counter() - began
        state = f.live.node.proxy.state
        pods, containers = len(state.pods()), len(state.containers())
    rss_end = rss_kib()

    outcomes = Counter[str]()
    for (_, outcome), n in by_kind.items():
        outcomes[outcome] += n
    print(f"inputs: {sent} in {elapsed:.1f} s ({sent / elapsed:.0f}/s), {undecodable} of them do not decode")
    print(
        f"methods: {len(by_method)} (8 intercepted x 2 API versions), {min(by_method.values())}-"
        f"{max(by_method.values())} inputs each"
    )
    for outcome in ("invalid-argument", "runtime-answer", "ok", "CHECK FAILED"):
        print(f"  {outcome:<17} {outcomes[outcome]:>6}")
    print("by generator:")
    for kind in kinds:
        row = ", ".join(f"{o} {by_kind[(kind, o)]}" for o in ("invalid-argument", "runtime-answer", "ok"))
        bad = by_kind[(kind, "CHECK FAILED")]
        print(f"  {kind:<11} {row}" + (f", CHECK FAILED {bad}" if bad else ""))
    print(f"check failures (crash, hang, state change, inconsistency, hook error): {len(failures)}")
    for line in failures:
        print(f"  {line}")
    print(f"node state at the end: {pods} pods, {containers} containers")
    print(
        f"RSS of this process (proxy + fake runtime + client): {rss_start // 1024} MiB at start, "
        f"{rss_ready // 1024} MiB with the node up, {rss_end // 1024} MiB at the end"
    )


if __name__ == "__main__":
    main()
