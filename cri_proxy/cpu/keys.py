"""Label and annotation names ("Keys" in cpuset-rules.md). Written once, read everywhere."""

from __future__ import annotations

QOS_LABEL = "koordinator.sh/qosClass"
"""Pod label naming the Koordinator QoS class."""

RESOURCE_STATUS_ANNOTATION = "scheduling.koordinator.sh/resource-status"
"""The allocation annotation Koordinator has shipped since v0.5."""

ALLOC_STATUS_ANNOTATION = "scheduler.koordinator.sh/alloc-status"
"""The allocation annotation named in the Koordinator proposal."""

ALLOCATION_ANNOTATIONS: tuple[str, ...] = (RESOURCE_STATUS_ANNOTATION, ALLOC_STATUS_ANNOTATION)
"""Accepted allocation annotation names, in priority order: when both are present the first wins."""
