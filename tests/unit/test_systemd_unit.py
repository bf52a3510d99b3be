"""The systemd unit and the kubelet drop-in: the settings that matter, and `systemd-analyze verify`.

`systemd-analyze` ships with systemd, which this project's machines (developers' and CI's) have;
without it the verification is skipped, except under CI (CI=true), where a skip would silently
drop a check the issue asks for, so it fails and says what to install instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cri_proxy.config import DEFAULT_CONFIG_FILE, DEFAULT_LISTEN, Config

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "cri-proxy.service"
DROPIN = ROOT / "systemd" / "kubelet.service.d" / "10-cri-proxy.conf"
CLI = Path(sys.executable).parent / "cri-proxy"


def parse_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Sections -> (key, value) in order; keys may repeat, as systemd allows."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"{path}: {raw!r} outside a section"
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not a key=value line: {raw!r}"
        current.append((key.strip(), value.strip()))
    return sections


def values(section: list[tuple[str, str]], key: str) -> list[str]:
    """Every value of `key`, space-separated lists split, as systemd reads dependency lists."""
    return [word for k, v in section if k == key for word in v.split()]


def one(section: list[tuple[str, str]], key: str) -> str:
    found = [v for k, v in section if k == key]
    assert len(found) == 1, f"{key}: expected exactly one setting, got {found}"
    return found[0]


def test_service_type_lifecycle_and_ordering() -> None:
    unit = parse_unit(UNIT)
    u, s, i = unit["Unit"], unit["Service"], unit["Install"]
    assert one(s, "Type") == "notify"
    assert one(s, "NotifyAccess") == "main"
    assert one(s, "WatchdogSec") == "30s"
    assert one(s, "ExecStart") == f"/usr/local/bin/cri-proxy serve --config {DEFAULT_CONFIG_FILE}"
    assert one(s, "ExecReload") == "/bin/kill -HUP $MAINPID"
    assert one(s, "Restart") == "always"
    assert one(s, "RestartSec") == "1"
    assert "containerd.service" in values(u, "After")
    assert "containerd.service" in values(u, "Requires") + values(u, "BindsTo")
    assert "kubelet.service" in values(u, "Before")
    assert "kubelet.service" not in values(u, "After")
    assert "multi-user.target" in values(i, "WantedBy")


def test_directories_match_the_config_defaults() -> None:
    """The unit creates the socket's and the state's directories where the defaults put them."""
    s = parse_unit(UNIT)["Service"]
    assert Path(DEFAULT_LISTEN.removeprefix("unix://")).parent == Path("/run") / one(s, "RuntimeDirectory")
    assert Path(Config().state_dir) == Path("/var/lib") / one(s, "StateDirectory")


def test_hardening_keeps_what_the_proxy_needs() -> None:
    s = parse_unit(UNIT)["Service"]
    assert one(s, "ProtectSystem") == "strict"
    assert one(s, "NoNewPrivileges") == "yes"
    assert one(s, "PrivateTmp") == "yes"
    assert one(s, "ProtectHome") in ("yes", "read-only", "tmpfs")
    families = set(values(s, "RestrictAddressFamilies"))
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= families  # kubelet/runtime sockets; metrics
    # Nothing hides the runtime's socket, the kubelet's state or sysfs.
    hidden = " ".join(values(s, "InaccessiblePaths") + values(s, "TemporaryFileSystem"))
    for path in ("/run/containerd", "/var/lib/kubelet", "/sys"):
        assert path not in hidden
    caps = values(s, "CapabilityBoundingSet")
    if caps:
        assert "CAP_CHOWN" in caps  # socket_group


def test_kubelet_dropin_points_at_the_proxy_socket() -> None:
    unit = parse_unit(DROPIN)
    assert "cri-proxy.service" in values(unit["Unit"], "After")
    assert "cri-proxy.service" in values(unit["Unit"], "Requires")
    env = " ".join(v for k, v in unit["Service"] if k == "Environment")
    match = re.fullmatch(r'"KUBELET_EXTRA_ARGS=(.*)"', env)
    assert match, env
    args = match.group(1).split()
    assert f"--container-runtime-endpoint={DEFAULT_LISTEN}" in args
    assert f"--image-service-endpoint={DEFAULT_LISTEN}" in args


def _systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("systemd-analyze is missing on CI: install systemd (apt-get install systemd)")
        pytest.skip("systemd-analyze not installed (part of systemd)")
    return path


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    """Verify the unit, and the kubelet with the drop-in, in a directory of their own.

    ExecStart must name an existing binary, so the copy runs this venv's `cri-proxy`; containerd and
    the kubelet are stubs there, so the result does not depend on what the machine has installed.
    """
    analyze = _systemd_analyze()
    text = UNIT.read_text()
    assert "ExecStart=/usr/local/bin/cri-proxy " in text
    (tmp_path / "cri-proxy.service").write_text(
        text.replace("ExecStart=/usr/local/bin/cri-proxy ", f"ExecStart={CLI} ")
    )
    for stub in ("containerd.service", "kubelet.service"):
        (tmp_path / stub).write_text(f"[Unit]\nDescription=stub {stub}\n[Service]\nExecStart=/bin/true\n")
    (tmp_path / "kubelet.service.d").mkdir()
    shutil.copy(DROPIN, tmp_path / "kubelet.service.d" / DROPIN.name)

    result = subprocess.run(
        [analyze, "verify", "--man=no", tmp_path / "cri-proxy.service", tmp_path / "kubelet.service"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "info", "SYSTEMD_LOG_COLOR": "0"},
    )
    # Unknown keys and bad values are only warnings (exit 0): any line about our units fails too.
    ours = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if str(tmp_path) in line or "cri-proxy" in line
    ]
    assert result.returncode == 0, result.stdout + result.stderr
    assert ours == []


def test_systemd_analyze_verify_catches_a_bad_key(tmp_path: Path) -> None:
    """The check above would see a typo: systemd-analyze reports it for our unit."""
    analyze = _systemd_analyze()
    bad = UNIT.read_text().replace("ExecStart=/usr/local/bin/cri-proxy ", f"ExecStart={CLI} ")
    (tmp_path / "cri-proxy.service").write_text(bad.replace("WatchdogSec=", "WatchdogSek="))
    (tmp_path / "containerd.service").write_text("[Service]\nExecStart=/bin/true\n")
    result = subprocess.run(
        [analyze, "verify", "--man=no", tmp_path / "cri-proxy.service"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "WatchdogSek" in result.stdout + result.stderr
