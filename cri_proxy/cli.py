"""The `cri-proxy` console script: one entry point, one module per subcommand.

Only the module of the command being run is imported (each imports its heavy parts when it runs),
so `cri-proxy ctl version` starts about as fast as crictl does (docs/performance.md).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from cri_proxy import __version__
from cri_proxy.exits import exit_process

# command name -> module in cri_proxy.commands
_COMMANDS = {"serve": "serve", "fake-runtime": "fake_runtime", "plan": "plan", "ctl": "ctl"}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or (`only`) the one command that is being run."""
    parser = argparse.ArgumentParser(
        prog="cri-proxy",
        description="CRI proxy that places containers on CPUs by Koordinator's QoS rules.",
    )
    parser.add_argument("--version", action="version", version=f"cri-proxy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in _COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"cri_proxy.commands.{module}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["ctl"]:  # crictl's parsing, exit codes and help: its own parser
        from cri_proxy.commands import ctl

        return ctl.main(words[1:])
    parser = build_parser(words[0] if words and words[0] in _COMMANDS else None)
    args = parser.parse_args(words)
    code: int = args.func(args)
    return code


def entry() -> None:
    """The console script: `main`, then an exit no daemon thread left behind can turn into a crash."""
    exit_process(main())


if __name__ == "__main__":
    entry()
