"""`cri-proxy ctl`: ask the running proxy what it decided (the crictl-compatible part comes later)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from cri_proxy.config import DEFAULT_LISTEN

INTROSPECT = "/cri_proxy.v1.Introspect/"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "ctl",
        help="inspect the running proxy",
        description="Ask a running cri-proxy what it decided and why.",
    )
    p.add_argument(
        "-r",
        "--runtime-endpoint",
        default=os.environ.get("CONTAINER_RUNTIME_ENDPOINT", DEFAULT_LISTEN),
        help=f"the proxy's endpoint (default {DEFAULT_LISTEN})",
    )
    p.add_argument("-t", "--timeout", type=float, default=10.0, help="seconds (default 10)")
    cmds = p.add_subparsers(dest="ctl_command", required=True, metavar="COMMAND")
    c = cmds.add_parser("cpusets", help="every container: QoS, decided and applied cpuset, why")
    c.add_argument("-o", "--output", choices=("table", "json"), default="table")
    cmds.add_parser("snapshot", help="the live node snapshot, in `cri-proxy plan` input format")
    cmds.add_parser("plan", help="the live decisions, in `cri-proxy plan` output format")
    cmds.add_parser("status", help="pods and containers tracked, reconcile counters")
    p.set_defaults(func=run)


def _ask(endpoint: str, method: str, timeout: float) -> Any:
    import grpc

    from cri_proxy.endpoints import grpc_target

    with grpc.insecure_channel(grpc_target(endpoint)) as channel:
        try:
            reply: bytes = channel.unary_unary(INTROSPECT + method, None, None)(b"", timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if code is grpc.StatusCode.UNAVAILABLE:
                raise SystemExit(
                    f"cri-proxy ctl: cannot reach the proxy at {endpoint}: {exc.details()}"
                ) from None
            if code is grpc.StatusCode.UNIMPLEMENTED:
                raise SystemExit(
                    f"cri-proxy ctl: {endpoint} is not a cri-proxy (no introspection service)"
                ) from None
            raise SystemExit(f"cri-proxy ctl: the proxy at {endpoint} answered {exc}") from None
    return json.loads(reply)


def _table(rows: list[dict[str, Any]]) -> str:
    heads = ("POD", "CONTAINER", "ID", "STATE", "QOS", "DECIDED", "APPLIED", "WHY")
    keys = ("pod", "container", "id", "state", "qos", "decided", "applied", "why")
    body = [
        [("-" if r[k] is None else str(r[k])[:13] if k == "id" else str(r[k])) for k in keys] for r in rows
    ]
    widths = [max([len(h)] + [len(line[i]) for line in body]) for i, h in enumerate(heads)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in body]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    method = {"cpusets": "Cpusets", "snapshot": "Snapshot", "plan": "Plan", "status": "Status"}[
        args.ctl_command
    ]
    data = _ask(args.runtime_endpoint, method, args.timeout)
    if args.ctl_command == "cpusets" and args.output == "table":
        print(_table(data))
    else:
        json.dump(data, sys.stdout, indent=2)
        print()
    return 0
