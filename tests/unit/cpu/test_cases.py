"""The shared decision cases (shared/cases/README.md), from the shared folder and from tests/cases.

Both locations are read and deduplicated by file name (the shared copy wins), so the suite runs
where `../shared` is absent and still picks up new shared cases where it is present.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cri_proxy.cpu import decide, load_snapshot, plan_to_json

REPO = Path(__file__).resolve().parents[3]
LOCATIONS = (REPO.parent / "shared" / "cases", REPO / "tests" / "cases")


def _case_files() -> list[Path]:
    found: dict[str, Path] = {}
    for folder in LOCATIONS:
        if folder.is_dir():
            for path in sorted(folder.glob("*.json")):
                found.setdefault(path.name, path)
    return [found[name] for name in sorted(found)]


CASES = _case_files()


def test_cases_are_found() -> None:
    assert len(CASES) >= 18
    assert (REPO / "tests" / "cases" / "01-plain-burstable-and-besteffort.json").is_file()


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case(path: Path) -> None:
    case: dict[str, Any] = json.loads(path.read_text())
    out = plan_to_json(decide(load_snapshot(json.dumps(case["snapshot"]))))
    expect = case["expect"]
    assert out["pools"] == expect["pools"]
    for cid, want in expect["containers"].items():
        got = out["containers"][cid]
        assert (got["qos"], got["cpuset_cpus"]) == (want["qos"], want["cpuset_cpus"]), cid
    assert {p["kind"] for p in out["problems"]} == set(expect["problem_kinds"])
    # every container of the snapshot has exactly one decision
    ids = {c["id"] for p in case["snapshot"].get("pods", []) for c in p.get("containers", [])}
    assert set(out["containers"]) == ids
