"""scripts/install.sh in a scratch root (`--prefix`): what it installs, re-runs, and removes.

Installing cri-proxy and its dependencies into a fresh venv takes a while (pip), so the whole
module shares ONE install (`installed`); the tests run in file order and the uninstall tests come
last. Every later run finds the package up to date and only checks and rewrites the small files.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from cri_proxy import __version__, config

# One worker under pytest-xdist: one install, and the tests in file order.
pytestmark = pytest.mark.xdist_group("install")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install.sh"


def run(
    *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )
    if check:
        assert result.returncode == 0, f"install.sh {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


class Root:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.venv = path / "opt" / "cri-proxy"
        self.launcher = path / "usr" / "local" / "bin" / "cri-proxy"
        self.unit = path / "etc" / "systemd" / "system" / "cri-proxy.service"
        self.config = path / "etc" / "cri-proxy" / "config.toml"
        self.doc = path / "usr" / "share" / "doc" / "cri-proxy"
        self.kubelet_dropins = path / "etc" / "systemd" / "system" / "kubelet.service.d"

    def installed_files(self) -> dict[Path, bytes]:
        files = [self.unit, self.config, *sorted(self.doc.iterdir())]
        return {f: f.read_bytes() for f in files}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Root, str]]:
    root = Root(tmp_path_factory.mktemp("root"))
    result = run("--prefix", str(root.path))
    yield root, result.stdout
    shutil.rmtree(root.path, ignore_errors=True)


def test_files_are_in_place(installed: tuple[Root, str]) -> None:
    root, out = installed
    assert (root.venv / "pyvenv.cfg").is_file()
    assert (root.venv / "bin" / "cri-proxy").is_file()
    assert root.launcher.is_symlink()
    assert root.launcher.resolve() == (root.venv / "bin" / "cri-proxy").resolve()
    assert root.unit.read_text() == (REPO / "systemd" / "cri-proxy.service").read_text()
    dropin = REPO / "systemd" / "kubelet.service.d" / "10-cri-proxy.conf"
    assert (root.doc / "10-cri-proxy.conf").read_text() == dropin.read_text()
    assert (root.doc / "configuration.md").read_text() == (REPO / "docs" / "configuration.md").read_text()
    assert root.config.read_text() == (root.doc / "config.toml.example").read_text()
    assert (root.doc / "rbac.yaml").read_text() == (REPO / "systemd" / "rbac.yaml").read_text()
    # The operator opts in: nothing lands in the kubelet's own drop-in directory.
    assert not root.kubelet_dropins.exists()
    # Not an editable install, and nothing left in the checkout by the build.
    site = next(root.venv.glob("lib/python3*/site-packages"))
    assert (site / "cri_proxy" / "config.py").is_file()
    assert not list(site.glob("__editable__*")) and not list(site.glob("*.egg-link"))
    assert not (REPO / "build").exists()
    assert "installed" in out and "systemctl" not in out  # a scratch root: no systemctl


def test_installed_launcher_runs(installed: tuple[Root, str]) -> None:
    root, _ = installed
    version = subprocess.run(
        [str(root.launcher), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert version.stdout.strip() == f"cri-proxy {__version__}"
    plan = subprocess.run(
        [str(root.launcher), "plan", "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    assert "--snapshot" in plan.stdout
    # It runs the venv's copy of the code, not this checkout's.
    where = subprocess.run(
        [str(root.venv / "bin" / "python"), "-c", "import cri_proxy; print(cri_proxy.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=root.path,
    )
    assert Path(where.stdout.strip()).is_relative_to(root.venv)


def test_default_config_lists_every_key_commented_at_its_default(
    installed: tuple[Root, str], tmp_path: Path
) -> None:
    root, _ = installed
    text = root.config.read_text()
    assert tomllib.loads(text) == {}, "every key must be commented out"
    # Uncommented, the file is valid and sets every key to its default.
    uncommented = re.sub(r"(?m)^#(?=\[[a-z_]+\]$|[a-z_]+ = )", "", text)
    data = tomllib.loads(uncommented)
    keys = {k for k, v in data.items() if not isinstance(v, dict)}
    keys |= {f"{t}.{k}" for t, v in data.items() if isinstance(v, dict) for k in v}
    tables = getattr(config, "TABLES", {})
    expected = set()
    for name in config.Config.__dataclass_fields__:
        table = next((t for t, p in tables.items() if name.startswith(p)), None)
        expected.add(f"{table}.{name.removeprefix(tables[table])}" if table else name)
    assert keys == expected
    path = tmp_path / "config.toml"
    path.write_text(uncommented)
    assert config.load(path) == config.Config()
    assert "reload" in text and "/usr/share/doc/cri-proxy/configuration.md" in text


def test_second_run_changes_nothing_and_keeps_the_config(installed: tuple[Root, str]) -> None:
    """Run again, this time through DESTDIR: same root, nothing to do, the operator's edit kept."""
    root, _ = installed
    original = root.config.read_text()
    root.config.write_text(original + '\nlog_level = "DEBUG"\n')
    try:
        before = root.installed_files()
        venv_stamp = (root.venv / "pyvenv.cfg").stat().st_mtime_ns
        result = run(env={"DESTDIR": str(root.path)})
        assert "up to date" in result.stdout
        assert "pip install" not in result.stdout
        assert f"kept        {root.config}" in result.stdout
        assert root.installed_files() == before
        assert (root.venv / "pyvenv.cfg").stat().st_mtime_ns == venv_stamp
        assert root.launcher.resolve() == (root.venv / "bin" / "cri-proxy").resolve()
    finally:
        root.config.write_text(original)


def test_a_changed_unit_is_updated(installed: tuple[Root, str]) -> None:
    root, _ = installed
    good = root.unit.read_text()
    root.unit.write_text(good.replace("RestartSec=1", "RestartSec=9"))
    result = run("--prefix", str(root.path))
    assert f"updated     {root.unit}" in result.stdout
    assert root.unit.read_text() == good


def test_runtime_unit_is_substituted_and_kept(installed: tuple[Root, str]) -> None:
    root, _ = installed
    run("--prefix", str(root.path), "--runtime-unit", "crio.service")
    text = root.unit.read_text()
    assert "\nRequires=crio.service\n" in text and "\nAfter=crio.service\n" in text
    assert "\nRequires=containerd.service\n" not in text
    run("--prefix", str(root.path))  # a plain re-run keeps the choice
    assert "\nRequires=crio.service\n" in root.unit.read_text()
    run("--prefix", str(root.path), "--runtime-unit", "containerd.service")
    assert root.unit.read_text() == (REPO / "systemd" / "cri-proxy.service").read_text()
    bad = run("--prefix", str(root.path), "--runtime-unit", "crio; rm -rf /", check=False)
    assert bad.returncode != 0 and "--runtime-unit" in bad.stderr


def test_refuses_to_replace_a_foreign_launcher(installed: tuple[Root, str]) -> None:
    root, _ = installed
    root.launcher.unlink()
    root.launcher.write_text("#!/bin/sh\necho someone else's\n")
    try:
        result = run("--prefix", str(root.path), check=False)
        assert result.returncode != 0
        assert "not our symlink" in result.stderr
        assert "someone else's" in root.launcher.read_text()
    finally:
        root.launcher.unlink()
    run("--prefix", str(root.path))
    assert root.launcher.is_symlink()


def test_bad_arguments_are_refused() -> None:
    result = run("--frobnicate", check=False)
    assert result.returncode != 0
    assert "unknown argument: --frobnicate" in result.stderr
    assert "usage:" in result.stderr
    assert "usage:" in run("--help").stdout


def test_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed")
    result = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout


# -- uninstall: keep these last, they remove the module's install -------------------------------


def test_uninstall_refuses_while_the_kubelet_uses_the_proxy(installed: tuple[Root, str]) -> None:
    root, _ = installed
    root.kubelet_dropins.mkdir(parents=True)
    shutil.copy(root.doc / "10-cri-proxy.conf", root.kubelet_dropins / "10-cri-proxy.conf")
    try:
        result = run("--prefix", str(root.path), "--uninstall", check=False)
        assert result.returncode != 0
        assert "the kubelet still uses the proxy" in result.stderr
        assert root.launcher.is_symlink() and root.unit.exists() and root.venv.exists()
    finally:
        shutil.rmtree(root.kubelet_dropins)


def test_uninstall_removes_what_it_installed_and_keeps_the_config(installed: tuple[Root, str]) -> None:
    root, _ = installed
    config_text = root.config.read_text()
    result = run("--prefix", str(root.path), "--uninstall")
    assert not root.launcher.exists() and not root.launcher.is_symlink()
    assert not root.unit.exists()
    assert not root.doc.exists()
    assert not root.venv.exists()
    assert root.config.read_text() == config_text
    assert "kept" in result.stdout and str(root.config) in result.stdout
    again = run("--prefix", str(root.path), "--uninstall")
    assert "nothing to remove" in again.stdout
