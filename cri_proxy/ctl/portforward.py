"""`port-forward POD [LOCAL:]REMOTE...`: local TCP ports to ports in the pod, through the runtime's
streaming server (websocket, `v4.channel.k8s.io`, `?ports=REMOTE`: channel 0 carries the data,
channel 1 errors; each channel's first message is the port, two bytes little-endian).

One PortForward call and one websocket per accepted connection, as a session serves one stream
per port. Runs until Ctrl-C.
"""

from __future__ import annotations

import argparse
import selectors
import socket
import sys
import threading
from typing import Any

from cri_proxy.ctl import resolve, stream
from cri_proxy.ctl.conn import Conn
from cri_proxy.ctl.errors import CtlError

DATA, ERROR = 0, 1


def parse_ports(specs: list[str]) -> list[tuple[int, int]]:
    """[(local, remote)] from `8080:80`, `80` (same port) or `:80` (any free local port: 0)."""
    pairs = []
    for spec in specs:
        local, colon, remote = spec.rpartition(":")
        if not colon:
            local = remote
        try:
            pair = (int(local) if local else 0, int(remote))
        except ValueError:
            raise CtlError(f"invalid port specification {spec!r}: [LOCAL_PORT:]REMOTE_PORT") from None
        if not (0 <= pair[0] < 65536 and 0 < pair[1] < 65536):
            raise CtlError(f"invalid port specification {spec!r}: ports are 1-65535")
        pairs.append(pair)
    return pairs


def _relay(client: socket.socket, ws: stream.WebSocket, port: int) -> None:
    """Bytes both ways until either side ends."""

    def upstream() -> None:
        try:
            while data := client.recv(32768):
                ws.send(bytes([DATA]) + data)
        except OSError:
            pass
        ws.close()

    threading.Thread(target=upstream, daemon=True).start()
    seen: set[int] = set()
    try:
        while (message := ws.receive()) is not None and message[0] != stream.CLOSE:
            payload = message[1]
            if not payload:
                continue
            channel, data = payload[0], payload[1:]
            if channel not in seen:  # the first message of a channel names its port
                seen.add(channel)
                data = data[2:]
            if channel == DATA and data:
                client.sendall(data)
            elif channel == ERROR and data:
                print(f"cri-proxy ctl: port {port}: {data.decode(errors='replace')}", file=sys.stderr)
    except OSError:
        pass
    finally:
        client.close()


def port_forward(args: argparse.Namespace, conn: Conn) -> int:
    if not args.pod or not args.ports:
        args.ctl_parser.print_help()
        return 0
    pairs = parse_ports(args.ports)
    pod = resolve.pod(conn, args.pod)
    tls = stream.tls_of(args)
    lock = threading.Lock()  # one CRI connection, shared by the connection threads
    selector = selectors.DefaultSelector()
    for local, remote in pairs:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("127.0.0.1", local))
        except OSError as exc:
            raise CtlError(f"unable to listen on port {local}: {exc.strerror}") from None
        listener.listen()
        bound = listener.getsockname()[1]
        print(f"Forwarding from 127.0.0.1:{bound} -> {remote}", flush=True)
        selector.register(listener, selectors.EVENT_READ, (bound, remote))

    def serve(client: socket.socket, local: int, remote: int) -> None:
        try:
            with lock:
                url = conn.runtime(
                    "PortForward", conn.pb.PortForwardRequest(pod_sandbox_id=pod.id, port=[remote])
                ).url
            ws = stream.WebSocket.open(
                url, stream.CHANNEL_PROTOCOL, tls, conn.settings.timeout, f"ports={remote}"
            )
        except CtlError as exc:
            print(f"cri-proxy ctl: port {local}: {exc}", file=sys.stderr, flush=True)
            client.close()
            return
        _relay(client, ws, remote)

    while True:
        for key, _ in selector.select():
            ready: Any = key.fileobj
            client, _ = ready.accept()
            local, remote = key.data
            print(f"Handling connection for {local}", flush=True)
            threading.Thread(target=serve, args=(client, local, remote), daemon=True).start()
