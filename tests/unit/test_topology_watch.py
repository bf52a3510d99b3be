"""CPUs going offline and coming back under a running proxy (daemon/topology_watch.py)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from loguru import logger

from cri_proxy.config import Config, check_cpus
from cri_proxy.cpu import CPUSet, Topology
from cri_proxy.daemon.topology_watch import Seen, TopologyWatch
from cri_proxy.errors import ConfigError
from cri_proxy.sysfs import read_topology
from tests.unit.enforce_support import alloc, fake_sysfs, node


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


@contextlib.contextmanager
def said(level: str = "INFO") -> Iterator[list[str]]:
    """The lines the topology watch logs meanwhile (not the creates' and the reconciler's)."""
    lines: list[str] = []
    sink = logger.add(
        lambda m: lines.append(str(m).rstrip("\n")),
        level=level,
        format="{level} {message}",
        filter=lambda record: record["name"] in ("cri_proxy.daemon.topology_watch", "cri_proxy.serve"),
    )
    try:
        yield lines
    finally:
        logger.remove(sink)


async def looked(watch: TopologyWatch, news: bool = True) -> list[str]:
    """What one look said; it saw something new (`news`) or not."""
    with said() as lines:
        assert await watch.look() is news
    return lines


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
            assert await looked(n.proxy.topology_watch) == [
                "WARNING CPUs 8-15 went offline (online now 0-7)",
                "INFO pods are given CPUs 0-7 now (were 0-15): decisions made again, containers updated",
            ]
            await n.settle()
            assert [n.cpuset(c["main"]) for c in (ls, be, lsr)] == ["0-7", "0-7", "0-7"]
            _, late = await n.run_pod("late", qos="besteffort", labels={"koordinator.sh/qosClass": "BE"})
            assert n.cpuset(late["main"]) == "0-7"
            problems = await n.introspect("Plan")
            assert any(p["kind"] == "cpus-not-online" for p in problems["problems"]), problems
            assert not await n.proxy.topology_watch.look()  # nothing changed since

            _online(n.dir / "sys", "0-15")
            assert await looked(n.proxy.topology_watch) == [
                "INFO CPUs 8-15 came online (online now 0-15)",
                "INFO pods are given CPUs 0-15 now (were 0-7): decisions made again, containers updated",
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
    watch = TopologyWatch(
        sysfs, Seen(topology[0].online, {}), topology[0], lambda parents: {}, topology.append
    )
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
    assert check_cpus(config, online, present) == [
        "reserved_cpus: CPUs 1 are offline now (online: 0,2-15); used once online"
    ]
    with pytest.raises(ConfigError, match="reserved_cpus: CPUs 1 are not online"):
        check_cpus(config, online)  # no `present` known: as before
    with pytest.raises(ConfigError, match="system_cpus: CPUs 16 are not online"):
        check_cpus(Config(system_cpus="16").validate(), online, present)
    every = Config(reserved_cpus="0-7").validate()
    assert check_cpus(every, CPUSet.parse("0-7"), present) == [
        "reserved_cpus: 0-7 covers every CPU online now (0-7): the share pools are empty until more"
        " are online"
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
            cgroup_root=str(tmp_path / "cgroup"),
            reserved_cpus="8",
        ).validate()
        with said("WARNING") as lines:
            proxy = Proxy(config)
        assert lines == ["WARNING reserved_cpus: CPUs 8 are offline now (online: 0-7,9-15); used once online"]
        assert proxy.policy.plan().pools.ls == CPUSet.parse("0-7,9-15")
        _online(sysfs, "0-15")
        assert await proxy.topology_watch.look()
        assert proxy.policy.plan().pools.ls == CPUSet.parse("0-7,9-15")  # 8 reserved again
        await proxy.relay.channel.close(None)

    run(main())


def _cgroup_v1(root: Path, sets: dict[str, str]) -> Path:
    """A cgroup v1 cpuset hierarchy under `root`: each path's cpuset.cpus ("" the hierarchy's own)."""
    for path, cpus in sets.items():
        directory = root / "cpuset" / path
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpuset.cpus").write_text(f"{cpus}\n")
    return root


POD_CGROUPS = ("kubepods", "kubepods/burstable", "kubepods/besteffort")


def test_cgroup_v1_pods_are_given_only_the_cpus_their_cgroups_hold(tmp_path: Path) -> None:
    """Under cgroup v1 the kernel takes a CPU that goes offline out of every cpuset for good: back
    online, it is in none of the pod cgroups, and a cpuset naming it cannot be written below them
    (runc: EACCES, the create fails; seen with containerd 1.6 and runc 1.1). So CPUs 8-15 back
    online are named and left out, a new pod is created on the others, and once the pod cgroups
    hold them again (an operator wrote them), the pools take them."""
    cgroup = _cgroup_v1(tmp_path / "cg", {"": "0-15", **dict.fromkeys(POD_CGROUPS, "0-15")})

    async def main() -> None:
        async with node(tmp_path, cgroup_root=str(cgroup)) as n:
            _, ls = await n.run_pod("ls")
            _, be = await n.run_pod("be", qos="besteffort", labels={"koordinator.sh/qosClass": "BE"})
            await n.settle()
            assert [n.cpuset(c["main"]) for c in (ls, be)] == ["0-15", "0-15"]

            _online(n.dir / "sys", "0-7")  # ... and the kernel takes them out of every cpuset
            _cgroup_v1(cgroup, {"": "0-7", **dict.fromkeys(POD_CGROUPS, "0-7")})
            assert await n.proxy.topology_watch.look()
            await n.settle()
            assert [n.cpuset(c["main"]) for c in (ls, be)] == ["0-7", "0-7"]

            _online(n.dir / "sys", "0-15")  # back; the v1 cpusets below the root stay without them
            _cgroup_v1(cgroup, {"": "0-15"})
            lines = await looked(n.proxy.topology_watch)
            assert str(n.proxy.policy.topology.online) == "0-7"  # pods can be given nothing more
            (left_out,) = [
                p for p in (await n.introspect("Plan"))["problems"] if p["kind"] == "cpus-left-out"
            ]
            assert left_out["pod"] is None and "kubepods/besteffort has 0-7" in left_out["message"]
            assert lines == [
                "INFO CPUs 8-15 came online (online now 0-15)",
                "WARNING CPUs 8-15 are online but not in the pod cgroups' cpuset.cpus (kubepods has 0-7,"
                " kubepods/burstable has 0-7, kubepods/besteffort has 0-7): under cgroup v1 a container"
                " cannot be put on CPUs its parents lack (and v1 takes a CPU that goes offline out of"
                " every cpuset for good); pods are given the others until those cgroups hold them",
            ]
            _, late = await n.run_pod("late", qos="besteffort", labels={"koordinator.sh/qosClass": "BE"})
            assert n.cpuset(late["main"]) == "0-7"
            assert await looked(n.proxy.topology_watch, news=False) == []  # said once

            _cgroup_v1(cgroup, {"kubepods": "0-15", "kubepods/burstable": "0-15"})
            lines = await looked(n.proxy.topology_watch)
            assert str(n.proxy.policy.topology.online) == "0-7"
            assert lines[0].startswith(
                "WARNING CPUs 8-15 are online but not in the pod cgroups' cpuset.cpus"
                " (kubepods/besteffort has 0-7)"
            )
            _cgroup_v1(cgroup, {"kubepods/besteffort": "0-15"})  # every one holds them again
            assert await looked(n.proxy.topology_watch) == [
                "INFO the pod cgroups hold every online CPU again",
                "INFO pods are given CPUs 0-15 now (were 0-7): decisions made again, containers updated",
            ]
            await n.settle()
            assert [n.cpuset(c["main"]) for c in (ls, be, late)] == ["0-15", "0-15", "0-15"]
            assert "cpus-left-out" not in {p["kind"] for p in (await n.introspect("Plan"))["problems"]}

    run(main())


def test_a_start_where_the_pod_cgroups_lack_online_cpus_gives_pods_the_others(tmp_path: Path) -> None:
    """The same after a restart of the proxy (or a kubepods restricted on purpose): named at the
    start, and the pools are what the pod cgroups hold. Under v2 (or no cgroup tree) no bound."""
    cgroup = _cgroup_v1(tmp_path / "cg", {"": "0-15", "kubepods": "0-11", "kubepods/besteffort": "0-9"})

    async def main() -> None:
        async with node(tmp_path, cgroup_root=str(cgroup)) as n:
            assert str(n.proxy.policy.topology.online) == "0-9"
            assert str(n.proxy.policy.plan().pools.be) == "0-9"
            _, be = await n.run_pod("be", qos="besteffort", labels={"koordinator.sh/qosClass": "BE"})
            assert n.cpuset(be["main"]) == "0-9"

    run(main())


def _sockets(topology: Topology) -> dict[int, CPUSet]:
    """Those with a CPU: sysfs names a CPU's socket only while it is online."""
    return {s: cpus for s, cpus in topology.sockets.items() if cpus}


CPUS16 = st.integers(min_value=0, max_value=(1 << 16) - 1).map(CPUSet)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(CPUS16, st.sampled_from(["garbage", "empty"])),  # what cpu/online holds
            st.dictionaries(st.sampled_from(POD_CGROUPS), CPUS16.filter(bool), max_size=3),  # held
        ),
        min_size=1,
        max_size=12,
    )
)
@example(  # a new pod cgroup that holds everything: seen changes, what is left out does not
    [
        (CPUSet.parse("0-15"), {"kubepods": CPUSet.parse("0-3")}),
        (CPUSet.parse("0-15"), {"kubepods": CPUSet.parse("0-3"), "kubepods/burstable": CPUSet.parse("0-15")}),
    ]
)
def test_any_run_of_changes_keeps_the_topology_in_force_what_was_seen_last(
    steps: list[tuple[CPUSet | str, dict[str, CPUSet]]],
) -> None:
    """CPUs going and coming, pod cgroups narrowing and widening, the file unreadable now and then,
    in any order: after every look the topology in force is the sysfs one cut to what the last
    readable look saw (online CPUs the pod cgroups all hold), `changed` was told exactly when that
    look saw something new, the problem is there exactly while online CPUs are left out, and each
    change of the online CPUs or of those left out was said once (a fault too, and its end)."""
    with tempfile.TemporaryDirectory() as tmp:
        sysfs = fake_sysfs(Path(tmp) / "sys", {0: "0-7", 1: "8-15"})
        start = read_topology(sysfs)
        told: list[Topology] = []
        held: dict[str, CPUSet] = {}
        watch = TopologyWatch(sysfs, Seen(start.online, {}), start, lambda parents: dict(held), told.append)
        seen = watch.seen

        async def walk() -> None:
            nonlocal seen
            troubled = False
            for online, now_held in steps:
                held.clear()
                held.update(now_held)
                text = str(online) if isinstance(online, CPUSet) else {"garbage": "0-x", "empty": ""}[online]
                _online(sysfs, text)
                readable = isinstance(online, CPUSet) and bool(online)
                with said() as lines:
                    news = await watch.look()
                again = [line for line in lines if "readable again" in line]
                assert len(again) == (troubled and readable)  # said once the fault is over
                lines = [line for line in lines if line not in again]
                troubled = not readable
                if readable:
                    assert isinstance(online, CPUSet)
                    now = Seen(online, dict(now_held))
                    assert news == (now != seen) and watch.seen == now
                    if news:
                        assert told[-1] is watch.topology
                        went, came = seen.online - now.online, now.online - seen.online
                        assert sum("went offline (online now" in line for line in lines) == bool(went)
                        assert sum("came online (online now" in line for line in lines) == bool(came)
                        assert sum("not in the pod cgroups" in line for line in lines) == (
                            now.left_out() is not None and now.left_out() != seen.left_out()
                        )
                    else:
                        assert lines == []
                    seen = now
                else:
                    assert not news and watch.seen == seen
                topology, cut = watch.topology, start.only(seen.usable)
                assert topology.online == seen.usable
                assert topology.numa_nodes == cut.numa_nodes
                assert _sockets(topology) == _sockets(cut)
                assert (watch.problem is None) == (seen.online <= seen.usable)

        asyncio.run(walk())
