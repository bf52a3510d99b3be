"""The CRI channels of one `ctl` run, and gRPC failures turned into one line for people.

Each failure names the endpoint and who was expected there: the proxy, or the runtime when
`--bypass` was given. A proxy that answers UNAVAILABLE is up, and its runtime is not: said so.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any

from cri_proxy.ctl.errors import CtlError
from cri_proxy.ctl.h2unary import Connection, RpcFailure, TooLarge, address_of
from cri_proxy.ctl.options import Settings

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from cri_proxy.client import CriClient


def _proxy_answers(endpoint: str) -> bool:
    from cri_proxy.endpoints import socket_answers, socket_path
    from cri_proxy.errors import EndpointError

    try:
        path = socket_path(endpoint)
    except EndpointError:
        return False
    return path is not None and socket_answers(path)


def describe(error: Exception, endpoint: str, role: str, timeout: float | None) -> str:
    """One line: unreachable, too slow, or what the server answered (a grpcio RpcError or our
    RpcFailure: both have `code()` and `details()`)."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    name = code.name if code is not None else "UNKNOWN"
    if name == "UNAVAILABLE":
        if role == "proxy" and _proxy_answers(endpoint):
            return (
                f"the proxy at {endpoint} answered UNAVAILABLE (its runtime may be down; "
                f"--bypass talks to the runtime directly): {details}"
            )
        hint = " (is cri-proxy running? --bypass talks to the runtime directly)" if role == "proxy" else ""
        return f"cannot reach the {role} at {endpoint}{hint}: {details}"
    if name == "DEADLINE_EXCEEDED" and timeout is not None:
        return f"the {role} at {endpoint} did not answer within {timeout:g}s (--timeout)"
    return f"the {role} at {endpoint} answered {name}: {details}"


def to_json_line(message: Message) -> str:
    import json

    from google.protobuf import json_format

    return json.dumps(json_format.MessageToDict(message), separators=(",", ":"))


class Conn:
    """`conn.runtime("ListContainers", pb.ListContainersRequest())`; connections open on first use.

    Unary calls go over a plain HTTP/2 connection (`h2unary`: no grpcio to import); `client()`
    gives a grpcio client, for streams and for endpoints only grpcio can reach.
    """

    def __init__(self, settings: Settings, version: str = "v1") -> None:
        self.settings = settings
        self.version = version
        self._pb: Any = None
        self._clients: dict[str, CriClient] = {}
        self._wires: dict[str, Connection] = {}

    @property
    def pb(self) -> Any:
        """The CRI messages (`runtime.v1`), imported on first use."""
        if self._pb is None:
            from cri_api.v1 import api_pb2

            self._pb = api_pb2
        return self._pb

    def client(self, endpoint: str) -> CriClient:
        if endpoint not in self._clients:
            from cri_proxy.client import CriClient

            self._clients[endpoint] = CriClient(endpoint, self.version, timeout=self.settings.timeout)
        return self._clients[endpoint]

    def wire(self, endpoint: str) -> Connection | None:
        """The light connection to `endpoint`, or None when only grpcio can reach it."""
        if endpoint not in self._wires:
            address = address_of(endpoint)
            if address is None:
                return None
            self._wires[endpoint] = Connection(address, endpoint)
        return self._wires[endpoint]

    def endpoint_of(self, service: str) -> str:
        s = self.settings
        return s.image_endpoint if service == "ImageService" else s.runtime_endpoint

    def debug(self, text: str) -> None:
        if self.settings.debug:
            print(f"DEBU {text}", file=sys.stderr, flush=True)

    def fail(self, error: Exception, service: str, timeout: float | None) -> CtlError:
        return CtlError(describe(error, self.endpoint_of(service), self.settings.role, timeout))

    def call(self, service: str, method: str, request: Message, timeout: float | None = -1.0) -> Any:
        """One unary call; `timeout=None` waits as long as it takes, -1 means the global timeout."""
        endpoint = self.endpoint_of(service)
        wait = self.settings.timeout if timeout is not None and timeout < 0 else timeout
        if self.settings.debug:
            self.debug(f"{method}Request: {to_json_line(request)}")
        response_type = getattr(self.pb, f"{method}Response")
        wire = self.wire(endpoint)
        try:
            if wire is None:
                raise TooLarge(method)
            response = response_type.FromString(
                wire.unary(f"/runtime.{self.version}.{service}/{method}", request.SerializeToString(), wait)
            )
        except RpcFailure as exc:
            raise self.fail(exc, service, wait) from None
        except TooLarge:
            response = self._grpc_call(service, method, request, wait)
        if self.settings.debug:
            self.debug(f"{method}Response: {to_json_line(response)}")
        return response

    def call_raw(self, service: str, method: str, request: bytes) -> bytes:
        """One unary call with serialised messages, without importing the CRI messages."""
        endpoint = self.endpoint_of(service)
        path = f"/runtime.{self.version}.{service}/{method}"
        wait = self.settings.timeout
        wire = self.wire(endpoint)
        try:
            if wire is not None:
                return wire.unary(path, request, wait)
        except RpcFailure as exc:
            raise self.fail(exc, service, wait) from None
        except TooLarge:
            pass
        import grpc

        try:
            return self.client(endpoint).raw(path, request, wait)
        except grpc.RpcError as exc:
            raise self.fail(exc, service, wait) from None

    def _grpc_call(self, service: str, method: str, request: Message, wait: float | None) -> Any:
        import grpc

        client = self.client(self.endpoint_of(service))
        stub = client.image if service == "ImageService" else client.runtime
        try:
            return getattr(stub, method)(request, timeout=wait)
        except grpc.RpcError as exc:
            raise self.fail(exc, service, wait) from None

    def runtime(self, method: str, request: Message, timeout: float | None = -1.0) -> Any:
        return self.call("RuntimeService", method, request, timeout)

    def image(self, method: str, request: Message, timeout: float | None = -1.0) -> Any:
        return self.call("ImageService", method, request, timeout)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        for wire in self._wires.values():
            wire.close()
        self._wires.clear()

    def __enter__(self) -> Conn:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
