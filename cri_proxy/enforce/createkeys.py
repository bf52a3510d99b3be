"""A CreateContainerRequest's keys, parsed by protobuf without the rest of the request.

The usual create goes on with a decision read ahead (`EnforceHooks.ready_create`); all it needs
first is which pod it is (`create_sandbox`), or, when nothing was read ahead for the pod, which
pod and container (`create_keys`). A message type that holds only those keys is parsed by
the same C parser, which merges a key that comes twice as it would in the whole request and skips
every other field by its framing, unread: ~4 µs for the kubelet's create where the whole request
takes ~6 µs to parse and its fields more to read, and a Python reader of the bytes ~60 (all three
several times that with the cache cold, as it is after the runtime's last call). The whole
request is parsed once it went on.

What this type does not read (the other fields' contents: a string that is not UTF-8, a nested
message cut short) may still keep the whole request from decoding. Every field at the levels it
reads frames to the end of its bytes, so a field appended after the request cannot make it
decode: the runtime refuses it as it would the request alone. Its field numbers and types are
v1's and v1alpha2's alike: CreateContainerRequest{1: pod_sandbox_id, 2: config{1: metadata{1:
name, 2: attempt}}}. The pod's id alone is read by a type that holds only field 1, which skips
the config by its framing, unread (~29 µs against ~33 with the cache cold: most of either is the
parser's own code and tables brought back to the cache).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

_F = descriptor_pb2.FieldDescriptorProto
_PACKAGE = "cri_proxy.createkeys"


def _keys_types() -> tuple[Any, Any]:
    """The message classes `Create{1: string, 2: Config{1: Metadata{1: string, 2: uint32}}}` and
    `Sandbox{1: string}`."""
    file = descriptor_pb2.FileDescriptorProto(
        name="cri_proxy/createkeys.proto", package=_PACKAGE, syntax="proto3"
    )
    fields: dict[str, list[tuple[str, int, int, str]]] = {
        "Metadata": [("name", 1, _F.TYPE_STRING, ""), ("attempt", 2, _F.TYPE_UINT32, "")],
        "Config": [("metadata", 1, _F.TYPE_MESSAGE, "Metadata")],
        "Create": [("pod_sandbox_id", 1, _F.TYPE_STRING, ""), ("config", 2, _F.TYPE_MESSAGE, "Config")],
        "Sandbox": [("pod_sandbox_id", 1, _F.TYPE_STRING, "")],
    }
    for name, its in fields.items():
        message = file.message_type.add(name=name)
        for field, number, kind, of in its:
            type_name = f".{_PACKAGE}.{of}" if of else None
            message.field.add(
                name=field, number=number, type=kind, type_name=type_name, label=_F.LABEL_OPTIONAL
            )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    create, sandbox = (pool.FindMessageTypeByName(f"{_PACKAGE}.{name}") for name in ("Create", "Sandbox"))
    return message_factory.GetMessageClass(create), message_factory.GetMessageClass(sandbox)


_CREATE, _SANDBOX = _keys_types()


def create_keys(message: bytes) -> tuple[str, str, int] | None:
    """The request's (pod_sandbox_id, config.metadata.name, config.metadata.attempt) as protobuf
    reads them, or None when the bytes do not frame as the request's fields or a key does not
    decode (a string that is not UTF-8)."""
    try:
        keys = _CREATE.FromString(message)
    except DecodeError:
        return None
    metadata = keys.config.metadata
    return keys.pod_sandbox_id, metadata.name, metadata.attempt


def create_sandbox(message: bytes) -> str | None:
    """The request's pod_sandbox_id as protobuf reads it, or None when the bytes do not frame as
    the request's fields or the id does not decode."""
    try:
        sandbox_id: str = _SANDBOX.FromString(message).pod_sandbox_id
    except DecodeError:
        return None
    return sandbox_id
