"""What this build knows about CRI methods: full path -> call shape and message types.

Derived from our own proto's descriptors, so adding an RPC to the proto is the only change
needed. Methods not listed here are still forwarded (as stream-stream), just without hooks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import ModuleType

from google.protobuf.message import Message

from cri_api.v1 import api_pb2 as v1
from cri_api.v1alpha2 import api_pb2 as v1alpha2

API_MODULES: dict[str, ModuleType] = {"v1": v1, "v1alpha2": v1alpha2}
SERVICES = ("RuntimeService", "ImageService")
SLOW = frozenset(
    {
        "RunPodSandbox",
        "StopPodSandbox",
        "RemovePodSandbox",
        "UpdatePodSandboxResources",
        "CreateContainer",
        "StartContainer",
        "StopContainer",
        "RemoveContainer",
        "UpdateContainerResources",
        "ReopenContainerLog",
        "ExecSync",
        "CheckpointContainer",
        "UpdateRuntimeConfig",
        "PullImage",
        "RemoveImage",
    }
)
"""Calls the runtime works on for milliseconds or more (it changes the node, runs a command, pulls
an image); the others read what it holds and answer within microseconds. The relay lets the
runtime's PINGs wait while a slow call is open (see `core.py`)."""


class Shape(enum.Enum):
    UNARY = "unary"
    SERVER_STREAM = "server-stream"
    STREAM = "stream"  # client-streaming, bidi, or unknown: forwarded stream-stream


@dataclass(frozen=True, slots=True)
class MethodInfo:
    path: str  # "/runtime.v1.RuntimeService/CreateContainer"
    version: str  # "v1" | "v1alpha2"
    service: str  # "RuntimeService"
    name: str  # "CreateContainer"
    shape: Shape
    request_type: type[Message]
    response_type: type[Message]
    slow: bool = False  # in SLOW


def _build() -> dict[str, MethodInfo]:
    table: dict[str, MethodInfo] = {}
    for version, module in API_MODULES.items():
        for service_name in SERVICES:
            service = module.DESCRIPTOR.services_by_name[service_name]
            for method in service.methods:
                if method.client_streaming:
                    shape = Shape.STREAM
                elif method.server_streaming:
                    shape = Shape.SERVER_STREAM
                else:
                    shape = Shape.UNARY
                path = f"/{service.full_name}/{method.name}"
                table[path] = MethodInfo(
                    path=path,
                    version=version,
                    service=service_name,
                    name=method.name,
                    shape=shape,
                    request_type=getattr(module, method.input_type.name),
                    response_type=getattr(module, method.output_type.name),
                    slow=method.name in SLOW,
                )
    unknown = SLOW - {info.name for info in table.values()}
    assert not unknown, f"SLOW names methods no API version has: {sorted(unknown)}"
    return table


KNOWN: dict[str, MethodInfo] = _build()
UNARY_PATHS: dict[bytes, MethodInfo] = {
    path.encode(): info for path, info in KNOWN.items() if info.shape is Shape.UNARY
}
"""The unary methods by `:path` as it comes on the wire: a request's method without decoding it."""


def method_path(version: str, service: str, name: str) -> str:
    """The gRPC path of a CRI method: `/runtime.<version>.<service>/<name>`."""
    return f"/runtime.{version}.{service}/{name}"
