"""CPUs going offline and coming back under a running proxy (daemon/topology_watch.py)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger

from cri_proxy.config import Config, check_cpus
from cri_proxy.cpu import CPUSet
from cri_proxy.daemon.topology_watch import TopologyWatch
from cri_proxy.errors import ConfigError
from cri_proxy.sysfs import read_topology
from tests.unit.enforce_support import alloc, fake_sysfs, node


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


@contextlib.contextmanager
def said(level: str = "INFO") -> Iterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m).rstrip("\n")), level=level, format="{level} {message}")
    try:
        yield lines
    finally:
        logger.remove(sink)


def _online(sysfs: Path, cpus: str) -> None:
    (sysfs / "devices/system/cpu/online").write_text(f"{cpus}\n")


def test_containers_follow_cpus_going_offline_and_coming_back(tmp_path: Path) -> None:
    """CPUs 8-15 (NUMA node 1) go offline: every decision is made again over 0-7, the running
    containers are moved off them (cgroup v1 would refuse a cpuset naming them: runc could not
    create the container), a new container never gets them, and an LSR pod's CPUs that are all
    offline now fall back to the LS rule, reported. They come back: the pools take them again
    (v1 dropped them from every cpuset for good, so only a write brings them back)."""

    async def main() -> None:
        async with node(tmp_path) as n:
            _, ls = await n.run_pod("ls")
            _, be = await n.run_pod("be", qos="besteffort", labels={"koordinator.sh/qosClass": "BE"})
            lsr_labels = {"koordinator.sh/qosClass": "LSR"}
            _, lsr = await n.run_pod("lsr", qos="guaranteed", labels=lsr_labels, annotations=alloc("12-13"))
            await n.settle()
            assert [n.cpuset(c["main"]) for c in (ls, be, lsr)] == ["0-11,14-15", "0-15", "12-13"]

            _online(n.dir / "sys", "0-7")
            with said("WARNING") as lines:
                assert await n.proxy.topology_watch.look()
            assert [line for line in lines if "CPUs 8-15" in line] == [
                "WARNING CPUs 8-15 went offline (online now 0-7): decisions made again,"
                " containers moved off them"
            ]
            await n.settle()
            assert [n.cpuset(c["main"]) for c in (ls, be, lsr)] == ["0-7", "0-7", "0-7"]
            _, late = await n.run_pod("late", qos="besteffort", labels={"koordinator.sh/qosClass": "BE"})
            assert n.cpuset(late["main"]) == "0-7"
            problems = await n.introspect("Plan")
            assert any(p["kind"] == "cpus-not-online" for p in problems["problems"]), problems
            assert not await n.proxy.topology_watch.look()  # nothing changed since

            _online(n.dir / "sys", "0-15")
            with said() as lines:
                assert await n.proxy.topology_watch.look()
            assert [line for line in lines if "CPUs 8-15" in line] == [
                "INFO CPUs 8-15 came online (online now 0-15): decisions made again, the pools take them"
            ]
            await n.settle()
            assert [n.cpuset(c["main"]) for c in (ls, be, lsr, late)] == [
                "0-11,14-15",
                "0-15",
                "12-13",
                "0-15",
            ]

    run(main())


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("garbage", "online"),
        ("empty", "no CPU online"),
        ("directory", "cannot read"),
    ],
)
def test_an_unreadable_online_file_leaves_the_topology_in_force(
    tmp_path: Path, fault: str, words: str
) -> None:
    """Said once (not every look), the topology in force kept, and said again when readable."""
    sysfs = fake_sysfs(tmp_path / "sys", {0: "0-3"})
    topology = [read_topology(sysfs)]
    watch = TopologyWatch(sysfs, lambda: topology[-1], topology.append)
    online = sysfs / "devices/system/cpu/online"
    if fault == "directory":
        online.unlink()
        online.mkdir()
    else:
        online.write_text({"garbage": "0-x\n", "empty": "\n"}[fault])

    async def looks() -> list[bool]:
        return [await watch.look() for _ in range(3)]

    with said() as lines:
        assert asyncio.run(looks()) == [False, False, False]
    assert (
        len(lines) == 1 and lines[0].startswith("WARNING CPU topology not read again") and words in lines[0]
    )
    assert len(topology) == 1
    if fault == "directory":
        shutil.rmtree(online)
    online.write_text("0-1\n")
    with said() as lines:
        assert asyncio.run(looks()) == [True, False, False]
    assert lines[0] == "INFO CPU topology readable again"
    assert [str(t.online) for t in topology] == ["0-3", "0-1"]
    assert str(topology[-1].numa_nodes[0]) == "0-1"  # the NUMA node's list cut to the online CPUs


def test_reserved_cpus_offline_now_are_no_reason_to_refuse_a_start() -> None:
    """A reserved CPU the node has but that is offline now (a failing core the kernel took out)
    must not keep the proxy, and with it the node's CRI path, down: warned of, used once back.
    One the node does not have at all is a bad setting, as before."""
    config = Config(reserved_cpus="0-1", system_cpus="2-3").validate()
    online, present = CPUSet.parse("0,2-15"), CPUSet.parse("0-15")
    assert check_cpus(config, online, present) == ["reserved_cpus: CPUs 1 are offline now (online: 0,2-15)"]
    with pytest.raises(ConfigError, match="reserved_cpus: CPUs 1 are not online"):
        check_cpus(config, online)  # no `present` known: as before
    with pytest.raises(ConfigError, match="system_cpus: CPUs 16 are not online"):
        check_cpus(Config(system_cpus="16").validate(), online, present)
    every = Config(reserved_cpus="0-7").validate()
    assert check_cpus(every, CPUSet.parse("0-7"), present) == [
        "reserved_cpus: 0-7 covers every CPU online now (0-7)"
    ]
    with pytest.raises(ConfigError, match="covers every online CPU"):
        check_cpus(Config(reserved_cpus="0-15").validate(), online, present)


def test_a_start_with_a_reserved_cpu_offline_serves_and_says_so(tmp_path: Path) -> None:
    """The node has CPUs 0-15 (`cpu/present`), 8 is offline, `reserved_cpus = "8"`: the proxy is
    built (it used to refuse: exit status 2, and the kubelet without its runtime), names CPU 8, and
    its pools are every online CPU; CPU 8 back online is reserved again."""
    sysfs = fake_sysfs(tmp_path / "sys", {0: "0-7", 1: "8-15"})
    (sysfs / "devices/system/cpu/present").write_text("0-15\n")
    _online(sysfs, "0-7,9-15")

    async def main() -> None:
        from cri_proxy.serve import Proxy

        config = Config(
            listen=f"unix://{tmp_path}/proxy.sock",
            runtime_endpoint=f"unix://{tmp_path}/runtime.sock",
            state_dir=str(tmp_path / "state"),
            kubelet_state_file=str(tmp_path / "cpu_manager_state"),
            sysfs_root=str(sysfs),
            reserved_cpus="8",
        ).validate()
        with said("WARNING") as lines:
            proxy = Proxy(config)
        assert lines == [
            "WARNING reserved_cpus: CPUs 8 are offline now (online: 0-7,9-15): used once online again"
        ]
        assert proxy.policy.plan().pools.ls == CPUSet.parse("0-7,9-15")
        _online(sysfs, "0-15")
        assert await proxy.topology_watch.look()
        assert proxy.policy.plan().pools.ls == CPUSet.parse("0-7,9-15")  # 8 reserved again
        await proxy.relay.channel.close(None)

    run(main())
