"""`cri-proxy plan --snapshot FILE`: replay a node snapshot through the decision rules.

Same `decide` as the proxy, no runtime, no socket, no root (plan-snapshot.md). JSON for tools,
`-o table` for people, `-o yaml` (`--format`, the old name of `-o`, is still taken). Exit 2 with
one line on stderr when the snapshot cannot be used.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from cri_proxy.cpu.decide import Plan
    from cri_proxy.cpu.inputs import NodeInputs

EXIT_BAD_SNAPSHOT = 2


def register(sub: Any) -> None:
    """Add the `plan` subparser."""
    p: argparse.ArgumentParser = sub.add_parser(
        "plan",
        help="print the cpuset decisions for a node snapshot",
        description="Read a node snapshot (JSON) and print what the proxy would set for every container.",
    )
    p.add_argument("--snapshot", required=True, metavar="FILE", help="snapshot JSON file, or - for stdin")
    p.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "yaml"),
        default="json",
        help="output format, one of table|json|yaml (default json)",
    )
    p.add_argument("--format", dest="output", choices=("table", "json", "yaml"), help=argparse.SUPPRESS)
    p.set_defaults(func=run)


MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024
"""256 MiB: a node's snapshot is kilobytes to a few megabytes; /dev/zero is not one."""


def _read(path: str) -> str:
    """The snapshot's text, from a file or a pipe (`-`, `<(...)`), at most MAX_SNAPSHOT_BYTES."""
    if path == "-":
        data = sys.stdin.buffer.read(MAX_SNAPSHOT_BYTES + 1)
    else:
        with open(path, "rb") as f:
            data = f.read(MAX_SNAPSHOT_BYTES + 1)
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise ValueError(f"more than {MAX_SNAPSHOT_BYTES} bytes")
    return data.decode("utf-8")


def _fail(path: str, message: str) -> int:
    one_line = " ".join(message.split())
    print(f"cri-proxy plan: {path}: {one_line}", file=sys.stderr)
    return EXIT_BAD_SNAPSHOT


def run(args: argparse.Namespace) -> int:
    """Load, decide, print. 0 on success, 2 for an unreadable or malformed snapshot."""
    from cri_proxy.cpu.decide import decide
    from cri_proxy.cpu.snapshot import load_snapshot, plan_to_json
    from cri_proxy.errors import SnapshotError

    path: str = args.snapshot
    try:
        text = _read(path)
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        return _fail(path, f"cannot read: {getattr(e, 'strerror', None) or e}")
    try:
        inputs = load_snapshot(text)
    except SnapshotError as e:
        return _fail(path, f"bad snapshot: {e}")
    plan = decide(inputs)
    try:
        if args.output == "table":
            write_table(plan, inputs, sys.stdout)
        elif args.output == "yaml":
            import yaml

            sys.stdout.write(yaml.safe_dump(plan_to_json(plan), sort_keys=False, default_flow_style=False))
        else:
            json.dump(plan_to_json(plan), sys.stdout, indent=2)
            sys.stdout.write("\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `cri-proxy plan ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def write_table(plan: Plan, inputs: NodeInputs, out: TextIO) -> None:
    """One row per container (pod, name, id, QoS, cpuset, why), then pools and problems.

    `-` in the CPUSET column means "left unchanged" (not managed, or its pool is exhausted).
    """
    names = {c.id: c.name for p in inputs.pods for c in p.containers}
    header = ("POD", "CONTAINER", "ID", "QOS", "CPUSET", "WHY")
    ordered = sorted(plan.containers.items(), key=lambda item: (item[1].pod, names.get(item[0], ""), item[0]))
    rows = [header] + [
        (
            d.pod,
            names.get(cid, "?"),
            cid,
            "-" if d.qos is None else str(d.qos),
            "-" if d.cpuset is None else str(d.cpuset),
            d.why,
        )
        for cid, d in ordered
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    for r in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=False)) + "  " + r[-1] + "\n")
    out.write("\npools:\n")
    out.write(f"  ls  {plan.pools.ls or '(empty)'}\n")
    out.write(f"  be  {plan.pools.be or '(empty)'}\n")
    out.write(f"\nproblems: {len(plan.problems) or 'none'}\n")
    for p in plan.problems:
        out.write(f"  {p.kind}  {p.pod or '(node)'}  {p.message}\n")
