"""`ctl cpus`: one row per CPU — its pools, who holds it exclusively, the containers really on it,
and the conflicts — as a table (coloured on a terminal) or JSON/YAML with `-o`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cri_proxy.ctl.conn import Conn
from cri_proxy.ctl.output import plain_table, to_yaml
from cri_proxy.ctl.proxy import ask, dry_run_note

RED, YELLOW, CYAN, RESET = "\x1b[31m", "\x1b[33m", "\x1b[36m", "\x1b[0m"
POOL_COLOURS = {"reserved": "\x1b[2m", "LSE": "\x1b[35m", "LSR": "\x1b[34m", "kubelet": CYAN}


def _paint(text: str, colour: str, tty: bool) -> str:
    return f"{colour}{text}{RESET}" if tty and colour and text not in ("", "-") else text


def table(rows: list[dict[str, Any]], tty: bool) -> str:
    """The rows as text; colour codes are added after padding so the columns stay aligned."""
    heads = ("CPU", "POOL", "HOLDER", "CONTAINERS", "CONFLICTS")
    body = [
        [
            str(r["cpu"]),
            ",".join(r["pools"]) or "-",
            ", ".join(r["holders"]) or "-",
            ", ".join(r["containers"]) or "-",
            "; ".join(r["conflicts"]) or "-",
        ]
        for r in rows
    ]
    lines = plain_table(heads, body).split("\n")
    if not tty:
        return "\n".join(lines)
    out = [lines[0]]
    for line, r in zip(lines[1:], rows, strict=True):
        if r["conflicts"]:
            line = _paint(line, RED, tty)
        else:
            first = r["pools"][0] if r["pools"] else ""
            line = _paint(line, POOL_COLOURS.get(first, ""), tty)
        out.append(line)
    return "\n".join(out)


def cpus(args: argparse.Namespace, conn: Conn) -> int:
    found = ask(conn, "Cpus", "cpus")
    if args.output == "json":
        print(json.dumps(found, indent=2))
        return 0
    if args.output == "yaml":
        print(to_yaml(found).rstrip("\n"))
        return 0
    tty = sys.stdout.isatty()
    print(table(found["cpus"], tty))
    note = dry_run_note(found)
    if note:
        print(_paint(note, YELLOW, tty))
    return 0
