"""The hook runner both relay modes share: decode, run the hook, apply the fail policy, count.

The relays hand it message bytes and get back data: what to send (`Forward`) or how to answer
the caller instead (`Refuse`). Post and failed hooks observe; their failures are logged, never
shown to the caller. Every hook run is timed and counted here, and nowhere else.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from time import perf_counter

import grpc
from google.protobuf.message import DecodeError, Message
from loguru import logger

from cri_proxy.cancels import cancelled_from_outside, why
from cri_proxy.relay.hooks import FailPolicy, HookError, Hooks, Ready
from cri_proxy.relay.methods import MethodInfo

CODES: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


@dataclass(frozen=True, slots=True)
class Forward:
    """Send the request on: `message` instead of the caller's bytes (None: unchanged)."""

    message: bytes | None
    request: Message | None  # the request as forwarded, for the post/failed hooks (None: not decoded)


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer the caller with this status; the request never reaches the runtime."""

    code: int
    message: str


PreOutcome = Forward | Refuse


class HookRunner:
    """Runs hooks under a fail policy (read per call: a reload may change it) and counts them."""

    def __init__(self, fail_policy: Callable[[], FailPolicy]) -> None:
        self.fail_policy = fail_policy
        self.runs: Counter[tuple[str, str, str]] = Counter()  # (method, hook, outcome) -> count
        self.seconds: dict[tuple[str, str], float] = {}  # (method, hook) -> total time

    def _count(self, info: MethodInfo, hook: str, outcome: str, began: float) -> None:
        self.runs[(info.name, hook, outcome)] += 1
        key = (info.name, hook)
        self.seconds[key] = self.seconds.get(key, 0.0) + perf_counter() - began

    def _policy(self, hooks: Hooks | None) -> FailPolicy:
        """The method's own fail policy, else the configured default."""
        if hooks is not None and hooks.fail_policy is not None:
            return hooks.fail_policy
        return self.fail_policy()

    def as_is(self, hooks: Hooks) -> bool:
        """Whether a request whose method has hooks only after the call goes on as it came, not
        decoded on its path but when the call ended, for them (`_sent`): unless the fail policy
        refuses a request that does not decode before it goes, as `pre` does."""
        return hooks.pre is None and hooks.ready is None and self._policy(hooks) is not FailPolicy.FAIL

    def unreadable(self, info: MethodInfo, why: str, hooks: Hooks | None = None) -> PreOutcome:
        """A request the relay cannot unpack (not one message, unknown compression)."""
        logger.warning("{}: {}; forwarded without hooks", info.path, why)
        self.runs[(info.name, "pre", "unreadable")] += 1
        if self._policy(hooks) is FailPolicy.FAIL:
            return Refuse(grpc.StatusCode.INVALID_ARGUMENT.value[0], f"cri-proxy: {info.name}: {why}")
        return Forward(None, None)

    def _undecodable(self, info: MethodInfo, exc: DecodeError, began: float) -> None:
        """A request that does not decode, on either path to the runtime: counted and logged."""
        self._count(info, "pre", "undecodable", began)
        logger.warning("{}: request does not decode ({}); forwarded without hooks", info.path, exc)

    async def pre(self, info: MethodInfo, hooks: Hooks, raw: bytes) -> PreOutcome:
        """Decode the request, run the pre hook on it, say what to send."""
        began = perf_counter()
        try:
            message = info.request_type.FromString(raw)
        except DecodeError as exc:
            self._undecodable(info, exc, began)
            if self._policy(hooks) is FailPolicy.FAIL:
                code = grpc.StatusCode.INVALID_ARGUMENT.value[0]
                return Refuse(code, f"cri-proxy: {info.name} request does not decode: {exc}")
            return Forward(None, None)
        if hooks.pre is None:
            return Forward(None, message)
        try:
            changed = await hooks.pre(message, info)  # it may change `message` in place
        except HookError as exc:
            self._count(info, "pre", "refused", began)
            return Refuse(exc.code.value[0], exc.message)
        except (Exception, asyncio.CancelledError) as exc:  # a hook bug must never take the call down
            if isinstance(exc, asyncio.CancelledError) and cancelled_from_outside():
                raise  # the call itself ended: the relay rolls back
            self._count(info, "pre", "error", began)
            logger.opt(exception=exc).error("{}: pre hook failed: {}", info.path, why(exc))
            if self._policy(hooks) is FailPolicy.FAIL:
                code = grpc.StatusCode.INTERNAL.value[0]
                return Refuse(code, f"cri-proxy: {info.name} hook failed: {why(exc)}")
            # forwarded as it came: the later hooks see that, not what the failed hook left half-changed
            return Forward(None, info.request_type.FromString(raw))
        self._count(info, "pre", "ok", began)
        if changed is None:  # outside the hook's contract: what it may have changed in place is sent
            changed = message
        return Forward(changed.SerializeToString(), changed)

    def crashed(self, info: MethodInfo, hooks: Hooks, exc: BaseException) -> PreOutcome:
        """The pre hook's run ended in an exception outside its own guard (the runner, or the task
        that runs it): counted and logged like a failed hook, and the call ended by the fail
        policy (the request goes on as it came, unseen by the hooks after it, or is refused)."""
        self.runs[(info.name, "pre", "error")] += 1
        logger.opt(exception=exc).error("{}: pre hook could not run: {}", info.path, exc)
        if self._policy(hooks) is FailPolicy.FAIL:
            code = grpc.StatusCode.INTERNAL.value[0]
            return Refuse(code, f"cri-proxy: {info.name} hook could not run: {exc}")
        return Forward(None, None)

    def readied(self, info: MethodInfo, ready: Ready, raw: bytes) -> Message | None:
        """A request that went on with what its hooks had ready (`Hooks.ready`), as `raw`: decoded
        now for `ready.after` and returned for the hooks after the call; counted as the pre hook's
        run, outcome "ready". One that does not decode went on as the `ignore` fail policy sends
        such a request: counted and logged as the pre hook's path does; None, no hook sees it."""
        began = perf_counter()
        try:
            message = info.request_type.FromString(raw)
        except DecodeError as exc:
            self._undecodable(info, exc, began)
            return None
        try:
            ready.after(message)
        except Exception as exc:  # a hook bug: logged; the call went on
            self._count(info, "pre", "error", began)
            logger.opt(exception=exc).error("{}: pre hook failed (request sent): {}", info.path, exc)
            return message
        self._count(info, "pre", "ready", began)
        return message

    def _sent(self, info: MethodInfo, request: Message | bytes) -> Message | None:
        """The request as forwarded, for the hooks after its call: decoded now when it went as it
        came (`as_is`), or is a ready request's bytes that `readied` has not decoded; None when
        those do not decode (counted and logged, as on the pre hook's path)."""
        if not isinstance(request, bytes):
            return request
        began = perf_counter()
        try:
            return info.request_type.FromString(request)
        except DecodeError as exc:
            self._undecodable(info, exc, began)
            return None

    async def post(self, info: MethodInfo, hooks: Hooks, request: Message | bytes, raw: bytes) -> None:
        """The runtime answered OK: hand its decoded response to the post hook (and the request,
        decoded now when it went on ready, as bytes)."""
        if hooks.post is None:
            return
        began = perf_counter()
        sent = self._sent(info, request)
        if sent is None:
            return
        try:
            response = info.response_type.FromString(raw)
        except DecodeError as exc:
            self._count(info, "post", "undecodable", began)
            logger.warning("{}: cannot decode the runtime's response for post hook: {}", info.path, exc)
            return
        await self._settle(info, "post", began, hooks.post(sent, response, info))

    async def failed(self, info: MethodInfo, hooks: Hooks, request: Message | bytes, code: int) -> None:
        """The call did not succeed (refused, cancelled, runtime lost): let the hooks roll back."""
        if hooks.failed is None:
            return
        began = perf_counter()
        sent = self._sent(info, request)
        if sent is None:
            return
        status = CODES.get(code, grpc.StatusCode.UNKNOWN)
        await self._settle(info, "failed", began, hooks.failed(sent, status, info))

    async def _settle(self, info: MethodInfo, stage: str, began: float, run: Awaitable[None]) -> None:
        """Run a hook that comes after the call (nothing left to refuse): count it; log a failure."""
        try:
            await run
        except (Exception, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError) and cancelled_from_outside():
                raise
            self._count(info, stage, "error", began)
            logger.opt(exception=exc).error("{}: {} hook failed: {}", info.path, stage, why(exc))
            return
        self._count(info, stage, "ok", began)
