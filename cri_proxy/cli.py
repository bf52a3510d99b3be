"""The `cri-proxy` console script: one entry point, one module per subcommand."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cri_proxy import __version__
from cri_proxy.commands import ctl, fake_runtime, plan, serve

_COMMANDS = (serve, fake_runtime, plan, ctl)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cri-proxy",
        description="CRI proxy that places containers on CPUs by Koordinator's QoS rules.",
    )
    parser.add_argument("--version", action="version", version=f"cri-proxy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in _COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
