"""A kubelet state file that is not a small regular file never freezes or bloats the proxy.

Each case runs the real `cri-proxy serve`; every CRI call made meanwhile carries a 1 s deadline, so
a proxy stuck on the file fails the test with DEADLINE_EXCEEDED instead of passing slowly.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cri_api.v1 import api_pb2 as v1
from cri_proxy.client import CriClient
from cri_proxy.files import read_small
from cri_proxy.sources.kubelet_file import MAX_BYTES
from tests.unit.test_daemon import Daemon

GOOD = {"policyName": "static", "defaultCpuSet": "0-11", "entries": {"uid-g": {"main": "12-13"}}}
GOOD_POOLS = {"ls": "0-11,14-15", "be": "0-11,14-15"}  # kubelet's pinned 12-13 kept out
NO_FILE_POOLS = {"ls": "0-15", "be": "0-15"}
CONFIG = "kubelet_poll_seconds = 0.05\n"


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    os.symlink("/dev/zero", path)


def _huge(path: Path) -> None:
    with path.open("wb") as f:  # sparse: 8 GiB on paper, nothing on disk
        f.truncate(8 << 30)


def _just_over_the_cap(path: Path) -> None:
    path.write_bytes(b" " * (MAX_BYTES + 1))


def _directory(path: Path) -> None:
    path.mkdir()


BAD: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (_fifo, "is a FIFO, not a regular file"),
    "symlink-to-dev-zero": (_dev_zero, "is a character device, not a regular file"),
    "huge": (_huge, f"is {8 << 30} bytes, more than the {MAX_BYTES} read"),
    "one-byte-over": (_just_over_the_cap, f"more than the {MAX_BYTES} read"),
    "directory": (_directory, "is a directory, not a regular file"),
}


def _answers_within_a_second(sock: Path) -> None:
    with CriClient(f"unix://{sock}") as client:
        assert client.runtime.Version(v1.VersionRequest(), timeout=1.0).runtime_name


def _kubelet_problems(daemon: Daemon) -> list[str]:
    problems = daemon.plan()["problems"]
    assert isinstance(problems, list)
    return [p["message"] for p in problems if p["kind"] == "bad-kubelet-state"]


def _wait_answering(daemon: Daemon, what: str, predicate: Callable[[], bool], timeout: float = 20) -> None:
    """Until `predicate`, with a CRI call on a 1 s deadline between every look."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _answers_within_a_second(daemon.sock)
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_file_at_start_up_is_a_problem_and_the_proxy_serves(tmp_path: Path, kind: str) -> None:
    make, message = BAD[kind]
    make(tmp_path / "cpu_manager_state")
    daemon = Daemon(tmp_path, CONFIG)  # returns once the socket answers: start-up did not freeze
    try:
        _wait_answering(daemon, "the problem", lambda: any(message in m for m in _kubelet_problems(daemon)))
        assert daemon.plan()["pools"] == NO_FILE_POOLS
    finally:
        assert daemon.stop() == 0


@pytest.mark.parametrize("kind", ["fifo", "symlink-to-dev-zero", "huge", "one-byte-over"])
def test_bad_file_replacing_a_good_one_keeps_the_last_good_contents(tmp_path: Path, kind: str) -> None:
    make, message = BAD[kind]
    path = tmp_path / "cpu_manager_state"
    path.write_text(json.dumps(GOOD))
    daemon = Daemon(tmp_path, CONFIG)
    try:
        _wait_answering(daemon, "the good file", lambda: daemon.plan()["pools"] == GOOD_POOLS)
        make(tmp_path / "next")
        os.rename(tmp_path / "next", path)  # as kubelet replaces it: one rename, never absent
        _wait_answering(daemon, "the problem", lambda: any(message in m for m in _kubelet_problems(daemon)))
        assert all("(last good contents kept)" in m for m in _kubelet_problems(daemon))
        assert daemon.plan()["pools"] == GOOD_POOLS
        until = time.monotonic() + 1.0  # twenty polls of the same bad file: still one report
        while time.monotonic() < until:
            _answers_within_a_second(daemon.sock)
        assert daemon.logs().count(message) == 1, daemon.logs()
        path.unlink()
        path.write_text(json.dumps({**GOOD, "entries": {}}))  # fixed: read again
        _wait_answering(daemon, "the fixed file", lambda: daemon.plan()["pools"] == NO_FILE_POOLS)
        assert _kubelet_problems(daemon) == []
    finally:
        assert daemon.stop() == 0


def test_the_read_refuses_what_is_not_a_small_regular_file(tmp_path: Path) -> None:
    for kind, (make, message) in BAD.items():
        make(tmp_path / kind)
        with pytest.raises(ValueError, match=message.split(",")[0]):
            read_small(tmp_path / kind, MAX_BYTES)
    (tmp_path / "ok").write_bytes(b"x" * MAX_BYTES)
    assert len(read_small(tmp_path / "ok", MAX_BYTES)) == MAX_BYTES
