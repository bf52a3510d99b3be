"""kubelet `cpu_manager_state`: v1 and v2 shapes, other policies, and every unknown shape."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cri_proxy.cpu import CPUSet, parse_kubelet_state, parse_kubelet_state_text
from cri_proxy.errors import KubeletStateError

V2 = {
    "policyName": "static",
    "defaultCpuSet": "0,3-15",
    "entries": {"uid-a": {"app": "1-2", "init": ""}},
    "checksum": 1,
}
V1 = {"policyName": "static", "defaultCpuSet": "0-1", "entries": {"cid-a": "2-3"}, "checksum": 0}


def test_v2() -> None:
    s = parse_kubelet_state(V2)
    assert s.static and s.version == 2
    assert s.default_cpuset == CPUSet.parse("0,3-15")
    assert s.container_cpus("uid-a", "app", "whatever") == CPUSet.parse("1-2")
    assert s.container_cpus("uid-a", "init", "x") == CPUSet()
    assert s.container_cpus("uid-a", "other", "x") is None
    assert s.container_cpus("uid-b", "app", "x") is None


def test_v1() -> None:
    s = parse_kubelet_state(V1)
    assert s.static and s.version == 1
    assert s.container_cpus("any", "any", "cid-a") == CPUSet.parse("2-3")
    assert s.container_cpus("any", "any", "cid-b") is None


def test_none_policy_without_entries() -> None:
    s = parse_kubelet_state({"policyName": "none", "defaultCpuSet": "", "checksum": 123})
    assert not s.static and s.version is None
    assert s.container_cpus("u", "c", "i") is None


def test_checksum_is_not_verified() -> None:
    assert parse_kubelet_state({**V1, "checksum": 42}).static


def test_text_form() -> None:
    assert parse_kubelet_state_text(json.dumps(V2)).version == 2
    assert parse_kubelet_state_text(json.dumps(V1).encode()).version == 1


BAD: dict[str, Any] = {
    "not an object": ["static"],
    "no policyName": {"entries": {}},
    "policyName not a string": {"policyName": 1},
    "entries not an object": {"policyName": "static", "entries": ["a"]},
    "mixed entry values": {"policyName": "static", "entries": {"a": "1", "b": {"c": "2"}}},
    "entry value a number": {"policyName": "static", "entries": {"a": 1}},
    "v1 cpu list does not parse": {"policyName": "static", "entries": {"a": "x"}},
    "v2 cpu list does not parse": {"policyName": "static", "entries": {"u": {"c": "1-"}}},
    "v2 inner value not a string": {"policyName": "static", "entries": {"u": {"c": 1}}},
    "defaultCpuSet does not parse": {"policyName": "static", "defaultCpuSet": "z"},
    "defaultCpuSet not a string": {"policyName": "static", "defaultCpuSet": 3},
}


@pytest.mark.parametrize("data", BAD.values(), ids=BAD.keys())
def test_unknown_shapes_raise(data: Any) -> None:
    with pytest.raises(KubeletStateError):
        parse_kubelet_state(data)


@pytest.mark.parametrize("text", ["", "{", "[" * 100_000], ids=["empty", "truncated", "deep"])
def test_text_not_json_raises(text: str) -> None:
    with pytest.raises(KubeletStateError, match="not JSON"):
        parse_kubelet_state_text(text)
