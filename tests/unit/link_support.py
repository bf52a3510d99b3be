"""An in-process frame-relay link between two h2 peers on recording transports (no sockets):
what the asyncio adapter writes, and when, read frame by frame."""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection

from cri_api.v1 import api_pb2 as pb
from cri_proxy.config import Config
from cri_proxy.relay.hooks import HookTable
from cri_proxy.relay.transport import FrameRelay, Link

PATH = "/runtime.v1.RuntimeService/CreateContainer"


class Transport:
    """Records every write (one entry per `write`/`writelines` call) into a shared log."""

    def __init__(self, name: str, log: list[tuple[str, bytes]]) -> None:
        self.name, self.log = name, log

    def write(self, data: bytes) -> None:
        self.log.append((self.name, bytes(data)))

    def writelines(self, chunks: Any) -> None:
        self.log.append((self.name, b"".join(bytes(c) for c in chunks)))

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def frames(data: bytes) -> list[int]:
    """The frame types in `data` (HTTP/2 frames, no preface)."""
    out, at = [], 0
    while at + 9 <= len(data):
        length = int.from_bytes(data[at : at + 3], "big")
        out.append(data[at + 3])
        at += 9 + length
    return out


def connected(
    table: HookTable, log: list[tuple[str, bytes]], window: int = 0, relay: FrameRelay | None = None
) -> tuple[Link, h2.connection.H2Connection, h2.connection.H2Connection]:
    """A Link between an h2 client and an h2 server (the runtime) on recording transports, the
    handshake done both ways; `window`: more connection window the server gives at once; `relay`:
    the relay it is one of the links of (else one of its own)."""
    if relay is None:
        relay = FrameRelay(Config(runtime_endpoint="unix:///nonexistent/runtime.sock"), table)
    link = Link(relay)
    link.client = Transport("client", log)  # type: ignore[assignment]
    link.runtime_up(Transport("runtime", log))  # type: ignore[arg-type]
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    client.initiate_connection()
    server.initiate_connection()
    if window:
        server.increment_flow_control_window(window)
    link.data_received(client.data_to_send())
    link.runtime_data(server.data_to_send())
    for who, data in log:
        (server if who == "runtime" else client).receive_data(data)
    link.data_received(client.data_to_send())
    link.runtime_data(server.data_to_send())
    log.clear()
    return link, client, server


def send_call(client: h2.connection.H2Connection, body: bytes, path: str = PATH) -> int:
    """A request to `path` (CreateContainer) with `body`, HEADERS and DATA queued on `client`: its
    stream id."""
    sid: int = client.get_next_available_stream_id()
    client.send_headers(
        sid,
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "x"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ],
    )
    client.send_data(sid, b"\0" + len(body).to_bytes(4, "big") + body, end_stream=True)
    return sid


def answer_create(server: h2.connection.H2Connection, sid: int, status: str) -> bytes:
    """The runtime's answer to CreateContainer `sid`: container c1 (status "0"), else `status`."""
    reply = pb.CreateContainerResponse(container_id="c1").SerializeToString()
    server.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
    if status == "0":
        server.send_data(sid, b"\0" + len(reply).to_bytes(4, "big") + reply)
    server.send_headers(sid, [("grpc-status", status)], end_stream=True)
    return server.data_to_send()
