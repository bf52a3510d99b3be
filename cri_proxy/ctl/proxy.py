"""What only the proxy knows, from its introspection service (`/cri_proxy.v1.Introspect/<Method>`,
JSON answers) on its admin socket: `cpusets`, `snapshot`, `plan`, `status`, `pools`, `problems`
(`cpus` is in `cri_proxy.ctl.cpus`), and the check `ctl update --cpuset-cpus` makes first."""

from __future__ import annotations

import argparse
import errno
import json
import socket
from typing import Any

from cri_proxy.ctl.conn import Conn, describe
from cri_proxy.ctl.errors import CtlError
from cri_proxy.ctl.h2unary import RpcFailure, TooLarge
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


def ask(conn: Conn, method: str, command_name: str, body: Any = None) -> Any:
    """The JSON the proxy's introspection `method` answers, asked on its admin socket (over the
    light HTTP/2 client: grpcio is imported only for a request too large for it)."""
    s = conn.settings
    if s.bypass:
        raise CtlError(f"`{command_name}` asks the proxy itself; it cannot be used with --bypass")
    endpoint = s.admin_endpoint
    conn.debug(f"{INTROSPECT}{method} on {endpoint}")
    path = INTROSPECT + method
    request = b"" if body is None else json.dumps(body).encode()
    try:
        try:
            wire = conn.wire(endpoint)
            if wire is None:
                raise TooLarge(path)
            reply = wire.unary(path, request, s.timeout)
        except TooLarge:
            reply = _ask_grpc(conn, endpoint, path, request)
    except RpcFailure as exc:
        raise _failure(exc, endpoint, s.timeout) from None
    try:
        return json.loads(reply)
    except ValueError:
        raise CtlError(f"the proxy at {endpoint} answered {method} with something not JSON") from None


def _ask_grpc(conn: Conn, endpoint: str, path: str, request: bytes) -> bytes:
    import grpc

    try:
        reply: bytes = conn.client(endpoint).raw(path, request, timeout=conn.settings.timeout)
    except grpc.RpcError as exc:
        raise _failure(exc, endpoint, conn.settings.timeout) from None
    return reply


def _failure(exc: Exception, endpoint: str, timeout: float | None) -> CtlError:
    """What the admin socket's failure means (grpcio's RpcError or the light client's RpcFailure)."""
    code = exc.code().name if hasattr(exc, "code") else ""
    if code == "UNIMPLEMENTED":
        return CtlError(f"{endpoint} is not a cri-proxy admin socket (no introspection service)")
    if code == "UNAVAILABLE":
        trouble = admin_trouble(endpoint)
        if trouble is not None:
            return CtlError(trouble)
    return CtlError(describe(exc, endpoint, "proxy", timeout))


def _dump(data: Any, fmt: str = "json") -> None:
    print(to_yaml(data).rstrip("\n") if fmt == "yaml" else json.dumps(data, indent=2))


def dry_run_note(found: Any) -> str:
    """The line under a table that says the proxy changes nothing, or the runtime was not listed."""
    notes = []
    if isinstance(found, dict) and found.get("runtime"):
        notes.append(str(found["runtime"]))
    dry = found.get("dry_run") if isinstance(found, dict) else any(r.get("dry_run") for r in found)
    if dry:
        notes.append("dry-run: the proxy decides and reports, changes nothing (DECIDED is not applied)")
    return "\n".join(notes)


CPUSET_KEYS = ("pod", "container", "id", "state", "qos", "decided", "actual", "mark", "why")


def cpusets(args: argparse.Namespace, conn: Conn) -> int:
    """Every container the runtime has: decided vs the set it really has, marked where they differ."""
    rows = ask(conn, "Cpusets", "cpusets")
    if args.output != "table":
        _dump(rows, args.output)
        return 0
    body = [
        ["-" if r.get(k) in (None, "") else str(r[k])[:13] if k == "id" else str(r[k]) for k in CPUSET_KEYS]
        for r in rows
    ]
    print(plain_table([k.upper() for k in CPUSET_KEYS], body))
    note = dry_run_note(rows)
    if note:
        print(note)
    return 0


def check_update(conn: Conn, container_id: str, cpuset: str, force: bool) -> None:
    """`ctl update --cpuset-cpus` asks the proxy first: a container whose cpuset it manages is
    refused with the reason, unless `--force` (the proxy then pins the set and keeps it)."""
    if conn.settings.bypass or not cpuset:
        return
    found = ask(conn, "Pin", "update", {"id": container_id, "cpuset": cpuset, "force": force})
    if found.get("refused"):
        raise CtlError(str(found["refused"]))


def unpin(conn: Conn, container_id: str) -> None:
    """`ctl update --unpin`: the proxy drops the operator's pin and goes back to the rules' cpuset."""
    found = ask(conn, "Unpin", "update --unpin", {"id": container_id})
    if found.get("refused"):
        raise CtlError(str(found["refused"]))


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


def _member(c: dict[str, Any]) -> str:
    mark = f" [{c['mark']}]" if c.get("mark") else ""
    return f"{c['pod'] or '?'} {c['container']}{mark}"


def pools(args: argparse.Namespace, conn: Conn) -> int:
    """Each pool's CPUs and every container decided onto it (DRIFT etc. marked)."""
    found = ask(conn, "Pools", "pools")
    if args.output != "table":
        _dump(found, args.output)
        return 0
    body = [
        [
            p["pool"],
            "-" if p["cpus"] is None else p["cpus"] or "(empty)",
            ", ".join(_member(c) for c in p["containers"]) or "-",
        ]
        for p in found["pools"]
    ]
    print(plain_table(("POOL", "CPUS", "CONTAINERS"), body))
    note = dry_run_note(found)
    if note:
        print(note)
    return 0


def problems(args: argparse.Namespace, conn: Conn) -> int:
    """The decision's problems and what the runtime shows (exclusivity broken, drift)."""
    found = ask(conn, "Problems", "problems")
    if args.output != "table":
        _dump(found, args.output)
        return 0
    body = [
        [str(p.get("pod") or "-"), str(p.get("kind", "")), str(p.get("message", ""))]
        for p in found["problems"]
    ]
    print(plain_table(("POD", "KIND", "MESSAGE"), body))
    note = dry_run_note(found)
    if note:
        print(note)
    return 0
