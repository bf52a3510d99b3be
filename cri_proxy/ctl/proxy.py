"""What only the proxy knows, from its introspection service (`/cri_proxy.v1.Introspect/<Method>`,
JSON answers) on its admin socket: `cpusets`, `snapshot`, `plan`, `status`, `pools`, `problems`."""

from __future__ import annotations

import argparse
import errno
import json
import socket
from typing import Any

import grpc

from cri_proxy.ctl.conn import Conn, describe
from cri_proxy.ctl.errors import CtlError
from cri_proxy.ctl.output import plain_table, to_yaml

INTROSPECT = "/cri_proxy.v1.Introspect/"


def admin_trouble(endpoint: str) -> str | None:
    """Why the admin socket at `endpoint` cannot be used, in one line; None when it accepts."""
    from cri_proxy.endpoints import socket_path
    from cri_proxy.errors import EndpointError

    try:
        path = socket_path(endpoint)
    except EndpointError as exc:
        return f"--admin-endpoint: {exc}"
    if path is None:
        return f"the proxy's admin socket must be a unix:// endpoint, not {endpoint!r} (--admin-endpoint)"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2.0)
        try:
            sock.connect(str(path))
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                return (
                    f"permission denied on the proxy's admin socket {path} "
                    "(root only, unless the proxy's admin_socket_group names one of your groups)"
                )
            hint = "is cri-proxy running? --admin-endpoint names another socket"
            return f"cannot reach the proxy's admin socket {path} ({hint}): {exc.strerror or exc}"
    return None


def ask(conn: Conn, method: str, command_name: str) -> Any:
    """The JSON the proxy's introspection `method` answers, asked on its admin socket."""
    s = conn.settings
    if s.bypass:
        raise CtlError(f"`{command_name}` asks the proxy itself; it cannot be used with --bypass")
    endpoint = s.admin_endpoint
    conn.debug(f"{INTROSPECT}{method} on {endpoint}")
    try:
        client = conn.client(endpoint)
        reply: bytes = client.raw(INTROSPECT + method, b"", timeout=s.timeout)
    except grpc.RpcError as exc:
        if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
            raise CtlError(f"{endpoint} is not a cri-proxy admin socket (no introspection service)") from None
        if exc.code() is grpc.StatusCode.UNAVAILABLE:
            trouble = admin_trouble(endpoint)
            if trouble is not None:
                raise CtlError(trouble) from None
        raise CtlError(describe(exc, endpoint, "proxy", s.timeout)) from None
    try:
        return json.loads(reply)
    except ValueError:
        raise CtlError(f"the proxy at {endpoint} answered {method} with something not JSON") from None


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
