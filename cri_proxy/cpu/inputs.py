"""The normalised inputs of the rules ("Inputs" in cpuset-rules.md), whatever their source.

The snapshot loader, the CRI hooks and the restart recovery all build these same values, so the
proxy path, the reconciler and `cri-proxy plan` call one `decide`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cri_proxy.cpu.cpuset import EMPTY, CPUSet
from cri_proxy.cpu.kubelet import KubeletState
from cri_proxy.cpu.problems import Problem
from cri_proxy.cpu.topology import Topology


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """A container as CreateContainer names it: runtime id and name within the pod."""

    id: str
    name: str


@dataclass(frozen=True)
class PodInfo:
    """A pod sandbox as RunPodSandbox describes it, with its containers."""

    uid: str
    name: str
    namespace: str
    cgroup_parent: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    containers: tuple[ContainerInfo, ...] = ()

    @property
    def key(self) -> str:
        """`namespace/name`, how problems and decisions name the pod."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class NodeInputs:
    """Everything the decision depends on. `kubelet` None: no (usable) state file.

    `input_problems` carries problems met while building the inputs (e.g. a bad kubelet state
    file, whose last good contents the caller kept) so the plan reports them with the rest.
    """

    topology: Topology
    pods: tuple[PodInfo, ...] = ()
    reserved: CPUSet = EMPTY
    system: CPUSet = EMPTY
    kubelet: KubeletState | None = None
    input_problems: tuple[Problem, ...] = ()
