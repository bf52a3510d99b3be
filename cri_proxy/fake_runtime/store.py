"""The fake runtime's records: plain data, no gRPC, so tests can look inside directly."""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from dataclasses import dataclass, field
from typing import Any


def _new_id() -> str:
    return secrets.token_hex(32)


def now_ns() -> int:
    return time.time_ns()


@dataclass
class Sandbox:
    id: str
    config: Any  # PodSandboxConfig of the version that created it
    created_at: int
    ready: bool = True


@dataclass
class Container:
    id: str
    sandbox_id: str
    config: Any  # ContainerConfig
    created_at: int
    resources: Any  # LinuxContainerResources, as last applied
    state: str = "CREATED"  # CREATED RUNNING EXITED
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0
    updates: list[Any] = field(default_factory=list)  # every UpdateContainerResources' linux part


@dataclass(frozen=True)
class Event:
    container_id: str
    sandbox_id: str
    kind: str  # CONTAINER_CREATED_EVENT ...
    at: int


class Store:
    """Pods, containers, images and event subscribers of one fake runtime."""

    def __init__(self) -> None:
        self.sandboxes: dict[str, Sandbox] = {}
        self.containers: dict[str, Container] = {}
        self.images: dict[str, int] = {
            "localhost/busybox:latest": 1_200_000,
            "localhost/pause:latest": 700_000,
        }
        self.subscribers: set[asyncio.Queue[Event]] = set()
        self._ids = itertools.count()

    def new_id(self) -> str:
        return _new_id()

    def resolve(self, table: dict[str, Any], prefix: str) -> Any | None:
        """Exact id, or a unique prefix of one (as containerd accepts)."""
        found = table.get(prefix)
        if found is not None or not prefix:
            return found
        matches = [v for k, v in table.items() if k.startswith(prefix)]
        return matches[0] if len(matches) == 1 else None

    def publish(self, container: Container, kind: str) -> None:
        event = Event(container.id, container.sandbox_id, kind, now_ns())
        for queue in list(self.subscribers):
            if queue.qsize() < 10_000:  # a stalled watcher must not grow memory without bound
                queue.put_nowait(event)
