"""kubelet's static CPU manager state file, `cpu_manager_state` ("Inputs" and "Pools").

v1: `{"policyName", "defaultCpuSet", "entries": {containerID: cpus}, "checksum"}`.
v2: `{"policyName", "defaultCpuSet", "entries": {podUID: {containerName: cpus}}, "checksum"}`.
The checksum is not verified: kubelet owns the file and rewrites it whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from cri_proxy.cpu.cpuset import EMPTY, CPUSet
from cri_proxy.errors import CpuError, KubeletStateError

STATIC_POLICY = "static"


@dataclass(frozen=True)
class KubeletState:
    """A parsed state file. Exactly one of the entry maps is filled (both empty: no entries)."""

    policy_name: str
    default_cpuset: CPUSet = EMPTY
    pod_entries: Mapping[str, Mapping[str, CPUSet]] = field(default_factory=dict)
    """v2: pod uid -> container name -> CPUs."""
    container_entries: Mapping[str, CPUSet] = field(default_factory=dict)
    """v1: container id -> CPUs."""

    @property
    def static(self) -> bool:
        """Only the static policy pins containers; any other policy means "as if no file"."""
        return self.policy_name == STATIC_POLICY

    @property
    def version(self) -> int | None:
        """1 or 2 by the shape of `entries`; None when there are no entries to tell."""
        if self.pod_entries:
            return 2
        if self.container_entries:
            return 1
        return None

    def container_cpus(self, pod_uid: str, container_name: str, container_id: str) -> CPUSet | None:
        """The container's own entry (v2 by pod uid and name, v1 by id), or None."""
        if self.pod_entries:
            per_pod = self.pod_entries.get(pod_uid)
            return None if per_pod is None else per_pod.get(container_name)
        return self.container_entries.get(container_id)


def _cpus(value: object, where: str) -> CPUSet:
    if not isinstance(value, str):
        raise KubeletStateError(f"{where}: expected a CPU list string, not {type(value).__name__}")
    try:
        return CPUSet.parse(value)
    except CpuError as e:
        raise KubeletStateError(f"{where}: {e}") from None


def parse_kubelet_state(data: object) -> KubeletState:
    """Parse the file's decoded JSON; `KubeletStateError` names what is of an unknown shape."""
    if not isinstance(data, dict):
        raise KubeletStateError(f"expected a JSON object, not {type(data).__name__}")
    policy = data.get("policyName")
    if not isinstance(policy, str):
        raise KubeletStateError("policyName: missing or not a string")
    default = data.get("defaultCpuSet")
    default_cpuset = EMPTY if default is None else _cpus(default, "defaultCpuSet")
    entries = data.get("entries")
    if entries is None:
        entries = {}
    if not isinstance(entries, dict):
        raise KubeletStateError(f"entries: expected an object, not {type(entries).__name__}")
    values = list(entries.values())
    if all(isinstance(v, str) for v in values):
        v1 = {k: _cpus(v, f"entries[{k!r}]") for k, v in entries.items()}
        return KubeletState(policy, default_cpuset, container_entries=MappingProxyType(v1))
    if all(isinstance(v, dict) for v in values):
        v2 = {
            uid: MappingProxyType({n: _cpus(c, f"entries[{uid!r}][{n!r}]") for n, c in per_pod.items()})
            for uid, per_pod in entries.items()
        }
        return KubeletState(policy, default_cpuset, pod_entries=MappingProxyType(v2))
    raise KubeletStateError("entries: values are neither all CPU lists (v1) nor all objects (v2)")


def parse_kubelet_state_text(text: str | bytes) -> KubeletState:
    """Parse the file's text (as a watcher reads it); not JSON is `KubeletStateError` too."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise KubeletStateError(f"not JSON: {e}") from None
    return parse_kubelet_state(data)
