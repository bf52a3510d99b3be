"""Every log line about a container names its pod (`namespace/name`) and the container's name.

`about` gives a logger bound with `namespace`, `pod`, `container` and `container_id` (JSON logs carry
them as fields) and the text that names them in a plain line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loguru import logger

from cri_proxy.state.model import ContainerRecord, NodeState, PodRecord

if TYPE_CHECKING:
    from loguru import Logger


def about_pod(pod: PodRecord | None, container: str, container_id: str = "") -> tuple[Logger, str]:
    """(a logger bound with the pod and container, "ns/name container" for the message)."""
    namespace, name = (pod.namespace, pod.name) if pod is not None else ("", "")
    bound = logger.bind(namespace=namespace, pod=name, container=container, container_id=container_id)
    where = f"{pod.key} {container}" if pod is not None else f"(unknown pod) {container}"
    if container_id and not container_id.startswith("pending/"):
        where += f" ({container_id[:13]})"
    return bound, where


def about(state: NodeState, c: ContainerRecord) -> tuple[Logger, str]:
    """`about_pod` for a container record, its pod looked up in the state."""
    return about_pod(state.pod(c.sandbox_id), c.name, c.id)
