"""`cri-proxy ctl`: the crictl-compatible debugging CLI, with pass-through to the runtime.

Only the argparse wiring lives here; the commands are in `cri_proxy.ctl`, imported when one runs.
`ctl` parses its own words (`main`), so usage errors exit as crictl's do: 1 for a bad flag or
value, 3 for an unknown command; `help [COMMAND]`, `--version/-v` as in crictl.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from cri_proxy import __version__

PROG = "cri-proxy ctl"
EXIT_USAGE = 1  # crictl: "Incorrect Usage", a bad flag or a bad value
EXIT_UNKNOWN_COMMAND = 3  # crictl: "No help topic for 'x'"
DESCRIPTION = (
    "crictl's commands, flags and output, through the proxy (or --bypass, straight to the runtime), "
    "plus what only the proxy knows: cpusets, snapshot, plan, status, pools, problems."
)


def help_formatter(prog: str) -> argparse.HelpFormatter:
    """argparse's formatter, told the width (it would import shutil to ask, on every parser)."""
    try:
        width = os.get_terminal_size().columns
    except OSError:
        width = int(os.environ.get("COLUMNS", "80")) if os.environ.get("COLUMNS", "").isdigit() else 80
    return argparse.HelpFormatter(prog, width=max(width - 2, 40))


class UnknownCommand(Exception):
    """The word where a command was expected is none."""


class CtlParser(argparse.ArgumentParser):
    """argparse with crictl's exit codes: 1 for usage errors, 3 for an unknown command."""

    commands: Any = None  # the subcommands' action, for `help COMMAND`

    def error(self, message: str) -> NoReturn:
        if message.startswith("argument COMMAND: invalid choice:"):
            word = message.split("'")[1] if "'" in message else message
            raise UnknownCommand(word)
        self.exit(EXIT_USAGE, f"Incorrect Usage: {message}\nRun '{self.prog} --help' for usage.\n")


def register(sub: Any) -> None:
    """`ctl` in `cri-proxy --help`; its words are parsed by `main` (cli.py sends them there)."""
    p: argparse.ArgumentParser = sub.add_parser(
        "ctl",
        help="crictl-compatible CLI, through the proxy or straight to the runtime",
        description=DESCRIPTION,
        add_help=False,
    )
    p.add_argument("words", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda args: main(args.words))


def build_parser(only: str | None = None) -> CtlParser:
    """ctl's parser with every command, or (`only`) with just the one being run."""
    from cri_proxy.ctl import parsers
    from cri_proxy.ctl.flags import Commands
    from cri_proxy.ctl.options import add_global_flags

    p = CtlParser(prog=PROG, description=DESCRIPTION, formatter_class=help_formatter)
    p.add_argument("-v", "--version", action="version", version=f"{PROG} version {__version__}")
    add_global_flags(p)
    action = p.add_subparsers(dest="ctl_command", required=True, metavar="COMMAND", parser_class=CtlParser)
    action.add_parser = functools.partial(action.add_parser, formatter_class=help_formatter)  # type: ignore[method-assign]
    cmds = Commands(action, only)
    parsers.register(cmds)
    helper = cmds.add_parser("help", aliases=["h"], help="Shows a list of commands or help for one command")
    helper.add_argument("topic", nargs="*", metavar="COMMAND")
    p.commands = action
    return p


def command_word(words: Sequence[str]) -> str | None:
    """The command among `words` (after the global flags and their values), if any."""
    from cri_proxy.ctl.options import VALUE_FLAGS

    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "--":
            return None
        elif word.startswith("-"):
            skip = word in VALUE_FLAGS
        else:
            return word
    return None


def _help(parser: CtlParser, words: Sequence[str]) -> int:
    """`help` and `help COMMAND`: the usage of ctl or of one command."""
    if not words:
        parser.print_help()
        return 0
    command = parser.commands.choices.get(words[0])
    if command is None:
        print(f"No help topic for '{words[0]}'", file=sys.stderr)
        return EXIT_UNKNOWN_COMMAND
    command.print_help()
    return 0


def main(argv: Sequence[str]) -> int:
    word = command_word(argv)
    parser = build_parser(word)
    if word is None or word in ("help", "h") or word not in parser.commands.choices:
        parser = build_parser()
    try:
        args = parser.parse_args(list(argv))
    except UnknownCommand as exc:
        print(f"No help topic for '{exc}'", file=sys.stderr)
        return EXIT_UNKNOWN_COMMAND
    if args.ctl_command in ("help", "h"):
        return _help(parser, args.topic)
    args.ctl_build = build_parser  # `completion` lists every command
    return run(args)


def run(args: argparse.Namespace) -> int:
    from cri_proxy.ctl import options
    from cri_proxy.ctl.errors import CtlError

    module_name, _, function = str(args.ctl_handler).partition(":")
    handler = getattr(importlib.import_module(f"cri_proxy.ctl.{module_name}"), function)
    try:
        if getattr(args, "ctl_offline", False):  # needs no runtime: config, completion
            code: int = handler(args)
        else:
            from cri_proxy.ctl.conn import Conn

            settings = options.resolve(args, os.environ)
            with Conn(settings) as conn:
                code = handler(args, conn)
    except CtlError as exc:
        print(f"cri-proxy ctl: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `ctl ps | head`
        sys.stderr.close()
        return 0
    return code
