"""The checkpoint file: every field survives, writes are atomic, and every bad file is a CheckpointError."""

from __future__ import annotations

import base64
import errno
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cri_api.v1 import api_pb2 as v1
from cri_proxy.errors import CheckpointError
from cri_proxy.state import checkpoint
from cri_proxy.state.model import ContainerRecord, ContainerState, NodeState, PodRecord

RESOURCES = v1.LinuxContainerResources(
    cpu_period=100_000,
    cpu_quota=50_000,
    cpu_shares=512,
    memory_limit_in_bytes=64 << 20,
    oom_score_adj=-997,
    cpuset_cpus="0-1",
    cpuset_mems="0",
    hugepage_limits=[v1.HugepageLimit(page_size="2MB", limit=1 << 21)],
    unified={"memory.high": "max"},
    memory_swap_limit_in_bytes=128 << 20,
).SerializeToString()

PODS = [
    PodRecord(
        sandbox_id="s1",
        uid="u-1",
        name="web",
        namespace="prod",
        cgroup_parent="/kubepods/burstable/podu-1",
        labels={"koordinator.sh/qosClass": "LSR", "app": "wéb"},
        annotations={"scheduling.koordinator.sh/resource-status": '{"cpuset":"0-1"}'},
    ),
    PodRecord(
        sandbox_id="s2",
        uid="u-2",
        name="old",
        namespace="default",
        cgroup_parent="",
        ready=False,
        api_version="v1alpha2",
    ),
]
CONTAINERS = [
    ContainerRecord("c1", "s1", "app", RESOURCES, ContainerState.RUNNING, "0-1", 3, pin="1"),
    ContainerRecord("c2", "s1", "sidecar", b"", ContainerState.CREATED, "", 0, "v1alpha2"),
    ContainerRecord("pending-1", "s1", "init", RESOURCES, ContainerState.PENDING, None),
    ContainerRecord("c3", "s2", "done", b"", ContainerState.EXITED, None, 7),
]


def _state(pods: list[PodRecord] = PODS, containers: list[ContainerRecord] = CONTAINERS) -> NodeState:
    state = NodeState()
    state.replace_all(pods, containers)
    return state


def _doc() -> dict[str, Any]:
    return json.loads(checkpoint.dumps(PODS, CONTAINERS, 1.5))  # type: ignore[no-any-return]


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    state = _state()
    assert checkpoint.save(path, state, now=lambda: 1234.5) == state.generation
    assert checkpoint.load(path) == (PODS, CONTAINERS)
    doc = json.loads(path.read_text())
    assert (doc["version"], doc["written_at"]) == (1, 1234.5)
    assert base64.b64decode(doc["containers"][0]["resources"]) == RESOURCES
    loaded = checkpoint.load(path)
    assert loaded is not None
    assert loaded[1][0].linux_resources().unified["memory.high"] == "max"


def test_every_record_field_is_written() -> None:
    doc = _doc()
    assert set(doc["pods"][0]) == set(PodRecord.__dataclass_fields__)
    assert set(doc["containers"][0]) == set(ContainerRecord.__dataclass_fields__)


def test_empty_state_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    assert checkpoint.load(path) is None
    checkpoint.save(path, NodeState())
    assert checkpoint.load(path) == ([], [])


def test_save_creates_the_directory_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "var" / "lib" / "cri-proxy" / "checkpoint.json"
    checkpoint.save(path, _state())
    checkpoint.save(path, _state(PODS[:1], CONTAINERS[:1]))
    assert checkpoint.load(path) == (PODS[:1], CONTAINERS[:1])
    assert os.listdir(path.parent) == ["checkpoint.json"]  # no temp file left behind


def test_crash_before_replace_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint.save(path, _state())
    # What a crash between writing the temp file and the rename leaves: temp files, maybe torn.
    (tmp_path / ".checkpoint.json.abc123.tmp").write_text('{"version": 1, "pods": [{"sandbo')
    (tmp_path / ".checkpoint.json.def456.tmp").write_bytes(b"\0" * 100)
    assert checkpoint.load(path) == (PODS, CONTAINERS)
    checkpoint.save(path, _state(PODS[1:], []))  # the next save is not disturbed by them
    assert checkpoint.load(path) == (PODS[1:], [])


def test_failure_at_replace_keeps_old_file_and_removes_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint.save(path, _state())

    def crash(src: str, dst: str) -> None:
        raise KeyboardInterrupt  # not an OSError: propagates unchanged, but still cleans up

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(path, _state([], []))
    monkeypatch.undo()
    assert checkpoint.load(path) == (PODS, CONTAINERS)
    assert os.listdir(tmp_path) == ["checkpoint.json"]


def test_disk_full_is_a_checkpoint_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint.save(path, _state())

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CheckpointError) as err:
        checkpoint.save(path, _state([], []))
    assert str(path) in str(err.value) and "No space left on device" in str(err.value)
    monkeypatch.undo()
    assert checkpoint.load(path) == (PODS, CONTAINERS)
    assert os.listdir(tmp_path) == ["checkpoint.json"]


@pytest.mark.parametrize(
    "where",
    ["parent-is-a-file", "target-is-a-directory", "under-proc"],
)
def test_unwritable_location_is_a_checkpoint_error(tmp_path: Path, where: str) -> None:
    # Root ignores permission bits, so use places that fail for root too.
    if where == "parent-is-a-file":
        (tmp_path / "plain").write_text("")
        path = tmp_path / "plain" / "checkpoint.json"
    elif where == "target-is-a-directory":
        path = tmp_path / "checkpoint.json"
        path.mkdir()
    else:
        path = Path("/proc/self/cri-proxy-checkpoint.json")
    with pytest.raises(CheckpointError) as err:
        checkpoint.save(path, _state())
    assert str(path) in str(err.value)
    assert str(err.value).startswith("cannot write checkpoint")


def test_unreadable_location_is_a_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        checkpoint.load(tmp_path)  # a directory
    (tmp_path / "plain").write_text("")
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        checkpoint.load(tmp_path / "plain" / "checkpoint.json")


def _set(path: str, value: object) -> Any:
    """The valid document with one value replaced; `path` is dotted, list indexes as numbers."""
    doc = _doc()
    *parents, last = path.split(".")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: int | str = int(last) if isinstance(node, list) else last
    if value is _DELETE:
        del node[key]
    else:
        node[key] = value
    return doc


_DELETE = object()
_VALID = checkpoint.dumps(PODS, CONTAINERS, 1.5).encode()

BAD: dict[str, tuple[bytes | Any, str]] = {
    "empty": (b"", "empty file"),
    "whitespace": (b" \n", "empty file"),
    "truncated": (_VALID[: len(_VALID) // 2], "not JSON"),
    "garbage": (b"\x00\xff\xfe garbage", "not JSON"),
    "not-utf8": (b'{"version": 1, "pods": ["\xff"]}', "not JSON"),
    "deep": (b"[" * 100_000, "not JSON"),
    "list": ([], "top level is list"),
    "null": (None, "top level is NoneType"),
    "no-version": (_set("version", _DELETE), "version None"),
    "version-2": (_set("version", 2), "version 2"),
    "version-text": (_set("version", "1"), "version '1'"),
    "version-true": (_set("version", True), "version True"),
    "version-float": (_set("version", 1.0), "version 1.0"),
    "pods-missing": (_set("pods", _DELETE), "pods is missing"),
    "pods-object": (_set("pods", {}), "pods is dict"),
    "containers-null": (_set("containers", None), "containers is null"),
    "pod-not-object": (_set("pods.0", "s1"), "pods[0] is str"),
    "pod-no-uid": (_set("pods.1.uid", _DELETE), "pods[1].uid is missing"),
    "pod-uid-int": (_set("pods.0.uid", 7), "pods[0].uid is int"),
    "pod-labels-list": (_set("pods.0.labels", []), "pods[0].labels is list"),
    "pod-label-int": (_set("pods.0.labels.app", 1), "pods[0].labels has a value"),
    "pod-ready-text": (_set("pods.0.ready", "yes"), "pods[0].ready is str"),
    "pod-ready-int": (_set("pods.0.ready", 1), "pods[0].ready is int"),
    "ctr-not-object": (_set("containers.1", []), "containers[1] is list"),
    "ctr-resources-not-b64": (_set("containers.0.resources", "%%%"), "containers[0].resources"),
    "ctr-resources-bad-proto": (
        _set("containers.0.resources", base64.b64encode(b"\xff\xff").decode()),
        "containers[0].resources is not base64 of LinuxContainerResources",
    ),
    "ctr-resources-int": (_set("containers.0.resources", 5), "containers[0].resources is int"),
    "ctr-state-unknown": (_set("containers.0.state", "sleeping"), "'sleeping' is not a container state"),
    "ctr-state-missing": (_set("containers.0.state", _DELETE), "containers[0].state is missing"),
    "ctr-applied-int": (_set("containers.0.applied", 3), "containers[0].applied is int"),
    "ctr-applied-missing": (_set("containers.0.applied", _DELETE), "containers[0].applied is missing"),
    "ctr-attempt-text": (_set("containers.0.attempt", "1"), "containers[0].attempt is str"),
    "ctr-attempt-bool": (_set("containers.0.attempt", True), "containers[0].attempt is bool"),
    "ctr-attempt-float": (_set("containers.0.attempt", 1.0), "containers[0].attempt is float"),
    "ctr-id-null": (_set("containers.2.id", None), "containers[2].id is null"),
    "ctr-pin-int": (_set("containers.0.pin", 1), "containers[0].pin is int, not str or null"),
    "ctr-pin-not-cpuset": (_set("containers.0.pin", "1-x"), "containers[0].pin '1-x' is not a cpuset"),
    "ctr-pin-empty": (_set("containers.0.pin", ""), "containers[0].pin is empty"),
}


@pytest.mark.parametrize("content,expected", BAD.values(), ids=BAD.keys())
def test_bad_file_is_a_checkpoint_error_naming_path_and_fault(
    tmp_path: Path, content: bytes | Any, expected: str
) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(path)
    message = str(err.value)
    assert message.startswith(f"bad checkpoint {path}: "), message
    assert expected in message, message


def test_unknown_keys_are_ignored(tmp_path: Path) -> None:
    doc = _set("pods.0.future_field", {"x": 1})
    doc["future_top"] = True
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps(doc))
    assert checkpoint.load(path) == (PODS, CONTAINERS)


def test_a_checkpoint_from_before_pins_loads_without_them(tmp_path: Path) -> None:
    """Checkpoints written before operator pins were kept have no `pin` key: no pin, no error."""
    doc = _doc()
    for c in doc["containers"]:
        del c["pin"]
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps(doc))
    loaded = checkpoint.load(path)
    assert loaded is not None
    assert [c.pin for c in loaded[1]] == [None] * len(CONTAINERS)
    assert loaded[1][0] == replace(CONTAINERS[0], pin=None)


def test_a_pin_is_written_canonical_and_null_without_one() -> None:
    doc = _doc()
    assert [c["pin"] for c in doc["containers"]] == ["1", None, None, None]


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["put", "change", "drop"]),
            st.integers(0, 5),  # which container
            st.sampled_from(["0", "0-1", "2-3", ""]),
        ),
        max_size=30,
    )
)
def test_the_kept_encoder_writes_what_a_fresh_one_writes(steps: list[tuple[str, int, str]]) -> None:
    """The keeper's encoder re-encodes only the records that changed since its last document: after
    any changes, its document is a fresh encoder's, and loads back to the very records."""
    encoder = checkpoint.Encoder()
    containers: dict[str, ContainerRecord] = {}
    for n, (what, which, cpus) in enumerate(steps):
        cid = f"c{which}"
        if what == "put" or (what == "change" and cid not in containers):
            containers[cid] = ContainerRecord(
                cid, "s1", f"app{which}", RESOURCES, ContainerState.RUNNING, cpus, n
            )
        elif what == "change":
            containers[cid] = replace(containers[cid], applied=cpus, attempt=n)
        else:
            containers.pop(cid, None)
        kept = encoder.dumps(PODS, list(containers.values()), float(n))
        assert kept == checkpoint.Encoder().dumps(PODS, list(containers.values()), float(n))
        pods, loaded = checkpoint.loads(kept)
        assert pods == PODS and loaded == list(containers.values())
