"""The create's keys (`create_keys`), and its pod's id alone (`create_sandbox`), are those of the
whole request parsed, or none when it does not decode; and when they are read from bytes the whole
request does not decode from, the bytes the runtime gets (with the patch the proxy appends) do not
decode either: such a request fails there as it would unpatched."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from cri_api.v1 import api_pb2 as v1
from cri_api.v1alpha2 import api_pb2 as v1alpha2
from cri_proxy.enforce.createkeys import create_keys, create_sandbox
from tests.protowire import length_field, varint

text = st.text(max_size=40)


def _patch(pb: Any) -> bytes:
    partial = pb.CreateContainerRequest()
    partial.config.linux.resources.cpuset_cpus = "0-3"
    data: bytes = partial.SerializeToString()
    return data


@st.composite
def requests(draw: st.DrawFn, pb: Any, sid: st.SearchStrategy[str], name: st.SearchStrategy[str]) -> bytes:
    config = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=draw(name), attempt=draw(st.integers(0, 2**32 - 1))),
        image=pb.ImageSpec(image=draw(text)),
        command=draw(st.lists(text, max_size=3)),
        labels=draw(st.dictionaries(text, text, max_size=3)),
        annotations=draw(st.dictionaries(text, text, max_size=3)),
        envs=[pb.KeyValue(key=k, value=v) for k, v in draw(st.lists(st.tuples(text, text), max_size=4))],
    )
    if draw(st.booleans()):
        config.linux.resources.cpuset_cpus = draw(text)
        config.linux.resources.cpu_shares = draw(st.integers(0, 2**40))
    request = pb.CreateContainerRequest(pod_sandbox_id=draw(sid), config=config)
    if draw(st.booleans()):
        request.sandbox_config.metadata.name = draw(text)
    data: bytes = request.SerializeToString()
    return data


def _mutate(draw: st.DrawFn, data: bytes) -> bytes:
    """One way a request goes wrong on the wire, or what a parser reads otherwise than in order."""
    kind = draw(st.sampled_from(["cut", "flip", "insert", "delete", "twice", "meta twice", "wide", "long"]))
    at = draw(st.integers(0, len(data)))
    if kind == "cut":
        return data[:at]
    if kind == "flip" and data:
        at = min(at, len(data) - 1)
        return data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1 :]
    if kind == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    if kind == "delete":
        return data[:at] + data[at + draw(st.integers(1, 8)) :]
    if kind == "twice":  # a key's field again, at the top: a parser merges, the last name wins
        return data + length_field(2, length_field(1, length_field(1, draw(text).encode())))
    if kind == "meta twice":  # metadata twice inside one config
        twice = length_field(1, length_field(1, b"a")) + length_field(1, length_field(1, b"b"))
        return length_field(1, b"p") + length_field(2, twice)
    if kind == "wide":  # an attempt past 32 bits: uint32 keeps the low ones
        meta = length_field(1, b"c") + varint(2 << 3) + varint(draw(st.integers(0, 2**64 - 1)))
        return length_field(1, b"p") + length_field(2, length_field(1, meta))
    if kind == "long":  # an over-long varint (more than ten bytes) for the attempt
        meta = length_field(1, b"c") + varint(2 << 3) + b"\x80" * 10 + b"\x01"
        return length_field(1, b"p") + length_field(2, length_field(1, meta))
    return data


@st.composite
def wire(draw: st.DrawFn, pb: Any) -> bytes:
    data = draw(requests(pb, text, text))
    if draw(st.booleans()):
        data = _mutate(draw, data)
    return data


def _check(pb: Any, data: bytes) -> tuple[str, str, int] | None:
    _check_sandbox(pb, data)
    keys = create_keys(data)
    if keys is None:  # only for a request that does not decode whole either
        try:
            pb.CreateContainerRequest.FromString(data)
        except DecodeError:
            return None
        raise AssertionError(f"no keys read from {data!r}, which decodes")
    try:
        parsed = pb.CreateContainerRequest.FromString(data)
    except DecodeError:  # not protobuf's: then neither is what the runtime gets
        try:
            pb.CreateContainerRequest.FromString(data + _patch(pb))
        except DecodeError:
            return keys
        raise AssertionError(f"keys {keys} read from {data!r}, which decodes only once patched") from None
    assert keys == (parsed.pod_sandbox_id, parsed.config.metadata.name, parsed.config.metadata.attempt)
    return keys


def _check_sandbox(pb: Any, data: bytes) -> None:
    sandbox_id = create_sandbox(data)
    try:
        parsed = pb.CreateContainerRequest.FromString(data)
    except DecodeError:  # then the id may be read, or not; read, the runtime's bytes do not decode
        if sandbox_id is not None:
            try:
                pb.CreateContainerRequest.FromString(data + _patch(pb))
            except DecodeError:
                return
            raise AssertionError(f"id {sandbox_id!r} read; {data!r} decodes once patched") from None
        return
    assert sandbox_id == parsed.pod_sandbox_id, (sandbox_id, parsed.pod_sandbox_id)


@settings(max_examples=600)
@given(data=wire(v1))
def test_v1_keys_are_protobufs_or_none(data: bytes) -> None:
    _check(v1, data)


@settings(max_examples=200)
@given(data=wire(v1alpha2))
def test_v1alpha2_keys_are_protobufs_or_none(data: bytes) -> None:
    _check(v1alpha2, data)


@settings(max_examples=300)
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_give_protobufs_keys_or_none(data: bytes) -> None:
    _check(v1, data)


@settings(max_examples=200)
@given(data=requests(v1, text, text))
def test_a_create_that_decodes_has_its_keys_read(data: bytes) -> None:
    assert _check(v1, data) is not None


def test_keys_as_protobuf_reads_them() -> None:
    meta = length_field(1, b"c")
    usual = length_field(1, b"p") + length_field(2, length_field(1, meta))
    assert create_keys(usual) == ("p", "c", 0)
    again = length_field(2, length_field(1, length_field(1, b"d")))
    assert create_keys(usual + again) == ("p", "d", 0)  # merged
    no_sandbox = length_field(2, length_field(1, meta))
    assert create_keys(no_sandbox) == ("", "c", 0)  # the pre hook's "" too
    assert create_keys(length_field(1, b"\xff") + length_field(2, length_field(1, meta))) is None  # not UTF-8
    assert create_keys(usual[:-1]) is None  # cut
    assert create_keys(usual + b"\x1a\x05ab") is None  # a field past the end
    assert create_sandbox(usual) == "p" and create_sandbox(no_sandbox) == ""
    assert create_sandbox(usual + length_field(1, b"q")) == "q"  # the last one, as protobuf reads it
    assert create_sandbox(length_field(1, b"\xff")) is None  # not UTF-8
    assert create_sandbox(usual[:-1]) is None  # cut
    wide = meta + varint(2 << 3) + varint(2**32 + 7)
    assert create_keys(length_field(1, b"p") + length_field(2, length_field(1, wide))) == ("p", "c", 7)
