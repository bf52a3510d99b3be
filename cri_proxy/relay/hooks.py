"""The hook table: CRI method name -> optional pre/post hooks on decoded messages.

One table serves every API version: a hook registered for `CreateContainer` runs for
`runtime.v1` and `runtime.v1alpha2` alike, receiving that version's message classes (they have
the same fields). Methods without hooks are never decoded.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
from google.protobuf.message import Message

from cri_proxy.errors import CriProxyError
from cri_proxy.relay.methods import KNOWN, SERVICES, MethodInfo, Shape

PreHook = Callable[[Message, MethodInfo], Awaitable[Message]]
"""Gets the decoded request; returns the request to forward (the same object, changed or not)."""

PostHook = Callable[[Message, Message, MethodInfo], Awaitable[None]]
"""Gets the request as forwarded and the runtime's response; observes, never changes the reply."""

FailedHook = Callable[[Message, grpc.StatusCode, MethodInfo], Awaitable[None]]
"""Gets the request as forwarded when the runtime refused it (e.g. to roll back accounting)."""


class HookError(CriProxyError):
    """Raised by a hook to refuse a call on purpose, with the status the caller should see."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class FailPolicy(enum.Enum):
    """What a hook's own failure does to the call (Koordinator's Ignore/Fail)."""

    IGNORE = "ignore"  # forward the request unchanged and report
    FAIL = "fail"  # refuse the call with INTERNAL / INVALID_ARGUMENT


@dataclass(frozen=True, slots=True)
class Hooks:
    pre: PreHook | None = None
    post: PostHook | None = None
    failed: FailedHook | None = None
    fail_policy: FailPolicy | None = None  # this method's own; None: the configured default


class HookTable:
    """Method path -> Hooks. Only unary methods take hooks: streams are relayed untouched."""

    def __init__(self) -> None:
        self._by_path: dict[str, Hooks] = {}

    def register(
        self,
        name: str,
        *,
        pre: PreHook | None = None,
        post: PostHook | None = None,
        failed: FailedHook | None = None,
        service: str = "RuntimeService",
        fail_policy: FailPolicy | None = None,
    ) -> None:
        """Hook `service/name` in every API version this build knows."""
        if service not in SERVICES:
            raise ValueError(f"unknown CRI service {service!r}")
        paths = [info.path for info in KNOWN.values() if info.service == service and info.name == name]
        if not paths:
            raise ValueError(f"unknown CRI method {service}/{name}")
        for path in paths:
            if KNOWN[path].shape is not Shape.UNARY:
                raise ValueError(f"{service}/{name} is streaming; only unary methods take hooks")
            self._by_path[path] = Hooks(pre=pre, post=post, failed=failed, fail_policy=fail_policy)

    def get(self, path: str) -> Hooks | None:
        return self._by_path.get(path)

    def __len__(self) -> int:
        return len(self._by_path)
