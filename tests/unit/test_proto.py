"""Checks of the CRI API in cri_api/: stub freshness, v1/v1alpha2 parity, wire facts the proxy relies on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor, ServiceDescriptor

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from cri_api.v1alpha2 import api_pb2 as v1alpha2
from cri_api.v1alpha2 import api_pb2_grpc as v1alpha2_grpc

ROOT = Path(__file__).resolve().parents[2]
GEN_PROTO = ROOT / "scripts" / "gen-proto"

# Everything scripts/gen-proto writes (cri_api/v1/api.proto is its input).
GENERATED = [
    "cri_api/v1alpha2/api.proto",
    *(
        f"cri_api/{version}/{name}"
        for version in ("v1", "v1alpha2")
        for name in ("api_pb2.py", "api_pb2_grpc.py", "api_pb2.pyi")
    ),
]

VERSIONS = {"v1": (v1, v1_grpc), "v1alpha2": (v1alpha2, v1alpha2_grpc)}

RUNTIME_RPCS = (
    "Version",
    "RunPodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "PodSandboxStatus",
    "ListPodSandbox",
    "StreamPodSandboxes",
    "CreateContainer",
    "StartContainer",
    "StopContainer",
    "RemoveContainer",
    "ListContainers",
    "StreamContainers",
    "ContainerStatus",
    "UpdateContainerResources",
    "ReopenContainerLog",
    "ExecSync",
    "Exec",
    "Attach",
    "PortForward",
    "ContainerStats",
    "ListContainerStats",
    "StreamContainerStats",
    "PodSandboxStats",
    "ListPodSandboxStats",
    "StreamPodSandboxStats",
    "UpdateRuntimeConfig",
    "Status",
    "CheckpointContainer",
    "GetContainerEvents",
    "ListMetricDescriptors",
    "ListPodSandboxMetrics",
    "StreamPodSandboxMetrics",
    "RuntimeConfig",
    "UpdatePodSandboxResources",
)
IMAGE_RPCS = ("ListImages", "StreamImages", "ImageStatus", "PullImage", "RemoveImage", "ImageFsInfo")

# Server-streaming RPCs: the 1.25 event feed and the 1.36 chunked list calls.
SERVER_STREAMING = {
    "GetContainerEvents",
    "StreamPodSandboxes",
    "StreamContainers",
    "StreamContainerStats",
    "StreamPodSandboxStats",
    "StreamPodSandboxMetrics",
    "StreamImages",
}

# RPCs that the shared spec notes (cri-notes.md) name.
NAMED_IN_NOTES = {
    "Version",
    "RunPodSandbox",
    "PodSandboxStatus",
    "CreateContainer",
    "ContainerStatus",
    "UpdateContainerResources",
    "ListContainers",
    "ListContainerStats",
    "GetContainerEvents",
    "ListMetricDescriptors",
    "ListPodSandboxMetrics",
    "RuntimeConfig",
    "UpdatePodSandboxResources",
}


# --------------------------------------------------------------------------- helpers


def _type_of(field: FieldDescriptor) -> str:
    """Short type description: 'string', 'LinuxContainerResources', 'repeated HugepageLimit', 'map'."""
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return "map"
    if field.message_type is not None:
        name = field.message_type.name
    elif field.enum_type is not None:
        name = field.enum_type.name
    else:
        name = {
            FieldDescriptor.TYPE_STRING: "string",
            FieldDescriptor.TYPE_BYTES: "bytes",
            FieldDescriptor.TYPE_BOOL: "bool",
            FieldDescriptor.TYPE_INT32: "int32",
            FieldDescriptor.TYPE_INT64: "int64",
            FieldDescriptor.TYPE_UINT32: "uint32",
            FieldDescriptor.TYPE_UINT64: "uint64",
            FieldDescriptor.TYPE_DOUBLE: "double",
        }[field.type]
    return f"repeated {name}" if field.is_repeated else name


def _all_messages(file: FileDescriptor) -> dict[str, Descriptor]:
    """Every message (nested ones as Outer.Inner) by name relative to the package."""
    found: dict[str, Descriptor] = {}

    def walk(desc: Descriptor, prefix: str) -> None:
        found[prefix + desc.name] = desc
        for nested in desc.nested_types:
            walk(nested, prefix + desc.name + ".")

    for desc in file.message_types_by_name.values():
        walk(desc, "")
    return found


def _field_table(file: FileDescriptor) -> dict[str, list[tuple[str, int, str, str]]]:
    return {
        name: [(f.name, f.number, _type_of(f), f.json_name) for f in desc.fields]
        for name, desc in _all_messages(file).items()
    }


def _method_table(service: ServiceDescriptor) -> list[tuple[str, str, str, bool, bool]]:
    return [
        (m.name, m.input_type.name, m.output_type.name, m.client_streaming, m.server_streaming)
        for m in service.methods
    ]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _tag(number: int, wire_type: int) -> bytes:
    return _varint((number << 3) | wire_type)


def _len_field(number: int, payload: bytes) -> bytes:
    return _tag(number, 2) + _varint(len(payload)) + payload


def _varint_field(number: int, value: int) -> bytes:
    return _tag(number, 0) + _varint(value)


# --------------------------------------------------------------------------- freshness


def test_committed_stubs_match_fresh_generation(tmp_path: Path) -> None:
    env = dict(os.environ, GEN_PROTO_PYTHON=sys.executable)
    result = subprocess.run(
        ["bash", str(GEN_PROTO), "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"scripts/gen-proto failed:\n{result.stdout}\n{result.stderr}"

    stale = [rel for rel in GENERATED if (tmp_path / rel).read_bytes() != (ROOT / rel).read_bytes()]
    assert not stale, (
        f"generated files differ from a fresh run of scripts/gen-proto: {stale}; "
        "run scripts/gen-proto (with the grpcio-tools version pinned in pyproject.toml) and commit"
    )


def test_gen_proto_is_executable() -> None:
    assert os.access(GEN_PROTO, os.X_OK)


# --------------------------------------------------------------------------- v1 == v1alpha2


def test_packages() -> None:
    assert v1.DESCRIPTOR.package == "runtime.v1"
    assert v1alpha2.DESCRIPTOR.package == "runtime.v1alpha2"
    for module in (v1, v1alpha2):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        assert proto.syntax == "proto3"
    assert list(v1.DESCRIPTOR.dependencies) == list(v1alpha2.DESCRIPTOR.dependencies) == []


def test_v1alpha2_declares_the_same_services_and_methods() -> None:
    services = v1.DESCRIPTOR.services_by_name
    assert set(services) == set(v1alpha2.DESCRIPTOR.services_by_name) == {"RuntimeService", "ImageService"}
    for name, service in services.items():
        assert _method_table(service) == _method_table(v1alpha2.DESCRIPTOR.services_by_name[name]), name


def test_v1alpha2_declares_the_same_messages_fields_and_enums() -> None:
    assert _field_table(v1.DESCRIPTOR) == _field_table(v1alpha2.DESCRIPTOR)

    def enums(file: FileDescriptor) -> dict[str, list[tuple[str, int]]]:
        table = {name: [(v.name, v.number) for v in e.values] for name, e in file.enum_types_by_name.items()}
        for msg_name, msg in _all_messages(file).items():
            for e in msg.enum_types:
                table[f"{msg_name}.{e.name}"] = [(v.name, v.number) for v in e.values]
        return table

    assert enums(v1.DESCRIPTOR) == enums(v1alpha2.DESCRIPTOR)


def test_v1alpha2_descriptor_is_v1_renamed() -> None:
    """Whole-file check: options, labels, oneofs, map entries, everything but the package."""

    def normalised(file: FileDescriptor) -> descriptor_pb2.FileDescriptorProto:
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        text = str(proto).replace(f".{file.package}.", ".PKG.").replace(f'"{file.package}"', '"PKG"')
        text = text.replace(proto.options.go_package, "GO_PACKAGE")
        text = text.replace(proto.name, "FILE")
        out = descriptor_pb2.FileDescriptorProto()
        text_format.Parse(text, out)
        return out

    assert normalised(v1.DESCRIPTOR) == normalised(v1alpha2.DESCRIPTOR)


# --------------------------------------------------------------------------- field numbers the proxy decodes

# (message, field, number, type): "Field numbers the proxy decodes" in cri-notes.md, plus a few.
FIELD_NUMBERS = [
    ("CreateContainerRequest", "pod_sandbox_id", 1, "string"),
    ("CreateContainerRequest", "config", 2, "ContainerConfig"),
    ("CreateContainerRequest", "sandbox_config", 3, "PodSandboxConfig"),
    ("CreateContainerResponse", "container_id", 1, "string"),
    ("ContainerConfig", "metadata", 1, "ContainerMetadata"),
    ("ContainerConfig", "image", 2, "ImageSpec"),
    ("ContainerConfig", "labels", 9, "map"),
    ("ContainerConfig", "annotations", 10, "map"),
    ("ContainerConfig", "linux", 15, "LinuxContainerConfig"),
    ("ContainerMetadata", "name", 1, "string"),
    ("ContainerMetadata", "attempt", 2, "uint32"),
    ("LinuxContainerConfig", "resources", 1, "LinuxContainerResources"),
    ("LinuxContainerConfig", "security_context", 2, "LinuxContainerSecurityContext"),
    ("PodSandboxConfig", "metadata", 1, "PodSandboxMetadata"),
    ("PodSandboxConfig", "labels", 6, "map"),
    ("PodSandboxConfig", "annotations", 7, "map"),
    ("PodSandboxConfig", "linux", 8, "LinuxPodSandboxConfig"),
    ("PodSandboxMetadata", "name", 1, "string"),
    ("PodSandboxMetadata", "uid", 2, "string"),
    ("PodSandboxMetadata", "namespace", 3, "string"),
    ("PodSandboxMetadata", "attempt", 4, "uint32"),
    ("LinuxPodSandboxConfig", "cgroup_parent", 1, "string"),
    ("LinuxContainerResources", "cpu_period", 1, "int64"),
    ("LinuxContainerResources", "cpu_quota", 2, "int64"),
    ("LinuxContainerResources", "cpu_shares", 3, "int64"),
    ("LinuxContainerResources", "memory_limit_in_bytes", 4, "int64"),
    ("LinuxContainerResources", "oom_score_adj", 5, "int64"),
    ("LinuxContainerResources", "cpuset_cpus", 6, "string"),
    ("LinuxContainerResources", "cpuset_mems", 7, "string"),
    ("LinuxContainerResources", "hugepage_limits", 8, "repeated HugepageLimit"),
    ("LinuxContainerResources", "unified", 9, "map"),
    ("LinuxContainerResources", "memory_swap_limit_in_bytes", 10, "int64"),
    ("UpdateContainerResourcesRequest", "container_id", 1, "string"),
    ("UpdateContainerResourcesRequest", "linux", 2, "LinuxContainerResources"),
    ("UpdateContainerResourcesRequest", "windows", 3, "WindowsContainerResources"),
    ("UpdateContainerResourcesRequest", "annotations", 4, "map"),
    ("ContainerStatusResponse", "status", 1, "ContainerStatus"),
    ("ContainerStatusResponse", "info", 2, "map"),
    ("ContainerStatus", "resources", 16, "ContainerResources"),
    ("ContainerResources", "linux", 1, "LinuxContainerResources"),
    ("PodSandboxStatusResponse", "status", 1, "PodSandboxStatus"),
    ("PodSandboxStatusResponse", "info", 2, "map"),
    ("VersionResponse", "version", 1, "string"),
    ("VersionResponse", "runtime_name", 2, "string"),
    ("VersionResponse", "runtime_version", 3, "string"),
    ("VersionResponse", "runtime_api_version", 4, "string"),
    ("UpdatePodSandboxResourcesRequest", "pod_sandbox_id", 1, "string"),
    ("UpdatePodSandboxResourcesRequest", "overhead", 2, "LinuxContainerResources"),
    ("UpdatePodSandboxResourcesRequest", "resources", 3, "LinuxContainerResources"),
]


@pytest.mark.parametrize("version", sorted(VERSIONS))
@pytest.mark.parametrize(("message", "field", "number", "type_"), FIELD_NUMBERS)
def test_field_numbers(version: str, message: str, field: str, number: int, type_: str) -> None:
    module = VERSIONS[version][0]
    desc = module.DESCRIPTOR.message_types_by_name[message]
    f = desc.fields_by_name[field]
    assert (f.number, _type_of(f)) == (number, type_)
    assert desc.fields_by_number[number].name == field


@pytest.mark.parametrize(
    "map_field",
    [
        ("ContainerConfig", "labels"),
        ("PodSandboxConfig", "annotations"),
        ("LinuxContainerResources", "unified"),
        ("ContainerStatusResponse", "info"),
    ],
)
def test_maps_are_string_to_string(map_field: tuple[str, str]) -> None:
    message, field = map_field
    entry = v1.DESCRIPTOR.message_types_by_name[message].fields_by_name[field].message_type
    assert entry is not None
    assert entry.GetOptions().map_entry
    assert [(f.name, f.number, f.type) for f in entry.fields] == [
        ("key", 1, FieldDescriptor.TYPE_STRING),
        ("value", 2, FieldDescriptor.TYPE_STRING),
    ]


# Field names that do not follow snake_case in the public API; their JSON names must match too.
@pytest.mark.parametrize(
    ("message", "field", "number", "json_name"),
    [
        ("ContainerConfig", "CDI_devices", 17, "CDIDevices"),
        ("Mount", "uidMappings", 6, "uidMappings"),
        ("Mount", "gidMappings", 7, "gidMappings"),
        ("PsiStats", "Full", 1, "Full"),
        ("PsiStats", "Some", 2, "Some"),
        ("PsiData", "Avg300", 4, "Avg300"),
        ("ImageSpec", "user_specified_image", 18, "userSpecifiedImage"),
        ("Namespace", "options", 2, "options"),
    ],
)
def test_unusual_names_and_numbers(message: str, field: str, number: int, json_name: str) -> None:
    f = v1.DESCRIPTOR.message_types_by_name[message].fields_by_name[field]
    assert (f.number, f.json_name) == (number, json_name)


# --------------------------------------------------------------------------- unknown fields


def test_unknown_fields_survive_round_trip_top_level() -> None:
    known = v1.CreateContainerRequest(pod_sandbox_id="sb").SerializeToString()
    extra = _len_field(4242, b"from a newer kubelet") + _varint_field(99, 7)
    msg = v1.CreateContainerRequest.FromString(known + extra)

    assert msg.pod_sandbox_id == "sb"
    out = msg.SerializeToString()
    assert extra in out
    assert out == known + extra


def test_unknown_fields_survive_round_trip_nested_after_edit() -> None:
    """What the proxy does: decode, rewrite cpuset_cpus, re-encode; newer fields stay put at every level."""
    resources_unknown = _varint_field(11, 123456)  # e.g. a LinuxContainerResources field added later
    config_unknown = _len_field(77, b"future-config")  # e.g. a ContainerConfig field added later
    sandbox_unknown = _len_field(1000, b"future-sandbox")

    resources = v1.LinuxContainerResources(cpu_shares=1024, cpuset_cpus="0-7").SerializeToString()
    linux = _len_field(1, resources + resources_unknown)
    config = (
        v1.ContainerConfig(metadata=v1.ContainerMetadata(name="app", attempt=1)).SerializeToString()
        + _len_field(15, linux)
        + config_unknown
    )
    sandbox = v1.PodSandboxConfig(linux=v1.LinuxPodSandboxConfig(cgroup_parent="/kubepods/burstable"))
    wire = (
        _len_field(1, b"sb")
        + _len_field(2, config)
        + _len_field(3, sandbox.SerializeToString() + sandbox_unknown)
    )

    msg = v1.CreateContainerRequest.FromString(wire)
    assert msg.config.metadata.name == "app"
    assert msg.config.linux.resources.cpuset_cpus == "0-7"
    assert msg.sandbox_config.linux.cgroup_parent == "/kubepods/burstable"

    msg.config.linux.resources.cpuset_cpus = "2-3"
    out = msg.SerializeToString()
    for unknown in (resources_unknown, config_unknown, sandbox_unknown):
        assert unknown in out

    again = v1.CreateContainerRequest.FromString(out)
    assert again.config.linux.resources.cpuset_cpus == "2-3"
    assert again.config.linux.resources.cpu_shares == 1024
    assert again.SerializeToString() == out


def test_unknown_fields_survive_in_update_container_resources() -> None:
    extra = _len_field(50, b"x")
    wire = (
        v1.UpdateContainerResourcesRequest(
            container_id="c1", linux=v1.LinuxContainerResources(cpuset_cpus="1")
        ).SerializeToString()
        + extra
    )
    msg = v1.UpdateContainerResourcesRequest.FromString(wire)
    msg.linux.cpuset_cpus = "4-5"
    assert extra in msg.SerializeToString()


# --------------------------------------------------------------------------- RPC shapes


def test_rpc_lists() -> None:
    for module, _ in VERSIONS.values():
        services = module.DESCRIPTOR.services_by_name
        assert tuple(m.name for m in services["RuntimeService"].methods) == RUNTIME_RPCS
        assert tuple(m.name for m in services["ImageService"].methods) == IMAGE_RPCS
    assert set(RUNTIME_RPCS) >= NAMED_IN_NOTES


def test_streaming_flags() -> None:
    runtime = v1.DESCRIPTOR.services_by_name["RuntimeService"]
    events = runtime.methods_by_name["GetContainerEvents"]
    assert events.server_streaming and not events.client_streaming
    assert events.input_type.name == "GetEventsRequest"
    assert events.output_type.name == "ContainerEventResponse"

    for module, _ in VERSIONS.values():
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                assert not method.client_streaming, method.full_name
                assert method.server_streaming == (method.name in SERVER_STREAMING), method.full_name


class _RecordingChannel:
    """Stands in for grpc.Channel; records which multicallable kind each method path got."""

    def __init__(self) -> None:
        self.calls: dict[str, str] = {}

    def _record(self, kind: str) -> Any:
        def make(path: str, *args: Any, **kwargs: Any) -> str:
            self.calls[path] = kind
            return path

        return make

    def __getattr__(self, kind: str) -> Any:
        if kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            return self._record(kind)
        raise AttributeError(kind)


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_grpc_stub_paths(version: str) -> None:
    _, grpc_module = VERSIONS[version]
    for service, rpcs in (("RuntimeService", RUNTIME_RPCS), ("ImageService", IMAGE_RPCS)):
        channel = _RecordingChannel()
        getattr(grpc_module, f"{service}Stub")(channel)
        expected = {}
        for rpc in rpcs:
            kind = "unary_stream" if rpc in SERVER_STREAMING else "unary_unary"
            expected[f"/runtime.{version}.{service}/{rpc}"] = kind
        assert channel.calls == expected
