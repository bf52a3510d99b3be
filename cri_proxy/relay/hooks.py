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


@dataclass(frozen=True, slots=True)
class Ready:
    """A pre hook's answer known without running it, so the request goes on from the read that
    ended it, with no round trip to the hook: `patch` is appended to the request (a partial message
    of its type, which the receiver merges over the request's own fields, as protobuf merges a
    message field that comes twice); `after` gets the request as sent, decoded once it went on.

    The request is not decoded before it goes: one that then does not decode is counted and logged
    as under the `ignore` fail policy, and no hook sees it (`after` neither). A ready hook therefore
    answers None where the fail policy is `fail`: the pre hook's path refuses such a request."""

    patch: bytes
    after: Callable[[Message], None]


ReadyHook = Callable[[bytes, MethodInfo], "Ready | None"]
"""Gets the request's bytes (one whole message, not compressed); None: the pre hook runs."""


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
    ready: ReadyHook | None = None
    # the post hook runs before the call's answer is written, not after (frames mode; grpc mode
    # always does): for a call the runtime takes long over, whose caller's next call would meet
    # the hook's work; a hook that waits does not hold the answer
    post_first: bool = False


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
        ready: ReadyHook | None = None,
        post_first: bool = False,
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
            self._by_path[path] = Hooks(
                pre=pre, post=post, failed=failed, fail_policy=fail_policy, ready=ready, post_first=post_first
            )

    def get(self, path: str) -> Hooks | None:
        return self._by_path.get(path)

    def __len__(self) -> int:
        return len(self._by_path)
