"""Node facts + node state -> the rules' inputs -> a Plan, cached until something changes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from types import MappingProxyType

from cri_proxy.config import Config
from cri_proxy.cpu import CPUSet, NodeInputs, Plan, Topology, decide
from cri_proxy.sources.kube_api import KubeApiWatcher
from cri_proxy.sources.kubelet_file import KubeletStateFile
from cri_proxy.state.model import NodeState


class Policy:
    """Holds what the decision depends on besides the state; `plan()` is the current decision."""

    def __init__(
        self,
        state: NodeState,
        topology: Topology,
        settings: Callable[[], Config],
        kubelet: KubeletStateFile | None = None,
        api: KubeApiWatcher | None = None,
    ) -> None:
        self.state = state
        self.topology = topology
        self.settings = settings  # reserved and system CPUs; a reload swaps the object, see plan()
        self.kubelet = kubelet
        self.api = api
        self._facts_version = 0
        self._cached: tuple[int, int, Config, Plan] | None = None

    def facts_changed(self) -> None:
        """Call after changing the topology, the kubelet state or a source's problem. Not for
        settings: a reload swaps the settings object, which `plan()` notices by itself."""
        self._facts_version += 1

    @property
    def reserved(self) -> CPUSet:
        return CPUSet.parse(self.settings().reserved_cpus)

    @property
    def system(self) -> CPUSet:
        return CPUSet.parse(self.settings().system_cpus)

    def inputs(self) -> NodeInputs:
        kubelet = self.kubelet
        problems = tuple(
            source.problem
            for source in (kubelet, self.api)
            if source is not None and source.problem is not None
        )
        return NodeInputs(
            topology=self.topology,
            pods=self.state.pod_infos(),
            reserved=self.reserved,
            system=self.system,
            kubelet=kubelet.state if kubelet is not None else None,
            input_problems=problems,
        )

    def plan(self) -> Plan:
        generation, facts, settings = self.state.generation, self._facts_version, self.settings()
        cached = self._cached
        if cached is None or cached[:2] != (generation, facts) or cached[2] is not settings:
            cached = self._cached = (generation, facts, settings, self._explain(decide(self.inputs())))
        return cached[3]

    def _explain(self, plan: Plan) -> Plan:
        """Say in `why` when a pod's QoS label or allocation came from the Kubernetes API, not CRI."""
        sourced = self.state.api_sourced()
        if not sourced:
            return plan
        containers = {
            cid: replace(d, why=f"{d.why} ({sourced[d.pod]} from the Kubernetes API)")
            if d.pod in sourced
            else d
            for cid, d in plan.containers.items()
        }
        return Plan(plan.pools, MappingProxyType(containers), plan.problems)
