"""`logs`: read the container's log file, found by ContainerStatus.log_path, as crictl does.

The file is in the CRI log format, one line per chunk: `<RFC3339Nano time> <stream> <tag> <text>`,
the tag `P` for a partial line (continued by the next chunk) and `F` for a full one. Lines of the
stdout stream go to stdout, of stderr to stderr; `--timestamps` prefixes each chunk's time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, BinaryIO

from cri_proxy.ctl import resolve
from cri_proxy.ctl.conn import Conn
from cri_proxy.ctl.errors import CtlError

_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)$")
_UNIT_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}


@dataclass(frozen=True, slots=True)
class Chunk:
    time: bytes  # as written, RFC3339Nano
    stream: str  # "stdout" | "stderr"
    partial: bool
    text: bytes  # without the line's own newline

    @property
    def time_ns(self) -> int | None:
        return parse_time_ns(self.time.decode(errors="replace"))


def parse_time_ns(text: str) -> int | None:
    """Nanoseconds since the epoch of an RFC3339(Nano) time, or None."""
    m = _TIME.match(text)
    if not m:
        return None
    base = dt.datetime.fromisoformat(m.group(1) + ("+00:00" if m.group(3) == "Z" else m.group(3)))
    return int(base.timestamp()) * 10**9 + int((m.group(2) or "0").ljust(9, "0"))


def fixed_time(stamp: bytes) -> bytes:
    """A log time as crictl prints it with --timestamps: nine fraction digits, the zone kept
    (Go's "2006-01-02T15:04:05.000000000Z07:00"); a time in another shape is left as it is."""
    m = _TIME.match(stamp.decode(errors="replace"))
    if not m:
        return stamp
    return f"{m.group(1)}.{(m.group(2) or '').ljust(9, '0')}{m.group(3)}".encode()


def parse_line(line: bytes) -> Chunk | None:
    """One line of a CRI log file (without its newline), or None if it is not in that format."""
    parts = line.split(b" ", 3)
    if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr"):
        return None
    tag = parts[2].split(b":")[0]
    if tag not in (b"P", b"F"):
        return None
    return Chunk(parts[0], parts[1].decode(), tag == b"P", parts[3] if len(parts) == 4 else b"")


def parse_since(text: str, now_ns: int | None = None) -> int | None:
    """`--since`: an RFC3339 time, or a duration back from now (42m, 1h, 30s)."""
    if not text:
        return None
    now = time.time_ns() if now_ns is None else now_ns
    rel = _RELATIVE.match(text)
    if rel:
        return now - int(float(rel.group(1)) * _UNIT_NS[rel.group(2)])
    parsed = parse_time_ns(text if re.search(r"(Z|[+-]\d\d:\d\d)$", text) else text + "Z")
    if parsed is None:
        raise CtlError(f"--since: neither a time (2013-01-02T13:23:37Z) nor a duration (42m): {text!r}")
    return parsed


def _pod_log_directory(conn: Conn, pod_id: str) -> str:
    r = conn.runtime("PodSandboxStatus", conn.pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True))
    try:
        config = json.loads(r.info.get("info", "{}")).get("config", {})
    except ValueError:
        return ""
    directory = config.get("log_directory") or config.get("logDirectory") or ""
    return str(directory)


def log_path(conn: Conn, container: Any, previous: bool) -> str:
    """The log file of the container (of its previous attempt with `previous`)."""
    pb = conn.pb
    status = conn.runtime("ContainerStatus", pb.ContainerStatusRequest(container_id=container.id)).status
    path = str(status.log_path)
    if not path:
        raise CtlError("the container has not set log path")
    if not os.path.isabs(path):  # the runtime answered the config's relative path: join the pod's dir
        directory = _pod_log_directory(conn, container.pod_sandbox_id)
        if not directory:
            raise CtlError(
                f"the container's log path {path!r} is relative and its pod's log directory unknown"
            )
        path = os.path.join(directory, path)
    if previous:
        attempt = status.metadata.attempt
        if attempt == 0:
            raise CtlError(f"previous terminated container {status.metadata.name} not found")
        head, _, name = path.rpartition("/")
        ext = name[name.rfind(".") :] if "." in name else ""
        path = f"{head}/{attempt - 1}{ext}"
    return path


class Printer:
    """Writes chunks to stdout/stderr with --stream, --timestamps, --since and --limit-bytes."""

    def __init__(self, args: argparse.Namespace, since_ns: int | None) -> None:
        self.stream = args.stream
        self.timestamps = args.timestamps
        self.since_ns = since_ns
        self.left = args.limit_bytes if args.limit_bytes >= 0 else None

    @property
    def full(self) -> bool:
        return self.left is not None and self.left <= 0

    def write(self, line: bytes) -> None:
        chunk = parse_line(line)
        if chunk is None:  # not CRI format: pass it through
            self._emit(sys.stdout.buffer, line + b"\n")
            return
        if self.stream and chunk.stream != self.stream:
            return
        if self.since_ns is not None:
            at = chunk.time_ns
            if at is not None and at < self.since_ns:
                return
        data = chunk.text if chunk.partial else chunk.text + b"\n"
        if self.timestamps:
            data = fixed_time(chunk.time) + b" " + data
        self._emit(sys.stdout.buffer if chunk.stream == "stdout" else sys.stderr.buffer, data)

    def _emit(self, out: BinaryIO, data: bytes) -> None:
        if self.left is not None:
            data = data[: max(0, self.left)]
            self.left -= len(data)
        out.write(data)
        out.flush()


def logs(args: argparse.Namespace, conn: Conn) -> int:
    container = resolve.container(conn, args.container)
    if args.reopen:
        conn.runtime("ReopenContainerLog", conn.pb.ReopenContainerLogRequest(container_id=container.id))
        print("cri-proxy ctl: container logs reopened", file=sys.stderr)
    path = log_path(conn, container, args.previous)
    printer = Printer(args, parse_since(args.since))
    try:
        handle = open(path, "rb")  # noqa: SIM115 - kept open to follow
    except FileNotFoundError:
        raise CtlError(f"the container's log file {path} does not exist") from None
    except OSError as exc:
        raise CtlError(f"cannot read the container's log file {path}: {exc.strerror}") from None
    with handle:
        data = handle.read()
        complete, newline, rest = data.rpartition(b"\n")
        lines = complete.split(b"\n") if newline else []
        if rest and not args.follow:  # a last line without its newline yet
            lines.append(rest)
        if args.tail >= 0:
            lines = lines[-args.tail :] if args.tail else []
        for line in lines:
            if printer.full:
                return 0
            printer.write(line)
        if args.follow:
            _follow(conn, container.id, handle, rest, printer)
    return 0


def _follow(conn: Conn, container_id: str, handle: BinaryIO, rest: bytes, printer: Printer) -> None:
    """Print lines as they are written, until the container stops running (or Ctrl-C)."""
    pb = conn.pb
    checked = time.monotonic()
    running = True
    while not printer.full:
        data = handle.read()
        if not data:
            if not running:
                return
            if os.fstat(handle.fileno()).st_size < handle.tell():  # truncated: start over
                handle.seek(0)
                rest = b""
            time.sleep(0.1)
            if time.monotonic() - checked > 1.0:
                checked = time.monotonic()
                status = conn.runtime("ContainerStatus", pb.ContainerStatusRequest(container_id=container_id))
                running = status.status.state == pb.CONTAINER_RUNNING
            continue
        complete, newline, rest = (rest + data).rpartition(b"\n")
        if newline:
            for line in complete.split(b"\n"):
                printer.write(line)
