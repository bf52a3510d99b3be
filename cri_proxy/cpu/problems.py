"""Problems the rules meet ("Bad input" in cpuset-rules.md, kinds from plan-snapshot.md), as data."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ProblemKind(StrEnum):
    """The `kind` strings of `plan` output; they are an interface, so they never change spelling."""

    BAD_ANNOTATION = "bad-annotation"
    MISSING_CPUSET = "missing-cpuset"
    CPUS_NOT_ONLINE = "cpus-not-online"
    EXCLUSIVE_CONFLICT = "exclusive-conflict"
    NUMA_EMPTY = "numa-empty"
    POOL_EXHAUSTED = "pool-exhausted"
    BAD_KUBELET_STATE = "bad-kubelet-state"
    API_UNREACHABLE = "api-unreachable"
    """Only from the live proxy (its Kubernetes API watch), never from `plan --snapshot`: the
    decisions then rest on CRI data alone (plus the API views seen before)."""
    BAD_TEXT = "bad-text"
    """Only from the live proxy: a pod's label or annotation the runtime holds is not valid UTF-8
    (read with replacement characters)."""
    API_WRONG_NODE = "api-wrong-node"
    """Only from the live proxy (its Kubernetes API watch): none of the pods the runtime runs is
    bound to the watched node in the API, so `[kubernetes] node_name` is not the kubelet's node
    name (its --hostname-override) and the watch follows nothing."""
    CPUS_LEFT_OUT = "cpus-left-out"
    """Only from the live proxy, under cgroup v1: online CPUs that the cgroups above the pods do not
    hold (the kernel took them out when they went offline); pods are given the others."""
    EXCLUSIVE_OVERLAP = "exclusive-overlap"
    """Only from the live proxy: other containers are still on an LSE/LSR container's CPUs (the
    pool was empty, the wait timed out, a conflict); the message names every one."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One bad input or conflict; `pod` is `namespace/name`, or None for node-wide problems.

    `holders`: for `pool-exhausted`, who holds the CPUs the pool lost (`LSE default/x 0-3`,
    `reserved 0`), so the message never leaves the operator guessing.
    """

    pod: str | None
    kind: ProblemKind
    message: str
    holders: tuple[str, ...] = ()
