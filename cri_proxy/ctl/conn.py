"""The CRI channels of one `ctl` run, and gRPC failures turned into one line for people.

Each failure names the endpoint and who was expected there: the proxy, or the runtime when
`--bypass` was given. A proxy that answers UNAVAILABLE is up, and its runtime is not: said so.
"""

from __future__ import annotations

import json
import sys
from types import TracebackType
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from cri_api.v1 import api_pb2
from cri_proxy.client import CriClient
from cri_proxy.ctl.errors import CtlError
from cri_proxy.ctl.options import Settings


def _proxy_answers(endpoint: str) -> bool:
    from cri_proxy.endpoints import socket_answers, socket_path
    from cri_proxy.errors import EndpointError

    try:
        path = socket_path(endpoint)
    except EndpointError:
        return False
    return path is not None and socket_answers(path)


def describe(error: grpc.RpcError, endpoint: str, role: str, timeout: float | None) -> str:
    """One line: unreachable, too slow, or what the server answered."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    if code is grpc.StatusCode.UNAVAILABLE:
        if role == "proxy" and _proxy_answers(endpoint):
            return (
                f"the proxy at {endpoint} answered UNAVAILABLE (its runtime may be down; "
                f"--bypass talks to the runtime directly): {details}"
            )
        hint = " (is cri-proxy running? --bypass talks to the runtime directly)" if role == "proxy" else ""
        return f"cannot reach the {role} at {endpoint}{hint}: {details}"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED and timeout is not None:
        return f"the {role} at {endpoint} did not answer within {timeout:g}s (--timeout)"
    name = code.name if code is not None else "UNKNOWN"
    return f"the {role} at {endpoint} answered {name}: {details}"


def to_json_line(message: Message) -> str:
    return json.dumps(json_format.MessageToDict(message), separators=(",", ":"))


class Conn:
    """`conn.runtime("ListContainers", pb.ListContainersRequest())`; channels open on first use."""

    def __init__(self, settings: Settings, version: str = "v1") -> None:
        self.settings = settings
        self.version = version
        self.pb: Any = api_pb2
        self._clients: dict[str, CriClient] = {}

    def client(self, endpoint: str) -> CriClient:
        if endpoint not in self._clients:
            self._clients[endpoint] = CriClient(endpoint, self.version, timeout=self.settings.timeout)
        return self._clients[endpoint]

    def endpoint_of(self, service: str) -> str:
        s = self.settings
        return s.image_endpoint if service == "ImageService" else s.runtime_endpoint

    def debug(self, text: str) -> None:
        if self.settings.debug:
            print(f"DEBU {text}", file=sys.stderr, flush=True)

    def fail(self, error: grpc.RpcError, service: str, timeout: float | None) -> CtlError:
        return CtlError(describe(error, self.endpoint_of(service), self.settings.role, timeout))

    def call(self, service: str, method: str, request: Message, timeout: float | None = -1.0) -> Any:
        """One unary call; `timeout=None` waits as long as it takes, -1 means the global timeout."""
        endpoint = self.endpoint_of(service)
        client = self.client(endpoint)
        stub = client.image if service == "ImageService" else client.runtime
        wait = self.settings.timeout if timeout is not None and timeout < 0 else timeout
        self.debug(f"{method}Request: {to_json_line(request)}")
        try:
            response = getattr(stub, method)(request, timeout=wait)
        except grpc.RpcError as exc:
            raise self.fail(exc, service, wait) from None
        self.debug(f"{method}Response: {to_json_line(response)}")
        return response

    def runtime(self, method: str, request: Message, timeout: float | None = -1.0) -> Any:
        return self.call("RuntimeService", method, request, timeout)

    def image(self, method: str, request: Message, timeout: float | None = -1.0) -> Any:
        return self.call("ImageService", method, request, timeout)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def __enter__(self) -> Conn:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
