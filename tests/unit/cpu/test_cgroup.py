"""Kubernetes QoS from the cgroup parent: cgroupfs and systemd, with and without a cgroup root."""

from __future__ import annotations

import pytest

from cri_proxy.cpu import CgroupParent, KubeQoS, parse_cgroup_parent

G, BU, BE = KubeQoS.GUARANTEED, KubeQoS.BURSTABLE, KubeQoS.BESTEFFORT

CASES: dict[str, tuple[str, CgroupParent | None]] = {
    "cgroupfs guaranteed": ("/kubepods/pod1234", CgroupParent(G, "1234")),
    "cgroupfs burstable": ("/kubepods/burstable/pod1234", CgroupParent(BU, "1234")),
    "cgroupfs besteffort": ("/kubepods/besteffort/pod12-34", CgroupParent(BE, "12-34")),
    "cgroupfs trailing slash": ("/kubepods/burstable/pod1/", CgroupParent(BU, "1")),
    "cgroupfs no leading slash": ("kubepods/pod1", CgroupParent(G, "1")),
    "cgroupfs root prefix": ("/custom/root/kubepods/besteffort/poda", CgroupParent(BE, "a")),
    "cgroupfs root prefix guaranteed": ("/custom/kubepods/poda", CgroupParent(G, "a")),
    "systemd guaranteed": ("/kubepods.slice/kubepods-pod12_34.slice", CgroupParent(G, "12-34")),
    "systemd burstable": (
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda_b.slice",
        CgroupParent(BU, "a-b"),
    ),
    "systemd besteffort": (
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podb.slice",
        CgroupParent(BE, "b"),
    ),
    "systemd slice name only": ("kubepods-burstable-podx.slice", CgroupParent(BU, "x")),
    "systemd root prefix": (
        "/custom.slice/custom-kubepods.slice/custom-kubepods-besteffort.slice/"
        "custom-kubepods-besteffort-podz.slice",
        CgroupParent(BE, "z"),
    ),
    "empty": ("", None),
    "root": ("/", None),
    "system slice": ("/system.slice/containerd.service", None),
    "kubepods only": ("/kubepods", None),
    "qos tier without pod": ("/kubepods/burstable", None),
    "pod without uid": ("/kubepods/pod", None),
    "unknown tier": ("/kubepods/gold/pod1", None),
    "tier not under kubepods": ("/other/burstable/pod1", None),
    "pod not under kubepods": ("/other/pod1", None),
    "systemd unknown slice": ("/kubepods.slice/kubepods-gold-pod1.slice", None),
    "systemd tier slice": ("/kubepods.slice/kubepods-burstable.slice", None),
}


@pytest.mark.parametrize(("path", "expect"), CASES.values(), ids=CASES.keys())
def test_parse_cgroup_parent(path: str, expect: CgroupParent | None) -> None:
    assert parse_cgroup_parent(path) == expect
