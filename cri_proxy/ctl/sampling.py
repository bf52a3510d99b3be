"""The sampling loop `stats` and `statsp` share: one sample, wait, a second, CPU % from the two."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf.message import Message

from cri_proxy.ctl import output

CLEAR_SCREEN = "\033[2J\033[H"  # crictl clears the terminal before each table of stats


def cpu_percent(now: Any, before: Any) -> float:
    """CPU % between two CRI `CpuUsage` samples; 0 when none was used or no time passed."""
    used = now.usage_core_nano_seconds.value
    if not used or now.timestamp == before.timestamp:
        return 0.0
    return float((used - before.usage_core_nano_seconds.value) / (now.timestamp - before.timestamp) * 100)


def watch(
    args: argparse.Namespace,
    fetch: Callable[[], list[Any]],
    response: Callable[[list[Any]], Message],
    head: Sequence[str],
    row: Callable[[Any, Any], list[str] | None],
) -> int:
    """Print `row(stats, earlier stats)` of each item found in both samples (None leaves it out),
    every `--seconds` while `--watch`; `-o json|yaml` prints the first sample as is."""
    while True:
        first = fetch()
        if args.output != "table":
            print(output.message_output(response(first), args.output))
            return 0
        old = {s.attributes.id: s for s in first}
        time.sleep(max(0, args.seconds))
        rows = [list(head)]
        for s in fetch():
            before = old.get(s.attributes.id)
            cells = None if before is None else row(s, before)
            if cells is not None:
                rows.append(cells)
        print(CLEAR_SCREEN + output.table(rows), flush=True)
        if not args.watch:
            return 0
