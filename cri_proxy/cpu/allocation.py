"""The scheduler's allocation annotation ("Keys" in cpuset-rules.md): JSON text in, `Allocation` out.

Every field is optional, `null` equals absent, unknown fields are ignored, and one field of the wrong
type makes the whole annotation bad (`AllocationError`), so a half-understood answer is never used.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeGuard

from cri_proxy.cpu.cpuset import CPUSet
from cri_proxy.cpu.keys import ALLOCATION_ANNOTATIONS
from cri_proxy.errors import AllocationError, CpuError


@dataclass(frozen=True, slots=True)
class Allocation:
    """What the scheduler decided for a pod. `cpuset` None: the annotation names no CPUs."""

    cpuset: CPUSet | None = None
    numa_nodes: frozenset[int] = frozenset()
    sockets: frozenset[int] = frozenset()

    @property
    def numa_bound(self) -> bool:
        """True when the pod is bound to NUMA nodes or sockets (the LS rule narrows to them)."""
        return bool(self.numa_nodes or self.sockets)


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_or_ints(obj: Mapping[str, object], key: str) -> set[int]:
    v = obj.get(key)
    if v is None:
        return set()
    if _is_int(v):
        return {v}
    if isinstance(v, list) and all(_is_int(x) for x in v):
        return {x for x in v if _is_int(x)}
    raise AllocationError(f"field {key!r} must be an integer or a list of integers, not {v!r:.60}")


def _entry_nodes(obj: Mapping[str, object], key: str) -> set[int]:
    v = obj.get(key)
    if v is None:
        return set()
    if not isinstance(v, list):
        raise AllocationError(f"field {key!r} must be a list, not {type(v).__name__}")
    nodes: set[int] = set()
    for i, entry in enumerate(v):
        node = entry.get("node") if isinstance(entry, dict) else None
        if not _is_int(node):
            raise AllocationError(f"{key}[{i}] has no integer 'node'")
        nodes.add(node)
    return nodes


MAX_ANNOTATION_CHARS = 256 * 1024
"""Kubernetes' limit for all of a pod's annotations together: a longer value never came from the API."""
_CACHED_CHARS = 4096  # real values are a few hundred characters; bounds what the cache holds


def parse_allocation(text: str) -> Allocation:
    """Parse one annotation value; raises `AllocationError` saying what is wrong.

    Every plan parses every pod's annotation again, so short values are parsed once and cached.
    """
    if len(text) > MAX_ANNOTATION_CHARS:
        raise AllocationError(f"{len(text)} characters, more than Kubernetes allows ({MAX_ANNOTATION_CHARS})")
    result = _parse_cached(text) if len(text) <= _CACHED_CHARS else _parse_or_error(text)
    if isinstance(result, str):
        raise AllocationError(result)  # a new exception each time: a cached one would grow its traceback
    return result


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> Allocation | str:
    return _parse_or_error(text)


def _parse_or_error(text: str) -> Allocation | str:
    try:
        return _parse(text)
    except AllocationError as e:
        return str(e)


def _parse(text: str) -> Allocation:
    try:
        obj = json.loads(text)
    except (ValueError, TypeError, RecursionError) as e:
        raise AllocationError(f"not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise AllocationError(f"not a JSON object but {type(obj).__name__}")
    raw_cpuset = obj.get("cpuset")
    cpuset: CPUSet | None = None
    if raw_cpuset is not None:
        if not isinstance(raw_cpuset, str):
            raise AllocationError(f"field 'cpuset' must be a string, not {type(raw_cpuset).__name__}")
        try:
            cpuset = CPUSet.parse(raw_cpuset)
        except CpuError as e:
            raise AllocationError(f"field 'cpuset': {e}") from None
    nodes = _entry_nodes(obj, "numaNodeResources") | _entry_nodes(obj, "cpuSharedPools")
    nodes |= _int_or_ints(obj, "numaNode")
    sockets = _int_or_ints(obj, "numaSocket")
    return Allocation(cpuset, frozenset(nodes), frozenset(sockets))


def find_allocation_annotation(annotations: Mapping[str, str]) -> tuple[str, str] | None:
    """The (name, value) of the allocation annotation that counts: the first accepted name present."""
    for name in ALLOCATION_ANNOTATIONS:
        value = annotations.get(name)
        if value is not None:
            return name, value
    return None


def allocation_from_annotations(annotations: Mapping[str, str]) -> Allocation | None:
    """The pod's allocation, or None without one; `AllocationError` names the bad annotation."""
    found = find_allocation_annotation(annotations)
    if found is None:
        return None
    name, value = found
    try:
        return parse_allocation(value)
    except AllocationError as e:
        raise AllocationError(f"annotation {name}: {e}") from None
