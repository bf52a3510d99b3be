"""The allocation annotation: every field form of the spec, both names, and every bad shape."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cri_proxy.cpu import Allocation, CPUSet, allocation_from_annotations, parse_allocation
from cri_proxy.cpu.keys import ALLOC_STATUS_ANNOTATION, RESOURCE_STATUS_ANNOTATION
from cri_proxy.errors import AllocationError

GOOD: dict[str, tuple[Any, Allocation]] = {
    "empty object": ({}, Allocation()),
    "cpuset": ({"cpuset": "0-3,8-11"}, Allocation(CPUSet.parse("0-3,8-11"))),
    "empty cpuset": ({"cpuset": ""}, Allocation(CPUSet())),
    "null cpuset": ({"cpuset": None}, Allocation()),
    "numaNodeResources": (
        {"numaNodeResources": [{"node": 1, "resources": {"cpu": "2"}}]},
        Allocation(numa_nodes=frozenset({1})),
    ),
    "numaNodeResources without resources": (
        {"numaNodeResources": [{"node": 0}, {"node": 1}]},
        Allocation(numa_nodes=frozenset({0, 1})),
    ),
    "cpuSharedPools": (
        {"cpuSharedPools": [{"socket": 0, "node": 1, "cpuset": "8-15"}]},
        Allocation(numa_nodes=frozenset({1})),
    ),
    "numaNode int": ({"numaNode": 0}, Allocation(numa_nodes=frozenset({0}))),
    "numaNode list": ({"numaNode": [0, 2]}, Allocation(numa_nodes=frozenset({0, 2}))),
    "numaSocket int": ({"numaSocket": 1}, Allocation(sockets=frozenset({1}))),
    "numaSocket list": ({"numaSocket": [0, 1]}, Allocation(sockets=frozenset({0, 1}))),
    "nodes are the union of all three": (
        {"numaNodeResources": [{"node": 1}], "cpuSharedPools": [{"node": 2}], "numaNode": [3]},
        Allocation(numa_nodes=frozenset({1, 2, 3})),
    ),
    "nulls are absent": (
        {"numaNodeResources": None, "cpuSharedPools": None, "numaNode": None, "numaSocket": None},
        Allocation(),
    ),
    "unknown fields ignored": ({"cpuset": "1", "future": {"x": [1]}}, Allocation(CPUSet.parse("1"))),
}


@pytest.mark.parametrize(("obj", "expect"), GOOD.values(), ids=GOOD.keys())
def test_good_allocations(obj: Any, expect: Allocation) -> None:
    assert parse_allocation(json.dumps(obj)) == expect


BAD: dict[str, str] = {
    "not json": "{not json",
    "json list": "[1, 2]",
    "json string": '"0-3"',
    "json null": "null",
    "cpuset not a string": '{"cpuset": 3}',
    "cpuset does not parse": '{"cpuset": "0-x"}',
    "cpuset above max": '{"cpuset": "0-99999999"}',
    "numaNodeResources not a list": '{"numaNodeResources": {"node": 1}}',
    "entry without node": '{"numaNodeResources": [{"resources": {}}]}',
    "entry node is a string": '{"numaNodeResources": [{"node": "1"}]}',
    "entry node is a bool": '{"numaNodeResources": [{"node": true}]}',
    "entry not an object": '{"numaNodeResources": [1]}',
    "pool entry without node": '{"cpuSharedPools": [{"socket": 0}]}',
    "numaNode string": '{"numaNode": "0"}',
    "numaNode float": '{"numaNode": 1.0}',
    "numaNode list with string": '{"numaNode": [0, "1"]}',
    "numaSocket object": '{"numaSocket": {"0": 1}}',
    "deep nesting": "[" * 100_000,
}


@pytest.mark.parametrize("text", BAD.values(), ids=BAD.keys())
def test_bad_allocations_raise(text: str) -> None:
    with pytest.raises(AllocationError):
        parse_allocation(text)


def test_numa_bound() -> None:
    assert not Allocation(CPUSet.parse("1")).numa_bound
    assert Allocation(numa_nodes=frozenset({0})).numa_bound
    assert Allocation(sockets=frozenset({0})).numa_bound


def test_either_name_is_accepted() -> None:
    for name in (RESOURCE_STATUS_ANNOTATION, ALLOC_STATUS_ANNOTATION):
        alloc = allocation_from_annotations({name: '{"cpuset": "2"}'})
        assert alloc is not None and str(alloc.cpuset) == "2"


def test_first_name_wins_when_both_present() -> None:
    both = {ALLOC_STATUS_ANNOTATION: '{"cpuset": "9"}', RESOURCE_STATUS_ANNOTATION: '{"cpuset": "1"}'}
    alloc = allocation_from_annotations(both)
    assert alloc is not None and str(alloc.cpuset) == "1"


def test_first_name_wins_even_when_it_is_bad() -> None:
    both = {RESOURCE_STATUS_ANNOTATION: "{bad", ALLOC_STATUS_ANNOTATION: '{"cpuset": "1"}'}
    with pytest.raises(AllocationError, match=RESOURCE_STATUS_ANNOTATION):
        allocation_from_annotations(both)


def test_no_annotation_is_none() -> None:
    assert allocation_from_annotations({"other": "x"}) is None
