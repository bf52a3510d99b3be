"""Merging container resources the way the runtime does, so our last-known copy stays true."""

from __future__ import annotations

from typing import Any


def merge_linux_resources(current: Any, update: Any) -> None:
    """Fields set in `update` (non-zero, non-empty) override `current`; the rest stay.

    This is containerd's rule for UpdateContainerResources, and what kubelet relies on when its
    static CPU manager sends only `cpuset_cpus`. `unified` entries merge key by key.

    One field goes with another: a memory limit sent without a swap limit leaves the swap limit
    to the runtime (containerd sets it to the new memory limit), so the one known is dropped. Kept,
    it would go with the new limit (a kubelet's resize up, once the proxy has learned the swap limit
    from ContainerStatus), and runc would refuse a memory limit above the memory+swap limit.
    """
    for fd, value in update.ListFields():
        if fd.name == "unified":
            current.unified.update(value)
        elif fd.is_repeated:
            del getattr(current, fd.name)[:]
            getattr(current, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(current, fd.name).CopyFrom(value)
        else:
            setattr(current, fd.name, value)
    if update.memory_limit_in_bytes and not update.memory_swap_limit_in_bytes:
        current.memory_swap_limit_in_bytes = 0
