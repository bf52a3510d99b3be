"""`grpc.health.v1.Health` on the proxy's socket, answered with hand-encoded messages.

HealthCheckRequest {string service = 1}; HealthCheckResponse {ServingStatus status = 1} with
SERVING = 1, NOT_SERVING = 2, SERVICE_UNKNOWN = 3. Overall ("") tells what /healthz tells: NOT_SERVING
while the runtime does not answer or a supervised background loop is down waiting for its restart.
The CRI services are SERVING while the runtime answers (the relay serves them whatever the loops
do); anything else is SERVICE_UNKNOWN, as the standard says.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from cri_proxy.relay.forward import GenericHandler, Handler

SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3
SERVICE = "grpc.health.v1.Health"
KNOWN_SERVICES = frozenset(
    {
        "",
        "runtime.v1.RuntimeService",
        "runtime.v1.ImageService",
        "runtime.v1alpha2.RuntimeService",
        "runtime.v1alpha2.ImageService",
    }
)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def service_name(request: bytes) -> str | None:
    """Field 1 (string) of HealthCheckRequest; None when the bytes are not such a message."""
    pos, name = 0, ""
    try:
        while pos < len(request):
            tag, pos = _varint(request, pos)
            wire = tag & 7
            if wire == 2:
                size, pos = _varint(request, pos)
                if pos + size > len(request):
                    return None
                if tag >> 3 == 1:
                    name = request[pos : pos + size].decode()
                pos += size
            elif wire == 0:
                _, pos = _varint(request, pos)
            else:
                return None
    except (ValueError, UnicodeDecodeError):
        return None
    return name


def _reply(status: int) -> bytes:
    return bytes([0x08, status])


class HealthService(GenericHandler):
    """Check and Watch; `healthy()` says whether the runtime behind the proxy answers (the CRI
    services), `overall()` whether the proxy as a whole is healthy (""; `healthy` when not given)."""

    def __init__(
        self,
        healthy: Callable[[], bool],
        poll_seconds: float = 1.0,
        overall: Callable[[], bool] | None = None,
    ) -> None:
        self.healthy = healthy
        self.overall = overall if overall is not None else healthy
        self.poll_seconds = poll_seconds
        self._handlers: dict[str, Handler] = {
            f"/{SERVICE}/Check": grpc.unary_unary_rpc_method_handler(self._check),
            f"/{SERVICE}/Watch": grpc.unary_stream_rpc_method_handler(self._watch),
        }

    def status(self, service: str) -> int:
        if service not in KNOWN_SERVICES:
            return SERVICE_UNKNOWN
        serving = self.overall() if service == "" else self.healthy()
        return SERVING if serving else NOT_SERVING

    async def _check(self, request: bytes, context: Any) -> bytes:
        service = service_name(request)
        if service is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "not a HealthCheckRequest")
            return b""  # abort raises; this line is for the type checker
        status = self.status(service)
        if status == SERVICE_UNKNOWN:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {service!r}")
        return _reply(status)

    async def _watch(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        service = service_name(request) or ""
        last = None
        while True:
            status = self.status(service)
            if status != last:
                last = status
                yield _reply(status)
            await asyncio.sleep(self.poll_seconds)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Handler | None:
        return self._handlers.get(handler_call_details.method)
