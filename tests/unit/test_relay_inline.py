"""inline.start: a coroutine that never waits ends in the caller's turn; one that waits goes on in a
task, and a cancel of that task reaches the coroutine (its clean-up runs) even before its first step.
The cases (`inline_cases`) run here and under every other Python 3.11+ this machine has."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.unit.inline_cases import CASES

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("case", CASES, ids=[case.__name__ for case in CASES])
def test_a_case(case: Callable[[], None]) -> None:
    case()


def _version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except OSError:
        return None
    if out.returncode != 0:  # a pyenv shim of a version not selected, a broken install
        return None
    major, minor = out.stdout.split()
    return int(major), int(minor)


def other_pythons() -> list[str]:
    """One interpreter of each Python 3.11+ version found (PATH, then pyenv's versions), but the
    version running the tests."""
    names = [f"python3.{minor}" for minor in range(11, 20)]
    found = [path for name in names if (path := shutil.which(name))]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if pyenv.is_dir():
        found += [str(p) for p in sorted(pyenv.glob("3.*/bin/python3"))]
    seen = {sys.version_info[:2]}
    pythons: list[str] = []
    for python in found:
        version = _version(python)
        if version is not None and version >= (3, 11) and version not in seen:
            seen.add(version)
            pythons.append(python)
    return pythons


OTHERS = other_pythons()


@pytest.mark.skipif(not OTHERS, reason="no other Python 3.11+ on this machine")
@pytest.mark.parametrize("python", OTHERS or [""])
def test_every_case_under_another_python(python: str) -> None:
    out = subprocess.run(
        [python, "-m", "tests.unit.inline_cases"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, f"{python}:\n{out.stdout}{out.stderr}"
    assert "inline cases passed" in out.stdout
