"""`cri-proxy plan` as a user runs it: the installed console script, in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = Path(sys.executable).parent / "cri-proxy"
if not SCRIPT.exists():
    SCRIPT = REPO / ".venv" / "bin" / "cri-proxy"
CASE = REPO / "tests" / "cases" / "07-kubelet-static-v2.json"


def _plan(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), "plan", *args], input=stdin, capture_output=True, text=True, timeout=30, check=False
    )


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(json.loads(CASE.read_text())["snapshot"]))
    return path


def test_json_output(snapshot: Path) -> None:
    r = _plan("--snapshot", str(snapshot))
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    assert out["pools"] == {"ls": "0,3-15", "be": "0,3-15"}
    assert out["containers"]["gs-app"] == {
        "pod": "default/gs",
        "qos": "KUBELET",
        "cpuset_cpus": "1-2",
        "why": "kubelet static CPU manager entry",
    }
    assert out["problems"] == []


def test_stdin(snapshot: Path) -> None:
    r = _plan("--snapshot", "-", "--format", "json", stdin=snapshot.read_text())
    assert r.returncode == 0 and json.loads(r.stdout)["containers"]["gs-sidecar"]["qos"] == "LS"


def test_output_flag_and_its_old_name(snapshot: Path) -> None:
    """`-o`/`--output` as every ctl command has it; `--format` (the old name) still works."""
    as_json = _plan("--snapshot", str(snapshot), "-o", "json")
    assert as_json.returncode == 0 and _plan("--snapshot", str(snapshot)).stdout == as_json.stdout
    assert (
        _plan("--snapshot", str(snapshot), "--output", "table").stdout
        == _plan("--snapshot", str(snapshot), "--format", "table").stdout
    )
    import yaml

    r = _plan("--snapshot", str(snapshot), "-o", "yaml")
    assert r.returncode == 0 and yaml.safe_load(r.stdout) == json.loads(as_json.stdout)
    assert "--format" not in _plan("--help").stdout  # hidden: -o is the one documented


def test_table_output(snapshot: Path) -> None:
    r = _plan("--snapshot", str(snapshot), "-o", "table")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["POD", "CONTAINER", "ID", "QOS", "CPUSET", "WHY"]
    assert any(line.split()[:5] == ["default/gs", "app", "gs-app", "KUBELET", "1-2"] for line in lines)
    assert "  ls  0,3-15" in lines and "  be  0,3-15" in lines
    assert "problems: none" in lines


def test_table_lists_problems(tmp_path: Path) -> None:
    case = json.loads((REPO / "tests" / "cases" / "13-pool-exhausted.json").read_text())
    path = tmp_path / "s.json"
    path.write_text(json.dumps(case["snapshot"]))
    r = _plan("--snapshot", str(path), "--format", "table")
    assert r.returncode == 0
    assert "  ls  (empty)" in r.stdout and "pool-exhausted  default/ls" in r.stdout
    row = next(line for line in r.stdout.splitlines() if line.startswith("default/ls "))
    assert row.split()[3:5] == ["LS", "-"]


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        '{"pods": []}',
        '{"topology": {"numa_nodes": {"0": "0-"}}}',
        '{"topology": {"numa_nodes": {}}, "pods": [{"name": "x"}]}',
    ],
    ids=["not json", "no topology", "bad cpu list", "pod missing keys"],
)
def test_malformed_snapshot_exits_2_with_one_line(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    r = _plan("--snapshot", str(path))
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and str(path) in r.stderr


def test_unreadable_file_exits_2(tmp_path: Path) -> None:
    r = _plan("--snapshot", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "missing.json" in r.stderr


def test_a_device_that_never_ends_is_read_only_up_to_the_cap(tmp_path: Path) -> None:
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    r = _plan("--snapshot", str(zero))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"cri-proxy plan: {zero}: cannot read: more than {256 * 1024 * 1024} bytes"


def test_bytes_that_are_not_utf8_exit_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"topology": "caf\xe9"}')
    r = _plan("--snapshot", str(path))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"cri-proxy plan: {path}: cannot read: 'utf-8' codec can't decode byte 0xe9 in position 17:"
        " invalid continuation byte"
    ]


def test_a_pipe_is_read_as_a_file_is(snapshot: Path) -> None:
    with snapshot.open("rb") as f:
        r = subprocess.run(
            ["bash", "-c", f'exec "{SCRIPT}" plan --snapshot <(cat)'],
            stdin=f,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == json.loads(_plan("--snapshot", str(snapshot)).stdout)


def test_snapshot_is_required() -> None:
    assert _plan().returncode == 2  # argparse usage error
