"""Flags shared by several commands, with crictl's names."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

from cri_proxy.ctl.errors import CtlError


def command(cmds: Any, name: str, handler: str, help: str, **kwargs: Any) -> argparse.ArgumentParser:
    """Add a subcommand run by `handler`, "module:function" in `cri_proxy.ctl` (imported when run)."""
    parser: argparse.ArgumentParser = cmds.add_parser(name, help=help, description=help, **kwargs)
    parser.set_defaults(ctl_handler=handler)
    return parser


def add_output(parser: argparse.ArgumentParser, default: str, choices: Sequence[str]) -> None:
    parser.add_argument(
        "-o", "--output", default=default, choices=choices, help=f"output format (default {default})"
    )


def add_label(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", help="filter by label (repeatable)"
    )


def parse_labels(values: Sequence[str]) -> dict[str, str]:
    labels = {}
    for value in values:
        pair = value.split("=")
        if len(pair) != 2:
            raise CtlError(f"incorrectly specified label: {value}", code=2)
        labels[pair[0]] = pair[1]
    return labels


def regex(flag: str, pattern: str | None) -> re.Pattern[str] | None:
    if not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise CtlError(f"{flag}: not a regular expression: {exc}", code=2) from None


def matches(pattern: re.Pattern[str] | None, value: str) -> bool:
    return pattern is None or pattern.search(value) is not None


def newest(found: list[Any], args: argparse.Namespace) -> list[Any]:
    """Newest first, cut to `--latest` or `--last N`: `ps`, `pods` and their `inspect*` pick alike."""
    found.sort(key=lambda item: item.created_at, reverse=True)
    n = len(found)
    if args.latest:
        n = 1
    if args.last > 0:
        n = args.last
    return found[:n]
