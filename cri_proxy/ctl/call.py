"""`call SERVICE/METHOD [JSON]`: any CRI method, the request given as JSON, the answer printed as JSON.

The request is built with our proto's descriptors (protobuf's JSON mapping: camelCase or proto
field names, enums by name), so every method of both services works, through the proxy or with
`--bypass`. Server-streaming methods print one JSON document per message, until the stream ends,
`--count` messages came, or Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message

from cri_proxy.client import api_modules
from cri_proxy.ctl.conn import Conn
from cri_proxy.ctl.errors import CtlError
from cri_proxy.files import text_of

SERVICES = ("RuntimeService", "ImageService")
VERSIONS = ("v1", "v1alpha2")


@dataclass(frozen=True, slots=True)
class Target:
    version: str
    service: str
    method: MethodDescriptor

    @property
    def path(self) -> str:
        return f"/runtime.{self.version}.{self.service}/{self.method.name}"

    @property
    def name(self) -> str:
        return f"runtime.{self.version}.{self.service}/{self.method.name}"


def _services(version: str) -> dict[str, Any]:
    pb, _ = api_modules(version)
    return {name: pb.DESCRIPTOR.services_by_name[name] for name in SERVICES}


def find(name: str, api: str | None) -> Target:
    """`Service/Method`, `runtime.v1.Service/Method`, `/runtime.v1.Service/Method` or a bare `Method`."""
    text = name.strip().lstrip("/")
    service_part, slash, method_name = text.rpartition("/")
    version = api or "v1"
    if slash:
        pieces = service_part.split(".")
        if len(pieces) == 3 and pieces[0] == "runtime":
            if pieces[1] not in VERSIONS:
                raise CtlError(f"unknown CRI API version {pieces[1]!r} in {name!r} (v1 or v1alpha2)")
            if api and api != pieces[1]:
                raise CtlError(f"{name!r} is runtime.{pieces[1]}, but --api says {api}")
            version, service_part = pieces[1], pieces[2]
        elif len(pieces) != 1:
            raise CtlError(f"unknown service {service_part!r}: RuntimeService or ImageService", code=1)
        if service_part not in SERVICES:
            raise CtlError(f"unknown service {service_part!r}: RuntimeService or ImageService", code=1)
        candidates = [service_part]
    else:
        candidates = list(SERVICES)
    services = _services(version)
    found = [
        Target(version, s, services[s].methods_by_name[method_name])
        for s in candidates
        if method_name in services[s].methods_by_name
    ]
    if not found:
        raise CtlError(
            f"unknown method {name!r} in runtime.{version} (`cri-proxy ctl call --list` lists them)"
        )
    if len(found) > 1:
        raise CtlError(f"{name!r} is in both services: say which ({', '.join(t.name for t in found)})")
    return found[0]


def _request_text(value: str) -> str:
    if value == "-":
        return sys.stdin.read()
    if value.startswith("@"):
        try:
            return text_of(Path(value[1:]).read_bytes(), value[1:])
        except OSError as exc:
            raise CtlError(f"request file {value[1:]}: {exc.strerror}") from None
        except ValueError as exc:
            raise CtlError(f"request file {exc}") from None
    return value


def _print(message: Message, emit_defaults: bool) -> None:
    text = json_format.MessageToJson(
        message, indent=2, always_print_fields_with_no_presence=emit_defaults, ensure_ascii=False
    )
    print(text, flush=True)


def call(args: argparse.Namespace, conn: Conn) -> int:
    if args.list:
        for version in VERSIONS:
            for service, desc in _services(version).items():
                for m in desc.methods:
                    shape = "  (server stream)" if m.server_streaming else ""
                    print(f"runtime.{version}.{service}/{m.name}{shape}")
        return 0
    if not args.method:
        raise CtlError("give SERVICE/METHOD (`cri-proxy ctl call --list` lists them)")
    target = find(args.method, args.api)
    request_cls = message_factory.GetMessageClass(target.method.input_type)
    response_cls = message_factory.GetMessageClass(target.method.output_type)
    request = request_cls()
    try:
        json_format.Parse(_request_text(args.request) or "{}", request)
    except json_format.ParseError as exc:
        raise CtlError(f"request for {target.name}: {str(exc).splitlines()[0]}") from None
    client = conn.client(conn.endpoint_of(target.service))
    conn.debug(f"{target.path} request: {json_format.MessageToJson(request, indent=None)}")
    try:
        if target.method.server_streaming:
            streaming = client.channel.unary_stream(
                target.path,
                request_serializer=request_cls.SerializeToString,
                response_deserializer=response_cls.FromString,
            )
            for got, message in enumerate(streaming(request, timeout=None), start=1):
                _print(message, args.emit_defaults)
                if args.count and got >= args.count:
                    break
        else:
            unary = client.channel.unary_unary(
                target.path,
                request_serializer=request_cls.SerializeToString,
                response_deserializer=response_cls.FromString,
            )
            _print(unary(request, timeout=conn.settings.timeout), args.emit_defaults)
    except grpc.RpcError as exc:
        timeout = None if target.method.server_streaming else conn.settings.timeout
        raise conn.fail(exc, target.service, timeout) from None
    return 0
