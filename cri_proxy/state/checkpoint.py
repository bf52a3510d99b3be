"""The node state on disk: a versioned JSON snapshot, replaced atomically.

`save` writes a temp file next to the target, fsyncs it, `os.replace`s it over the target and fsyncs
the directory, so a crash leaves either the old or the new checkpoint, never a torn one. `load`
returns the records, or None when there is no checkpoint; anything else wrong with the file raises
`CheckpointError` naming the path. No logging: the caller decides what to report.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias, TypeVar

from google.protobuf.message import DecodeError

from cri_api.v1 import api_pb2 as v1
from cri_proxy.cpu import CPUSet
from cri_proxy.errors import CheckpointError, CpuError
from cri_proxy.files import read_small
from cri_proxy.state.model import ContainerRecord, ContainerState, NodeState, PodRecord

VERSION = 1
MAX_BYTES = 256 * 1024 * 1024
"""256 MiB: a pod's record is at most ~256 KiB (the API server's cap on its annotations), a
container's well under 2 KiB: room for a thousand pods at that cap. A bigger file is not ours."""
PathLike: TypeAlias = str | os.PathLike[str]
Records: TypeAlias = tuple[list[PodRecord], list[ContainerRecord]]
T = TypeVar("T")
_MISSING = object()


def _pod_doc(p: PodRecord) -> dict[str, Any]:
    return {
        "sandbox_id": p.sandbox_id,
        "uid": p.uid,
        "name": p.name,
        "namespace": p.namespace,
        "cgroup_parent": p.cgroup_parent,
        "labels": dict(p.labels),
        "annotations": dict(p.annotations),
        "ready": p.ready,
        "api_version": p.api_version,
        "problems": list(p.problems),
    }


def _container_doc(c: ContainerRecord) -> dict[str, Any]:
    return {
        "id": c.id,
        "sandbox_id": c.sandbox_id,
        "name": c.name,
        "resources": base64.b64encode(c.resources).decode("ascii"),
        "state": c.state.value,
        "applied": c.applied,
        "attempt": c.attempt,
        "api_version": c.api_version,
        "actual_cpuset": c.actual_cpuset,
        "actual_source": c.actual_source,
        "actual_at": c.actual_at,
        "pin": c.pin,
    }


class Encoder:
    """Writes checkpoint documents, encoding only the records that changed since its last one.

    Records are immutable (a change is a new object), so a record's JSON text is kept while the
    state holds that very object. A node's thousands of unchanged records then cost a string join,
    not a re-encoding that holds the interpreter (and so the event loop) for tens of milliseconds.
    One record per line: the document stays valid JSON and readable.
    """

    def __init__(self) -> None:
        self._pods: dict[str, tuple[PodRecord, str]] = {}
        self._containers: dict[str, tuple[ContainerRecord, str]] = {}
        self._one = threading.Lock()  # a save at stop may overlap a cancelled one still in its thread

    def dumps(self, pods: list[PodRecord], containers: list[ContainerRecord], written_at: float) -> str:
        with self._one:
            pod_lines = _lines(self._pods, {p.sandbox_id: p for p in pods}, _pod_doc)
            container_lines = _lines(self._containers, {c.id: c for c in containers}, _container_doc)
        sep = ",\n"
        return (
            f'{{"version": {VERSION}, "written_at": {json.dumps(written_at)},\n'
            f'"pods": [\n{sep.join(pod_lines)}\n],\n'
            f'"containers": [\n{sep.join(container_lines)}\n]}}\n'
        )


def _lines(
    cache: dict[str, tuple[Any, str]], records: Mapping[str, Any], doc: Callable[[Any], Any]
) -> list[str]:
    """Each record's JSON text, from `cache` when the record is the one encoded before."""
    out = []
    for key, record in records.items():
        kept = cache.get(key)
        if kept is None or kept[0] is not record:
            kept = cache[key] = (record, json.dumps(doc(record), sort_keys=True))
        out.append(kept[1])
    for gone in cache.keys() - records.keys():
        del cache[gone]
    return out


def dumps(pods: list[PodRecord], containers: list[ContainerRecord], written_at: float) -> str:
    """The checkpoint document for these records."""
    return Encoder().dumps(pods, containers, written_at)


def save(
    path: PathLike, state: NodeState, now: Callable[[], float] = time.time, encoder: Encoder | None = None
) -> int:
    """Write the state's checkpoint atomically; returns the generation written.

    Creates the directory when missing. Raises `CheckpointError` (path and OS error) when it cannot
    be written; the previous checkpoint, if any, is then left as it was.
    """
    generation, pods, containers = state.snapshot()
    data = (encoder or Encoder()).dumps(pods, containers, now()).encode()
    target = os.path.abspath(os.fspath(path))
    directory, name = os.path.split(target)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as err:
        raise CheckpointError(f"cannot write checkpoint {target}: {err.strerror or err}") from err
    return generation


def load(path: PathLike) -> Records | None:
    """The checkpoint's (pods, containers); None when the file does not exist."""
    target = os.fspath(path)
    try:  # never blocking on a FIFO left in its place, never reading without bound
        raw = read_small(target, MAX_BYTES)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint {target}: {err.strerror or err}") from err
    except ValueError as err:
        raise CheckpointError(f"cannot read checkpoint: {err}") from None
    try:
        return loads(raw)
    except CheckpointError as err:
        raise CheckpointError(f"bad checkpoint {target}: {err}") from err


def loads(raw: bytes | str) -> Records:
    """Parse a checkpoint document; `CheckpointError` says what is wrong (without a path)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(f"not JSON ({err})" if raw.strip() else "empty file") from err
    if not isinstance(doc, dict):
        raise CheckpointError(f"top level is {type(doc).__name__}, not an object")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version != VERSION:
        raise CheckpointError(f"version {version!r}, this build reads version {VERSION}")
    pods = [_pod(item, f"pods[{i}]") for i, item in enumerate(_get(doc, "pods", list, ""))]
    containers = [
        _container(item, f"containers[{i}]") for i, item in enumerate(_get(doc, "containers", list, ""))
    ]
    return pods, containers


def _get(obj: Mapping[str, Any], key: str, kind: type[T], where: str) -> T:
    value = obj.get(key, _MISSING)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        name = f"{where}.{key}" if where else key
        raise CheckpointError(f"{name} is {_describe(value)}, not {kind.__name__}")
    return value


def _describe(value: object) -> str:
    return "missing" if value is _MISSING else "null" if value is None else type(value).__name__


def _str_map(obj: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    value = _get(obj, key, dict, where)
    if not all(isinstance(v, str) for v in value.values()):
        raise CheckpointError(f"{where}.{key} has a value that is not a string")
    return value


def _record(item: object, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise CheckpointError(f"{where} is {type(item).__name__}, not an object")
    return item


def _pod(item: object, where: str) -> PodRecord:
    obj = _record(item, where)
    return PodRecord(
        sandbox_id=_get(obj, "sandbox_id", str, where),
        uid=_get(obj, "uid", str, where),
        name=_get(obj, "name", str, where),
        namespace=_get(obj, "namespace", str, where),
        cgroup_parent=_get(obj, "cgroup_parent", str, where),
        labels=_str_map(obj, "labels", where),
        annotations=_str_map(obj, "annotations", where),
        ready=_get(obj, "ready", bool, where),
        api_version=_get(obj, "api_version", str, where),
        problems=tuple(_optional_strs(obj, "problems", where)),
    )


def _optional_strs(obj: Mapping[str, Any], key: str, where: str) -> list[str]:
    """A list of strings that checkpoints written before it existed lack (then empty)."""
    value = obj.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointError(f"{where}.{key} is not a list of strings")
    return value


def _actual(obj: Mapping[str, Any], where: str) -> tuple[str | None, str, float]:
    """The last reading of a container's real cpuset; absent in older checkpoints (unknown)."""
    cpuset = obj.get("actual_cpuset")
    source = obj.get("actual_source", "")
    at = obj.get("actual_at", 0.0)
    if cpuset is not None and not isinstance(cpuset, str):
        raise CheckpointError(f"{where}.actual_cpuset is {_describe(cpuset)}, not str or null")
    if not isinstance(source, str):
        raise CheckpointError(f"{where}.actual_source is {_describe(source)}, not str")
    if not isinstance(at, int | float) or isinstance(at, bool):
        raise CheckpointError(f"{where}.actual_at is {_describe(at)}, not a number")
    return cpuset, source, float(at)


def _pin(obj: Mapping[str, Any], where: str) -> str | None:
    """An operator's pin (a cpuset, canonical); absent in checkpoints written before pins were kept."""
    pin = obj.get("pin")
    if pin is None:
        return None
    if not isinstance(pin, str):
        raise CheckpointError(f"{where}.pin is {_describe(pin)}, not str or null")
    try:
        cpus = CPUSet.parse(pin)
    except CpuError as err:
        raise CheckpointError(f"{where}.pin {pin!r} is not a cpuset: {err}") from err
    if not cpus:
        raise CheckpointError(f"{where}.pin is empty, not a cpuset")
    return str(cpus)


def _container(item: object, where: str) -> ContainerRecord:
    obj = _record(item, where)
    try:
        resources = base64.b64decode(_get(obj, "resources", str, where), validate=True)
        v1.LinuxContainerResources.FromString(resources)
    except (binascii.Error, DecodeError) as err:
        raise CheckpointError(f"{where}.resources is not base64 of LinuxContainerResources") from err
    try:
        state = ContainerState(_get(obj, "state", str, where))
    except ValueError as err:
        raise CheckpointError(f"{where}.state {obj['state']!r} is not a container state") from err
    applied = obj.get("applied", _MISSING)
    if applied is not None and not isinstance(applied, str):  # also when missing
        raise CheckpointError(f"{where}.applied is {_describe(applied)}, not str or null")
    actual_cpuset, actual_source, actual_at = _actual(obj, where)
    pin = _pin(obj, where)
    return ContainerRecord(
        id=_get(obj, "id", str, where),
        sandbox_id=_get(obj, "sandbox_id", str, where),
        name=_get(obj, "name", str, where),
        resources=resources,
        state=state,
        applied=applied,
        attempt=_get(obj, "attempt", int, where),
        api_version=_get(obj, "api_version", str, where),
        actual_cpuset=actual_cpuset,
        actual_source=actual_source,
        actual_at=actual_at,
        pin=pin,
    )
