"""The runtime's streaming server, as `exec` (without -s), `attach` and `port-forward` use it.

Exec, Attach and PortForward answer a URL on the runtime's own streaming server; the session runs
there, not through the proxy. crictl speaks SPDY or websocket to it; ctl speaks websocket with
Kubernetes' channel protocol `v4.channel.k8s.io` (what containerd 1.6 offers; its server refuses
`v5.channel.k8s.io`): every binary message starts with a channel byte, 0 stdin, 1 stdout, 2 stderr,
3 the final status (JSON), 4 terminal resizes. v4 has no way to end stdin alone, so when ctl's
stdin ends the session stays open until the command exits on its own (said once on stderr).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import ssl
import struct
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from cri_proxy.ctl.errors import CtlError

CHANNEL_PROTOCOL = "v4.channel.k8s.io"
PORT_FORWARD_PROTOCOL = "portforward.k8s.io"
STDIN, STDOUT, STDERR, ERROR, RESIZE = 0, 1, 2, 3, 4
TEXT, BINARY, CLOSE, PING, PONG = 0x1, 0x2, 0x8, 0x9, 0xA
DETACH = b"\x10\x11"  # Ctrl-P Ctrl-Q


@dataclass(frozen=True, slots=True)
class Tls:
    """crictl's --tls-ca/--tls-cert/--tls-key/--tls-sni, for a streaming server on https."""

    ca: str = ""
    cert: str = ""
    key: str = ""
    server_name: str = "localhost"


def tls_of(args: Any) -> Tls:
    return Tls(args.tls_ca or "", args.tls_cert or "", args.tls_key or "", args.tls_sni or "localhost")


def _context(tls: Tls) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=tls.ca or None)
    if tls.cert:
        context.load_cert_chain(tls.cert, tls.key or None)
    return context


class WebSocket:
    """A client websocket (RFC 6455) on one socket: masked frames out, whole messages in."""

    def __init__(self, sock: socket.socket, leftover: bytes) -> None:
        self.sock = sock
        self.buffer = leftover
        self.lock = threading.Lock()

    @classmethod
    def open(cls, url: str, protocol: str, tls: Tls, timeout: float, query: str = "") -> WebSocket:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https", "ws", "wss"):
            raise CtlError(f"the runtime's streaming URL {url!r} is neither http nor https")
        secure = parts.scheme in ("https", "wss")
        port = parts.port or (443 if secure else 80)
        try:
            sock = socket.create_connection((parts.hostname or "localhost", port), timeout=timeout)
            if secure:
                sock = _context(tls).wrap_socket(sock, server_hostname=tls.server_name)
        except (OSError, ssl.SSLError) as exc:
            raise CtlError(f"cannot reach the runtime's streaming server at {url}: {exc}") from None
        path = parts.path or "/"
        if parts.query or query:
            path += "?" + "&".join(q for q in (parts.query, query) if q)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Protocol: {protocol}\r\n\r\n"
        )
        answer = b""
        try:
            sock.sendall(request.encode())
            while b"\r\n\r\n" not in answer:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
        except OSError as exc:
            sock.close()
            raise CtlError(f"the runtime's streaming server at {url}: {exc}") from None
        head, _, rest = answer.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].decode(errors="replace")
        if " 101 " not in status + " ":
            sock.close()
            body = rest.decode(errors="replace").strip()
            raise CtlError(
                f"the runtime's streaming server refused a websocket session ({protocol}): {status}"
                + (f": {body}" if body else "")
                + " (ctl speaks websocket only, not SPDY)"
            )
        sock.settimeout(None)
        return cls(sock, rest)

    def send(self, payload: bytes, opcode: int = BINARY) -> None:
        mask = os.urandom(4)
        size = len(payload)
        if size < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | size)
        elif size < 65536:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, size)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, size)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        with self.lock:
            self.sock.sendall(head + mask + masked)

    def _read(self, n: int) -> bytes | None:
        while len(self.buffer) < n:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                return None
            if not chunk:
                return None
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def receive(self) -> tuple[int, bytes] | None:
        """The next whole message (opcode, payload); None when the connection ended."""
        message, opcode = b"", 0
        while True:
            head = self._read(2)
            if head is None:
                return None
            fin, op, size = head[0] & 0x80, head[0] & 0x0F, head[1] & 0x7F
            if size == 126:
                raw = self._read(2)
                size = struct.unpack("!H", raw)[0] if raw else 0
            elif size == 127:
                raw = self._read(8)
                size = struct.unpack("!Q", raw)[0] if raw else 0
            mask = self._read(4) if head[1] & 0x80 else b""
            payload = self._read(size) if size else b""
            if payload is None or mask is None:
                return None
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if op == PING:
                self.send(payload, PONG)
                continue
            if op in (TEXT, BINARY, CLOSE):
                opcode = op
            message += payload
            if fin:
                return opcode, message

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.send(struct.pack("!H", 1000), CLOSE)
        self.sock.close()


def _terminal_size() -> bytes:
    size = os.get_terminal_size(sys.stdout.fileno())
    return json.dumps({"Width": size.columns, "Height": size.lines}).encode()


def _pump_stdin(ws: WebSocket, source: BinaryIO, ended: threading.Event, tty: bool) -> None:
    """stdin to channel 0 until it ends; said once if the session still runs a second later
    (v4 cannot pass the end of input on). With -t, Ctrl-P Ctrl-Q detaches, as in crictl."""
    fd = source.fileno()
    while True:
        try:
            data = os.read(fd, 32768)
        except OSError:
            return
        if tty and DETACH in data:
            ws.send(bytes([STDIN]) + data[: data.index(DETACH)])
            ws.sock.shutdown(socket.SHUT_RDWR)  # ends the session loop; the command keeps running
            return
        if not data:
            if ended.wait(1.0):
                return
            print(
                "cri-proxy ctl: stdin ended; the runtime's websocket protocol "
                f"({CHANNEL_PROTOCOL}) cannot pass that on: the command runs until it exits (Ctrl-C stops)",
                file=sys.stderr,
                flush=True,
            )
            return
        try:
            ws.send(bytes([STDIN]) + data)
        except OSError:
            return


def session(url: str, tls: Tls, timeout: float, stdin: bool, tty: bool) -> dict[str, Any] | None:
    """Run an exec or attach session: stdin (-i) in, stdout/stderr out, in raw mode for -t on a
    terminal. The final status the server sent (a Kubernetes Status), or None when it sent none."""
    if tty and not stdin:  # crictl's rule, checked where it checks it: after the Exec/Attach call
        raise CtlError("tty=true must be specified with interactive=true")
    ws = WebSocket.open(url, CHANNEL_PROTOCOL, tls, timeout)
    restore: Callable[[], None] | None = None
    if tty and stdin and sys.stdin.isatty():
        import termios
        import tty as ttymod

        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
        ttymod.setraw(fd)

        def restore() -> None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)

    if tty and sys.stdout.isatty():
        with contextlib.suppress(OSError):
            ws.send(bytes([RESIZE]) + _terminal_size())
        import signal

        signal.signal(signal.SIGWINCH, lambda *_: ws.send(bytes([RESIZE]) + _terminal_size()))
    ended = threading.Event()
    if stdin:
        threading.Thread(target=_pump_stdin, args=(ws, sys.stdin.buffer, ended, tty), daemon=True).start()
    outputs = {STDOUT: sys.stdout.buffer, STDERR: sys.stderr.buffer}
    status: dict[str, Any] | None = None
    try:
        while True:
            message = ws.receive()
            if message is None or message[0] == CLOSE:
                break
            payload = message[1]
            if not payload:
                continue
            channel, data = payload[0], payload[1:]
            if channel in outputs and data:
                outputs[channel].write(data)
                outputs[channel].flush()
            elif channel == ERROR and data:
                try:
                    status = json.loads(data)
                except ValueError:
                    status = {"status": "Failure", "message": data.decode(errors="replace")}
    finally:
        ended.set()
        if restore is not None:
            restore()
        ws.close()
    return status


def exit_code(status: dict[str, Any] | None) -> int | None:
    """The command's exit code from a final Status: 0 for Success, N for NonZeroExitCode; None
    when the status is some other failure."""
    if status is None or status.get("status") == "Success":
        return 0
    if status.get("reason") == "NonZeroExitCode":
        for cause in status.get("details", {}).get("causes", []):
            if cause.get("reason") == "ExitCode" and str(cause.get("message", "")).isdigit():
                return int(cause["message"])
    return None
