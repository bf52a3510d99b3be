"""Topology as a value, and the sysfs reader over a fake tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from cri_proxy.cpu import CPUSet, Topology
from cri_proxy.errors import SysfsError
from cri_proxy.sysfs import read_topology


def test_build_defaults_online_and_sockets_from_nodes() -> None:
    t = Topology.build({0: CPUSet.parse("0-3"), 1: CPUSet.parse("4-7")})
    assert str(t.online) == "0-7"
    assert dict(t.sockets) == dict(t.numa_nodes)


def test_cpus_of_is_the_union_and_ignores_unknown_ids() -> None:
    t = Topology.build({0: CPUSet.parse("0-3"), 1: CPUSet.parse("4-7")}, {0: CPUSet.parse("0-7")})
    assert str(t.cpus_of([1])) == "4-7"
    assert str(t.cpus_of([0], [0])) == "0-7"
    assert str(t.cpus_of([9], [9])) == ""
    assert str(t.cpus_of()) == ""


def test_single_node() -> None:
    t = Topology.single_node(CPUSet.parse("0-5"))
    assert dict(t.numa_nodes) == {0: CPUSet.parse("0-5")} == dict(t.sockets)


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _fake_sysfs(root: Path, online: str, nodes: dict[int, str], packages: dict[int, int]) -> None:
    _write(root, "devices/system/cpu/online", online + "\n")
    for n, cpus in nodes.items():
        _write(root, f"devices/system/node/node{n}/cpulist", cpus + "\n")
    for cpu, pkg in packages.items():
        _write(root, f"devices/system/cpu/cpu{cpu}/topology/physical_package_id", f"{pkg}\n")


def test_sysfs_two_nodes_two_sockets(tmp_path: Path) -> None:
    _fake_sysfs(tmp_path, "0-7", {0: "0-3", 1: "4-7"}, {c: c // 4 for c in range(8)})
    _write(tmp_path, "devices/system/node/possible", "0-1\n")  # not a node dir: ignored
    t = read_topology(tmp_path)
    assert str(t.online) == "0-7"
    assert {n: str(c) for n, c in t.numa_nodes.items()} == {0: "0-3", 1: "4-7"}
    assert {s: str(c) for s, c in t.sockets.items()} == {0: "0-3", 1: "4-7"}


def test_sysfs_offline_cpus_are_cut_from_nodes(tmp_path: Path) -> None:
    _fake_sysfs(tmp_path, "0-2,4-7", {0: "0-3", 1: "4-7"}, {c: 0 for c in range(8)})
    t = read_topology(str(tmp_path))
    assert str(t.numa_nodes[0]) == "0-2"
    assert str(t.sockets[0]) == "0-2,4-7"


def test_sysfs_without_numa_dir_is_one_node(tmp_path: Path) -> None:
    _fake_sysfs(tmp_path, "0-3", {}, {})
    t = read_topology(tmp_path)
    assert {n: str(c) for n, c in t.numa_nodes.items()} == {0: "0-3"}
    assert {s: str(c) for s, c in t.sockets.items()} == {0: "0-3"}


def test_sysfs_missing_online_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(SysfsError, match="online"):
        read_topology(tmp_path)


def test_sysfs_bad_cpulist_names_the_file(tmp_path: Path) -> None:
    _fake_sysfs(tmp_path, "0-3", {0: "zero"}, {})
    with pytest.raises(SysfsError, match="node0/cpulist"):
        read_topology(tmp_path)


def test_sysfs_bad_package_id_names_the_file(tmp_path: Path) -> None:
    _fake_sysfs(tmp_path, "0", {0: "0"}, {})
    _write(tmp_path, "devices/system/cpu/cpu0/topology/physical_package_id", "x\n")
    with pytest.raises(SysfsError, match="physical_package_id"):
        read_topology(tmp_path)
