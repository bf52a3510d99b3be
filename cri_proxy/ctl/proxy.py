"""What only the proxy knows, from its introspection service (`/cri_proxy.v1.Introspect/<Method>`,
JSON answers): `cpusets`, `snapshot`, `plan`, `status`, `pools`, `problems`."""

from __future__ import annotations

import argparse
import json
from typing import Any

import grpc

from cri_proxy.ctl.conn import Conn, describe
from cri_proxy.ctl.errors import CtlError
from cri_proxy.ctl.output import plain_table, to_yaml

INTROSPECT = "/cri_proxy.v1.Introspect/"


def ask(conn: Conn, method: str, command_name: str) -> Any:
    """The JSON the proxy's introspection `method` answers."""
    s = conn.settings
    if s.bypass:
        raise CtlError(f"`{command_name}` asks the proxy itself; it cannot be used with --bypass")
    client = conn.client(s.runtime_endpoint)
    conn.debug(f"{INTROSPECT}{method}")
    try:
        reply: bytes = client.raw(INTROSPECT + method, b"", timeout=s.timeout)
    except grpc.RpcError as exc:
        if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
            raise CtlError(f"{s.runtime_endpoint} is not a cri-proxy (no introspection service)") from None
        raise CtlError(describe(exc, s.runtime_endpoint, "proxy", s.timeout)) from None
    try:
        return json.loads(reply)
    except ValueError:
        raise CtlError(
            f"the proxy at {s.runtime_endpoint} answered {method} with something not JSON"
        ) from None


def _dump(data: Any, fmt: str = "json") -> None:
    print(to_yaml(data).rstrip("\n") if fmt == "yaml" else json.dumps(data, indent=2))


def cpusets(args: argparse.Namespace, conn: Conn) -> int:
    rows = ask(conn, "Cpusets", "cpusets")
    if args.output != "table":
        _dump(rows, args.output)
        return 0
    keys = ("pod", "container", "id", "state", "qos", "decided", "applied", "why")
    body = [["-" if r[k] is None else str(r[k])[:13] if k == "id" else str(r[k]) for k in keys] for r in rows]
    print(plain_table([k.upper() for k in keys], body))
    return 0


def snapshot(args: argparse.Namespace, conn: Conn) -> int:
    _dump(ask(conn, "Snapshot", "snapshot"))
    return 0


def plan(args: argparse.Namespace, conn: Conn) -> int:
    _dump(ask(conn, "Plan", "plan"))
    return 0


def flatten(data: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, value) rows of a JSON document, for a two-column table."""
    if isinstance(data, dict):
        rows: list[tuple[str, str]] = []
        for key, value in data.items():
            rows += flatten(value, f"{prefix}.{key}" if prefix else str(key))
        return rows or [(prefix, "-")]
    if isinstance(data, list):
        if all(not isinstance(v, dict | list) for v in data):
            return [(prefix, ", ".join(str(v) for v in data) or "-")]
        return [row for i, value in enumerate(data) for row in flatten(value, f"{prefix}[{i}]")]
    text = "-" if data is None else str(data).lower() if isinstance(data, bool) else str(data)
    return [(prefix, text)]


def status(args: argparse.Namespace, conn: Conn) -> int:
    """A table by default (one row per figure), or the document with -o json|yaml."""
    found = ask(conn, "Status", "status")
    if args.output != "table":
        _dump(found, args.output)
        return 0
    print(plain_table(("KEY", "VALUE"), flatten(found)))
    return 0


def pools(args: argparse.Namespace, conn: Conn) -> int:
    found = ask(conn, "Plan", "pools").get("pools", {})
    if args.output != "table":
        _dump(found, args.output)
        return 0
    body = [[pool.upper(), cpus or "-"] for pool, cpus in found.items()]
    print(plain_table(("POOL", "CPUS"), body))
    return 0


def problems(args: argparse.Namespace, conn: Conn) -> int:
    found = ask(conn, "Plan", "problems").get("problems", [])
    if args.output != "table":
        _dump(found, args.output)
        return 0
    body = [[str(p.get("pod") or "-"), str(p.get("kind", "")), str(p.get("message", ""))] for p in found]
    print(plain_table(("POD", "KIND", "MESSAGE"), body))
    return 0
