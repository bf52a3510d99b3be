"""Reading a container's real cpuset from cgroup files laid out as runc writes them (v1 and v2,
cgroupfs and systemd drivers), in a temporary cgroup root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cri_proxy.sources.cgroupfs import POD_ROOTS, CgroupReader, container_dirs, expand_slice, pod_roots

CID = "4f" * 32


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v1_root(tmp: Path) -> Path:
    write(tmp / "cpuset" / "cpuset.cpus", "0-7\n")
    return tmp


def v2_root(tmp: Path) -> Path:
    write(tmp / "cgroup.controllers", "cpuset cpu io memory pids\n")
    return tmp


@pytest.mark.parametrize(
    "parent,expected",
    [
        ("/kubepods/burstable/poduid", ["kubepods/burstable/poduid/" + CID]),
        (
            "kubepods-burstable-pod1_2.slice",
            [
                f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice/{p}{CID}.scope"
                for p in ("cri-containerd-", "crio-", "docker-")
            ]
            + [f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice/{CID}"],
        ),
        ("", []),
    ],
    ids=["cgroupfs", "systemd", "no-parent"],
)
def test_container_dirs(parent: str, expected: list[str]) -> None:
    assert container_dirs(parent, CID) == expected


def test_container_ids_cannot_escape_the_hierarchy() -> None:
    assert container_dirs("/kubepods/podx", "../../etc") == []
    assert container_dirs("/kubepods/podx", "..") == []


def test_expand_slice() -> None:
    assert expand_slice("kubepods.slice") == "kubepods.slice"
    assert expand_slice("kubepods-pod12.slice") == "kubepods.slice/kubepods-pod12.slice"


def test_v1_cgroupfs_driver(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    write(root / "cpuset" / "kubepods" / "burstable" / "poduid" / CID / "cpuset.cpus", "3,1-2\n")
    reader = CgroupReader(str(root))
    assert reader.read("/kubepods/burstable/poduid", CID) == "1-3"  # canonical
    assert reader.read("/kubepods/burstable/poduid", "f" * 64) is None  # no such container
    assert reader.read("/kubepods/burstable/other", CID) is None


def test_v2_systemd_driver_and_an_empty_cpuset_means_the_effective_one(tmp_path: Path) -> None:
    root = v2_root(tmp_path)
    pod = root / "kubepods.slice" / "kubepods-besteffort.slice" / "kubepods-besteffort-podab.slice"
    write(pod / f"cri-containerd-{CID}.scope" / "cpuset.cpus", "\n")
    write(pod / f"cri-containerd-{CID}.scope" / "cpuset.cpus.effective", "0-3\n")
    write(pod / f"crio-{'e' * 64}.scope" / "cpuset.cpus", "2\n")
    reader = CgroupReader(str(root))
    assert reader.read("kubepods-besteffort-podab.slice", CID) == "0-3"
    assert (
        reader.read("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podab.slice", "e" * 64)
        == "2"
    )


def test_no_cpuset_hierarchy_or_garbage_reads_nothing(tmp_path: Path) -> None:
    assert CgroupReader(str(tmp_path)).read("/kubepods/podx", CID) is None
    root = v1_root(tmp_path)
    write(root / "cpuset" / "kubepods" / "podx" / CID / "cpuset.cpus", "not a list")
    assert CgroupReader(str(root)).read("/kubepods/podx", CID) is None


def test_a_fifo_does_not_block(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    target = root / "cpuset" / "kubepods" / "podx" / CID
    target.mkdir(parents=True)
    os.mkfifo(target / "cpuset.cpus")
    assert CgroupReader(str(root)).read("/kubepods/podx", CID) is None


def test_the_cgroups_above_the_pods_for_either_driver_and_any_cgroup_root() -> None:
    roots = pod_roots(
        [
            "/kubepods/burstable/poduid",
            "/kubepods/poduid",  # guaranteed: no QoS level
            "kubepods-besteffort-pod1_2.slice",
            "/custom/burstable/podx",  # a kubelet --cgroup-root of another name
            "/../..",
        ]
    )
    assert roots == [*POD_ROOTS, "custom", "custom/burstable"]  # never a pod's own, never outside


def test_the_pod_cgroups_cpus_under_v1_only(tmp_path: Path) -> None:
    v1 = v1_root(tmp_path / "v1")
    write(v1 / "cpuset/kubepods/cpuset.cpus", "0-7\n")
    write(v1 / "cpuset/kubepods/besteffort/cpuset.cpus", "0-3\n")
    write(v1 / "cpuset/kubepods/burstable/cpuset.cpus", "\n")  # not set up: no bound
    write(v1 / "cpuset/kubepods.slice/cpuset.cpus", "garbage\n")
    assert {k: str(v) for k, v in CgroupReader(str(v1)).pod_root_cpus().items()} == {
        "kubepods": "0-7",
        "kubepods/besteffort": "0-3",
    }
    v2 = v2_root(tmp_path / "v2")
    write(v2 / "kubepods/cpuset.cpus", "0-3\n")  # a v2 parent narrows what a child gets, never refuses
    assert CgroupReader(str(v2)).pod_root_cpus() == {}
    assert CgroupReader(str(tmp_path / "none")).pod_root_cpus() == {}
