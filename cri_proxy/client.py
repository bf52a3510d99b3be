"""A small synchronous CRI client: the stubs of one API version on one channel.

Used by the tests, the demo and `cri-proxy ctl`; errors keep gRPC's status.
"""

from __future__ import annotations

from types import ModuleType, TracebackType
from typing import Any

import grpc

from cri_proxy.endpoints import grpc_target

MIB = 1024 * 1024


def api_modules(version: str = "v1") -> tuple[ModuleType, ModuleType]:
    """(messages, stubs) of `runtime.<version>`."""
    if version == "v1":
        from cri_api.v1 import api_pb2, api_pb2_grpc
    elif version == "v1alpha2":
        from cri_api.v1alpha2 import api_pb2, api_pb2_grpc  # type: ignore[no-redef]
    else:
        raise ValueError(f"unknown CRI API version {version!r} (v1 or v1alpha2)")
    return api_pb2, api_pb2_grpc


class CriClient:
    """`client.runtime.Version(client.pb.VersionRequest())`; `client.image.ListImages(...)`."""

    def __init__(
        self,
        endpoint: str,
        version: str = "v1",
        timeout: float | None = 10.0,
        max_message_bytes: int = 16 * MIB,
    ) -> None:
        self.endpoint = endpoint
        self.version = version
        self.timeout = timeout
        self.pb, stubs = api_modules(version)
        self.channel = grpc.insecure_channel(
            grpc_target(endpoint),
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", max_message_bytes),
            ],
        )
        self.runtime: Any = stubs.RuntimeServiceStub(self.channel)
        self.image: Any = stubs.ImageServiceStub(self.channel)

    def raw(self, path: str, request: bytes, timeout: float | None = None) -> bytes:
        """Call any method by its full path with raw bytes (for methods the stubs do not know)."""
        call = self.channel.unary_unary(path, None, None)
        result: bytes = call(request, timeout=timeout if timeout is not None else self.timeout)
        return result

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> CriClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
