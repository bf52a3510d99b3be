"""Merging an UpdateContainerResources into the resources known, as the runtime does."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cri_api.v1 import api_pb2 as v1
from cri_proxy.state.resources import merge_linux_resources

INTS = st.sampled_from([0, 0, 1, 1024, 64 << 20, 96 << 20, -1])
PAGES = st.lists(
    st.builds(
        v1.HugepageLimit, page_size=st.sampled_from(["2MB", "1GB"]), limit=st.sampled_from([0, 2 << 20])
    ),
    max_size=2,
)


@st.composite
def resources(draw: Any) -> Any:
    return v1.LinuxContainerResources(
        cpu_period=draw(INTS),
        cpu_quota=draw(INTS),
        cpu_shares=draw(INTS),
        memory_limit_in_bytes=draw(INTS),
        oom_score_adj=draw(INTS),
        cpuset_cpus=draw(st.sampled_from(["", "0", "0-1"])),
        cpuset_mems=draw(st.sampled_from(["", "0"])),
        hugepage_limits=draw(PAGES),
        unified=draw(st.dictionaries(st.sampled_from(["memory.swap.max", "cpu.weight"]), st.just("0"))),
        memory_swap_limit_in_bytes=draw(INTS),
    )


@given(current=resources(), update=resources())
def test_what_an_update_sets_wins_and_the_rest_stays(current: Any, update: Any) -> None:
    merged = v1.LinuxContainerResources()
    merged.CopyFrom(current)
    merge_linux_resources(merged, update)
    sent = {fd.name for fd, _ in update.ListFields()}
    for fd in v1.LinuxContainerResources.DESCRIPTOR.fields:
        name = fd.name
        if name == "unified":
            assert dict(merged.unified) == {**current.unified, **update.unified}
        elif name == "memory_swap_limit_in_bytes" and name not in sent and update.memory_limit_in_bytes:
            assert merged.memory_swap_limit_in_bytes == 0  # the runtime's to set for the new limit
        else:
            assert getattr(merged, name) == getattr(update if name in sent else current, name), name


def test_a_resize_without_a_swap_limit_drops_the_one_learned_from_the_runtime() -> None:
    """containerd's ContainerStatus reports the swap limit it set (= the memory limit); a kubelet's
    resize up sends no swap limit. Kept, 96 MiB would go with 64 MiB of memory+swap: runc's EINVAL."""
    known = v1.LinuxContainerResources(memory_limit_in_bytes=64 << 20, memory_swap_limit_in_bytes=64 << 20)
    merge_linux_resources(known, v1.LinuxContainerResources(memory_limit_in_bytes=96 << 20, cpu_shares=1024))
    assert (known.memory_limit_in_bytes, known.memory_swap_limit_in_bytes) == (96 << 20, 0)
    merge_linux_resources(known, v1.LinuxContainerResources(cpuset_cpus="0"))  # the CPU manager's
    assert (known.memory_limit_in_bytes, known.memory_swap_limit_in_bytes, known.cpuset_cpus) == (
        96 << 20,
        0,
        "0",
    )
    both = v1.LinuxContainerResources(memory_limit_in_bytes=48 << 20, memory_swap_limit_in_bytes=48 << 20)
    merge_linux_resources(known, both)  # the kubelet on cgroup v1 since 1.28 sends both
    assert (known.memory_limit_in_bytes, known.memory_swap_limit_in_bytes) == (48 << 20, 48 << 20)
