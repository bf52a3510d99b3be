"""The records of the node state: one per pod sandbox and per container, frozen.

One normalised record whatever the source (a CRI request, the runtime's listing, a checkpoint
entry), so the hooks, the reconciler, recovery and the merge all feed the same rules.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from cri_api.v1 import api_pb2 as v1


class ContainerState(enum.StrEnum):
    PENDING = "pending"  # CreateContainer forwarded, no id yet: never updated by the reconciler
    CREATED = "created"
    RUNNING = "running"
    EXITED = "exited"
    UNKNOWN = "unknown"  # the runtime cannot say (e.g. a create cut short by its restart): left alone


LIVE_STATES = frozenset({ContainerState.PENDING, ContainerState.CREATED, ContainerState.RUNNING})
UPDATABLE_STATES = frozenset({ContainerState.CREATED, ContainerState.RUNNING})

ACTUAL_CGROUP = "cgroup"
ACTUAL_STATUS = "status"


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A pod sandbox: identity, the QoS label and allocation annotations, the cgroup parent."""

    sandbox_id: str
    uid: str
    name: str
    namespace: str
    cgroup_parent: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    ready: bool = True
    api_version: str = "v1"
    problems: tuple[str, ...] = ()  # what could not be read cleanly (e.g. a label not UTF-8)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ContainerRecord:
    """A container: its pod, its full last-known resources, and the cpuset last applied to it.

    `resources` is the runtime.v1 `LinuxContainerResources` wire encoding (v1alpha2 is the same
    on the wire): the reconciler sends it back whole with only `cpuset_cpus` replaced. `applied`
    is the canonical cpuset the runtime was last told (None: unknown, "" : none set).

    `actual_cpuset` is what the container really has, as last read (canonical; None: never read),
    `actual_source` where it was read (`ACTUAL_CGROUP`: its cgroup's `cpuset.cpus`, the truth;
    `ACTUAL_STATUS`: the runtime's ContainerStatus, when the cgroup cannot be read) and
    `actual_at` when (Unix time). Checkpointed as a last reading only: it is read again after a restart.

    `pin` is the canonical cpuset an operator forced (`ctl update --cpuset-cpus X --force`), which
    replaces the rules' set until it is removed (`ctl update --unpin`) or the container is; None:
    no pin. Checkpointed, so it survives a proxy restart, and it goes with the record.
    """

    id: str
    sandbox_id: str
    name: str
    resources: bytes = b""
    state: ContainerState = ContainerState.CREATED
    applied: str | None = None
    attempt: int = 0
    api_version: str = "v1"
    actual_cpuset: str | None = None
    actual_source: str = ""
    actual_at: float = 0.0
    pin: str | None = None

    def linux_resources(self) -> v1.LinuxContainerResources:
        return v1.LinuxContainerResources.FromString(self.resources)
