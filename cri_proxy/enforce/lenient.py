"""Lenient twins of the runtime.v1 messages: every `string` field read as `bytes`.

Python protobuf refuses a proto3 string that is not valid UTF-8 when it parses, and one pod with
such an annotation (containerd 1.6 stores whatever it was given) would make a whole
`ListPodSandbox` reply unreadable, and recovery with it. The twins have the same wire format with
every string field as bytes and every map as a repeated (key, value) entry, so any reply parses;
`text()` and `text_map()` then decode what was read and say what was not valid UTF-8.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from cri_api.v1 import api_pb2 as v1

PACKAGE = "runtime.v1.lenient"


def _loosen(message: descriptor_pb2.DescriptorProto) -> None:
    if message.options.map_entry:  # map<string, V>: bytes keys are not allowed, entries are
        message.options.ClearField("map_entry")
    for f in message.field:
        if f.type == descriptor_pb2.FieldDescriptorProto.TYPE_STRING:
            f.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
        if f.type_name.startswith(".runtime.v1."):
            f.type_name = f".{PACKAGE}." + f.type_name.removeprefix(".runtime.v1.")
    for nested in message.nested_type:
        _loosen(nested)


def _build() -> descriptor_pool.DescriptorPool:
    proto = descriptor_pb2.FileDescriptorProto()
    v1.DESCRIPTOR.CopyToProto(proto)
    proto.name = "cri_proxy/lenient/api.proto"
    proto.package = PACKAGE
    proto.ClearField("service")
    proto.ClearField("options")
    for message in proto.message_type:
        _loosen(message)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return pool


_POOL = _build()


def message_class(name: str) -> Any:
    """The lenient twin of `runtime.v1.<name>` (e.g. "ListPodSandboxResponse")."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


def parse(name: str, data: bytes) -> Any:
    """Parse a runtime.v1 `<name>` message from wire bytes, whatever its strings hold."""
    message = message_class(name)()
    message.ParseFromString(data)
    return message


def text(raw: bytes) -> str:
    """A string field's bytes as text; bytes that are not UTF-8 become U+FFFD."""
    return raw.decode("utf-8", errors="replace")


def text_map(entries: Iterable[Any], what: str, problems: list[str]) -> dict[str, str]:
    """A map field's entries as a dict; a key or value that is not UTF-8 is decoded with U+FFFD
    and named in `problems` (`what` says whose map it is)."""
    out: dict[str, str] = {}
    for entry in entries:
        key, value = entry.key, entry.value
        try:
            out[key.decode()] = value.decode()
        except UnicodeDecodeError:
            name = text(key)
            problems.append(f"{what}: {name!r} is not valid UTF-8; read with replacement characters")
            out[name] = text(value)
    return out
