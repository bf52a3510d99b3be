"""`cri-proxy ctl`: the crictl-compatible debugging CLI, with pass-through to the runtime.

Only the argparse wiring lives here; the commands are in `cri_proxy.ctl`, imported when one runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from cri_proxy.ctl import parsers
from cri_proxy.ctl.options import add_global_flags


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "ctl",
        help="crictl-compatible CLI, through the proxy or straight to the runtime",
        description="crictl's commands, flags and output, through the proxy (or --bypass, straight to "
        "the runtime), plus what only the proxy knows: cpusets, snapshot, plan, status, pools, problems.",
    )
    add_global_flags(p)
    cmds = p.add_subparsers(dest="ctl_command", required=True, metavar="COMMAND")
    parsers.register(cmds)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cri_proxy.ctl import options
    from cri_proxy.ctl.conn import Conn
    from cri_proxy.ctl.errors import CtlError

    module_name, _, function = str(args.ctl_handler).partition(":")
    handler = getattr(importlib.import_module(f"cri_proxy.ctl.{module_name}"), function)
    try:
        settings = options.resolve(args, os.environ)
        with Conn(settings) as conn:
            code: int = handler(args, conn)
    except CtlError as exc:
        print(f"cri-proxy ctl: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `ctl ps | head`
        sys.stderr.close()
        return 0
    return code
