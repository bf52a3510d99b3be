"""scripts/soak: its time argument, a round that passes, and a round that fails stopping it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOAK = REPO / "scripts" / "soak"


def soak(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SOAK), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CRI_PROXY_TEST_JOBS": "0"},
        stdin=subprocess.DEVNULL,
    )


def test_a_time_that_is_not_whole_seconds_is_refused_by_name() -> None:
    result = soak("1h")
    assert result.returncode == 2
    assert "'1h'" in result.stderr


def test_a_round_runs_the_property_tests_on_a_seed_of_its_own() -> None:
    result = soak("1", "-k", "test_format_is_canonical_and_round_trips")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "== round 1, seed " in result.stdout
    assert "1 passed" in result.stdout
    assert "every round passed (1, over " in result.stdout


def test_a_failing_round_stops_it_with_its_seed_and_pytests_code() -> None:
    result = soak("600", "-k", "no_test_has_this_name")  # pytest: 5, nothing collected
    assert result.returncode == 5
    assert "round 1 failed (seed " in result.stderr
    assert "== round 2" not in result.stdout
