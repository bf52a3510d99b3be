"""Flags shared by several commands, with crictl's names."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

from cri_proxy.ctl.errors import CtlError


class Skipped:
    """Stands in for the parser of a command that is not being run: takes its flags, keeps nothing."""

    def add_argument(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_defaults(self, **kwargs: Any) -> None:
        pass


class Commands:
    """The subcommands being built: all of them, or (`only`) just the one a run needs, since
    building every parser costs more than the rest of a `ctl version`."""

    def __init__(self, action: Any, only: str | None = None) -> None:
        self.action = action
        self.only = only

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        names = {name, *kwargs.get("aliases", ())}
        if self.only is not None and self.only not in names:
            return Skipped()
        return self.action.add_parser(name, **kwargs)


def command(cmds: Commands, name: str, handler: str, help: str, **kwargs: Any) -> Any:
    """Add a subcommand run by `handler`, "module:function" in `cri_proxy.ctl` (imported when run).

    Returns its parser (argparse's, or a `Skipped` when another command is being run)."""
    parser = cmds.add_parser(name, help=help, description=help, **kwargs)
    parser.set_defaults(ctl_handler=handler, ctl_parser=parser)
    return parser


def add_output(parser: argparse.ArgumentParser, default: str, choices: Sequence[str]) -> None:
    """crictl's -o/--output; with go-template among the choices, its --template too."""
    parser.add_argument(
        "-o",
        "--output",
        default=default,
        choices=choices,
        help=f"output format, one of {'|'.join(choices)} (default {default})",
    )
    if "go-template" in choices:
        parser.add_argument(
            "--template", default="", help="the template of -o go-template (a subset of Go's text/template)"
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
            raise CtlError(f"incorrectly specified label: {value}")
        labels[pair[0]] = pair[1]
    return labels


def regex(flag: str, pattern: str | None) -> re.Pattern[str] | None:
    if not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise CtlError(f"{flag}: not a regular expression: {exc}") from None


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
