"""The raw-bytes forwarder: one generic handler that relays every method to the runtime.

Known unary methods get unary handlers (cheapest path through grpc.aio); known server-streaming
methods get unary-stream handlers; anything else, including methods a newer kubelet knows and
this build does not, is relayed stream-stream, which carries any call shape on the wire.
Status codes, details, initial and trailing metadata and deadlines pass through unchanged.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Callable, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeAlias

import grpc
import grpc.aio

from cri_proxy.relay.hookrun import CODES, Forward, HookRunner
from cri_proxy.relay.hooks import FailPolicy, Hooks, HookTable
from cri_proxy.relay.methods import KNOWN, MethodInfo, Shape

__all__ = ["UPSTREAM_SECONDS", "CallObserver", "FailPolicy", "Forwarder"]

if TYPE_CHECKING:  # grpc's classes are generic only in the stubs
    Context: TypeAlias = grpc.aio.ServicerContext[bytes, bytes]
    Handler: TypeAlias = grpc.RpcMethodHandler[bytes, bytes]
    GenericHandler: TypeAlias = grpc.GenericRpcHandler[bytes, bytes]
else:
    Context = grpc.aio.ServicerContext
    Handler = grpc.RpcMethodHandler
    GenericHandler = grpc.GenericRpcHandler
Metadata = Sequence[tuple[str, str | bytes]]

# Metadata the gRPC stack owns: never copied from one side of the relay to the other.
_RESERVED_KEYS = frozenset(
    {
        "user-agent",
        "content-type",
        "te",
        "grpc-timeout",
        "grpc-encoding",
        "grpc-accept-encoding",
        "grpc-status",
        "grpc-message",
    }
)
_MAX_UNKNOWN_HANDLERS = 256
_CONNECT_FAILURE_MARKERS = (
    "failed to connect",
    "Connection refused",
    "No such file or directory",
    "Socket closed",
    "Connection reset",
    "connections to all backends failing",
)


UPSTREAM_SECONDS: contextvars.ContextVar[float] = contextvars.ContextVar("upstream_seconds", default=0.0)
"""How long the runtime took for the current call (each call runs in its own task)."""


class CallObserver(Protocol):
    def observe(self, path: str, code: grpc.StatusCode, total: float, upstream: float) -> None: ...


def _measured(observer: CallObserver, path: str, behaviour: Any) -> Any:
    """Time a unary behaviour: total, and the runtime's part; count it by status code."""

    async def measured(request: bytes, context: Context) -> bytes:
        began = perf_counter()
        UPSTREAM_SECONDS.set(0.0)
        code = grpc.StatusCode.OK
        try:
            result: bytes = await behaviour(request, context)
            return result
        except BaseException:
            code = context.code() or grpc.StatusCode.UNKNOWN  # set by abort
            raise
        finally:
            observer.observe(path, code, perf_counter() - began, UPSTREAM_SECONDS.get())

    return measured


def _forwardable(metadata: Any) -> tuple[tuple[str, str | bytes], ...] | None:
    if not metadata:
        return None
    kept = tuple((k, v) for k, v in metadata if k not in _RESERVED_KEYS and not k.startswith(":"))
    return kept or None


class Forwarder(GenericHandler):
    """Answers every method path with a handler that relays it to `channel`."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        runtime_endpoint: str,
        hooks: HookTable | None = None,
        fail_policy: Callable[[], FailPolicy] = lambda: FailPolicy.IGNORE,
    ) -> None:
        self._channel = channel
        self._endpoint = runtime_endpoint
        self._hooks = hooks if hooks is not None else HookTable()
        self._fail_policy = fail_policy  # read per call: a reload may change it
        self.runner = HookRunner(fail_policy)  # the same runner the frame relay uses
        self.observer: CallObserver | None = None  # set before serving; read when handlers are made
        self._handlers: dict[str, Handler] = {}
        self._unknown = 0

    @property
    def fail_policy(self) -> FailPolicy:
        return self._fail_policy()

    # -- handler table ---------------------------------------------------------------------
    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Handler | None:
        path: str = handler_call_details.method
        handler = self._handlers.get(path)
        if handler is None:
            handler = self._make_handler(path)
            if path in KNOWN or self._unknown < _MAX_UNKNOWN_HANDLERS:
                self._unknown += path not in KNOWN
                self._handlers[path] = handler
        return handler

    def _make_handler(self, path: str) -> Handler:
        info = KNOWN.get(path)
        if info is not None and info.shape is Shape.UNARY:
            upstream_unary = self._channel.unary_unary(path, None, None)
            hooks = self._hooks.get(path)
            if hooks is None:
                behaviour = self._plain_unary(upstream_unary)
            else:
                behaviour = self._hooked_unary(upstream_unary, info, hooks)
            if self.observer is not None:
                behaviour = _measured(self.observer, path, behaviour)
            return grpc.unary_unary_rpc_method_handler(behaviour)
        if info is not None and info.shape is Shape.SERVER_STREAM:
            upstream_stream = self._channel.unary_stream(path, None, None)
            return grpc.unary_stream_rpc_method_handler(self._server_stream(upstream_stream))
        one_in = self._channel.unary_stream(path, None, None)
        many_in = self._channel.stream_stream(path, None, None)
        return grpc.stream_stream_rpc_method_handler(self._any_stream(one_in, many_in))

    # -- behaviours ------------------------------------------------------------------------
    def _plain_unary(self, upstream: Any) -> Any:
        relay = self._relay_unary

        async def behaviour(request: bytes, context: Context) -> bytes:
            return await relay(upstream, request, context)

        return behaviour

    async def _relay_unary(self, upstream: Any, request: bytes, context: Context) -> bytes:
        call = upstream(
            request,
            metadata=_forwardable(context.invocation_metadata()),
            timeout=context.time_remaining(),
        )
        began = perf_counter()
        try:
            response: bytes = await call
        except grpc.aio.AioRpcError as error:
            UPSTREAM_SECONDS.set(perf_counter() - began)
            await self._abort(context, error)
        UPSTREAM_SECONDS.set(perf_counter() - began)
        await _copy_metadata(call, context)
        return response

    def _hooked_unary(self, upstream: Any, info: MethodInfo, hooks: Hooks) -> Any:
        runner = self.runner

        async def behaviour(request: bytes, context: Context) -> bytes:
            try:
                outcome = await runner.pre(info, hooks, request)
            except Exception as exc:  # outside the hook's guard: the fail policy still says what follows
                outcome = runner.crashed(info, hooks, exc)
            if not isinstance(outcome, Forward):
                await context.abort(CODES[outcome.code], outcome.message)
            message = outcome.request
            if outcome.message is not None:
                request = outcome.message
            call = upstream(
                request,
                metadata=_forwardable(context.invocation_metadata()),
                timeout=context.time_remaining(),
            )
            began = perf_counter()
            try:
                response: bytes = await call
            except grpc.aio.AioRpcError as error:
                UPSTREAM_SECONDS.set(perf_counter() - began)
                if message is not None:
                    await runner.failed(info, hooks, message, error.code().value[0])
                await self._abort(context, error)
            except asyncio.CancelledError:  # the caller went away: roll back as for a failure
                if message is not None:
                    await runner.failed(info, hooks, message, grpc.StatusCode.CANCELLED.value[0])
                raise
            UPSTREAM_SECONDS.set(perf_counter() - began)
            if message is not None:
                await runner.post(info, hooks, message, response)
            await _copy_metadata(call, context)
            return response

        return behaviour

    def _server_stream(self, upstream: Any) -> Any:
        relay = self._relay_stream

        async def behaviour(request: bytes, context: Context) -> AsyncIterator[bytes]:
            call = upstream(
                request,
                metadata=_forwardable(context.invocation_metadata()),
                timeout=context.time_remaining(),
            )
            async for item in relay(call, context):
                yield item

        return behaviour

    def _any_stream(self, one_in: Any, many_in: Any) -> Any:
        """Relay a method of unknown shape.

        A caller that sent one message and half-closed made a unary or server-streaming call (every
        CRI method so far): it goes upstream as unary-stream, which sends message and close in one
        batch. Relaying it stream-stream instead races a runtime that answers before reading (Go's
        UNIMPLEMENTED) and can turn its status into INTERNAL.
        """
        relay = self._relay_stream

        async def behaviour(requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[bytes]:
            single, replay = await _peek_single(requests)
            metadata = _forwardable(context.invocation_metadata())
            if single is not None:
                call = one_in(single, metadata=metadata, timeout=context.time_remaining())
            else:
                call = many_in(replay, metadata=metadata, timeout=context.time_remaining())
            async for item in relay(call, context):
                yield item

        return behaviour

    async def _relay_stream(self, call: Any, context: Context) -> AsyncIterator[bytes]:
        try:
            sent_initial = False
            async for item in call:
                if not sent_initial:
                    sent_initial = True
                    await _copy_initial(call, context)
                yield item
            await _copy_metadata(call, context, initial=not sent_initial)
        except grpc.aio.AioRpcError as error:
            await self._abort(context, error)
        finally:
            call.cancel()  # a no-op when finished; stops the upstream call when our caller went away

    # -- errors ----------------------------------------------------------------------------
    async def _abort(self, context: Context, error: grpc.aio.AioRpcError) -> NoReturn:
        """Hand the runtime's status back unchanged; name the runtime when it could not be reached."""
        code = error.code()
        details = error.details() or ""
        if code is grpc.StatusCode.UNAVAILABLE and any(m in details for m in _CONNECT_FAILURE_MARKERS):
            details = f"cri-proxy: runtime {self._endpoint} is not reachable: {details}"
        initial = _forwardable(error.initial_metadata())
        if initial:
            await context.send_initial_metadata(initial)
        await context.abort(code, details, _forwardable(error.trailing_metadata()) or ())


_PEEK_SECONDS = 0.05


async def _peek_single(requests: AsyncIterator[bytes]) -> tuple[bytes | None, AsyncIterator[bytes]]:
    """(the only request, _) when the caller sent exactly one and half-closed; else (None, replay).

    A unary caller's half-close arrives with its message, so the wait is only ever felt by an
    interactive streaming caller of a method this build does not know.
    """
    it = aiter(requests)
    try:
        first = await anext(it)
    except StopAsyncIteration:
        return None, _replay((), it, None)
    following = asyncio.ensure_future(anext(it))
    done, _ = await asyncio.wait({following}, timeout=_PEEK_SECONDS)
    if done and isinstance(following.exception(), StopAsyncIteration):
        return first, _replay((), it, None)
    return None, _replay((first,), it, following)


async def _replay(
    head: tuple[bytes, ...], rest: AsyncIterator[bytes], pending: asyncio.Future[bytes] | None
) -> AsyncIterator[bytes]:
    for item in head:
        yield item
    if pending is not None:
        try:
            yield await pending
        except StopAsyncIteration:
            return
    async for item in rest:
        yield item


async def _copy_initial(call: Any, context: Context) -> None:
    initial = _forwardable(await call.initial_metadata())
    if initial:
        await context.send_initial_metadata(initial)


async def _copy_metadata(call: Any, context: Context, initial: bool = True) -> None:
    if initial:
        await _copy_initial(call, context)
    trailing = _forwardable(await call.trailing_metadata())
    if trailing:
        context.set_trailing_metadata(trailing)
