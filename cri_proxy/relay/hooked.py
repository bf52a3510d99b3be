"""Hooked streams: a request's DATA held until END_STREAM, the pre hook, the request re-encoded and
sent within the runtime's windows, refusals, and the post/failed hooks once the runtime answered."""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError
from loguru import logger

from cri_proxy.relay import frames as h2
from cri_proxy.relay.forward import FailPolicy
from cri_proxy.relay.hooks import HookError
from cri_proxy.relay.linkstate import (
    _CODES,
    _INTERNAL,
    _INVALID_ARGUMENT,
    _OK,
    _PASS,
    _RESOURCE_EXHAUSTED,
    _SKIP,
    Buf,
    _Hooked,
    _LinkState,
    _status,
    _Stream,
)


class _HookedStreams(_LinkState):
    """A Link's hooked-stream handling (called from the frame parsing in framelink.py)."""

    if TYPE_CHECKING:  # the frame relay's (framelink.py)

        def _inject_c2r(self, chunk: Buf, flow: int = 0) -> None: ...

        def _inject_r2c(self, chunk: Buf) -> None: ...

    def _client_data(self, sid: int, flags: int, buf: Buf, start: int, end: int) -> int:
        st = self.streams.get(sid)
        if st is None or st.hook is None or st.hook.releasing:
            return _PASS
        hook = st.hook
        flow = end - start
        hook.received += flow
        if flow:
            self.credit[0] = self.credit.get(0, 0) + flow
            if not flags & h2.END_STREAM:
                self.credit[sid] = self.credit.get(sid, 0) + flow
        if hook.received > self.relay.message_limit + 1024:  # never hold more than a message may be
            hook.releasing = True
            limit = self.relay.message_limit
            self._refuse(st, _RESOURCE_EXHAUSTED, f"cri-proxy: request larger than max (> {limit})")
            return _SKIP
        payload = buf[start:end]
        if flags & h2.PADDED:
            payload = h2.unpad(flags, bytes(payload))
        if payload:
            hook.held.append(payload)
        if flags & h2.END_STREAM:
            hook.releasing = True
            hook.task = self._spawn(self._run_pre(st))
        return _SKIP

    def _reset(self, sid: int) -> _Stream | None:
        """A stream reset by either side: forget it, and stop its hook (hooked streams only)."""
        st = self.streams.pop(sid, None)
        if st is not None and st.hook is not None:
            if st.hook.task is not None and not st.hook.finished:
                st.hook.task.cancel()
            self._settle(st.hook)
        return st

    # -- hooks ----------------------------------------------------------------------------------
    async def _run_pre(self, st: _Stream) -> None:
        """Decode the held request, run the pre hook, then send the (re-encoded) request on."""
        hook = st.hook
        assert hook is not None
        info, policy = hook.info, self.relay.fail_policy
        body = b"".join(hook.held)
        hook.held = []
        framed = h2.single_grpc_message(body)
        if framed is not None and len(framed[1]) > self.relay.message_limit:
            limit = self.relay.message_limit
            return self._refuse(
                st, _RESOURCE_EXHAUSTED, f"cri-proxy: request larger than max ({len(framed[1])} vs. {limit})"
            )
        if framed is None or framed[0]:
            logger.warning("{}: request is not one uncompressed message; forwarded without hooks", info.path)
            return self._release(st, body)
        try:
            message = info.request_type.FromString(framed[1])
        except DecodeError as exc:
            logger.warning("{}: request does not decode ({}); forwarded without hooks", info.path, exc)
            if policy is FailPolicy.FAIL:
                return self._refuse(
                    st, _INVALID_ARGUMENT, f"cri-proxy: {info.name} request does not decode: {exc}"
                )
            return self._release(st, body)
        if hook.hooks.pre is not None:
            work = type(message)()
            work.CopyFrom(message)
            try:
                changed = await hook.hooks.pre(work, info)
            except HookError as exc:
                return self._refuse(st, exc.code.value[0], exc.message)
            except Exception as exc:  # a hook bug must never take the call down with it
                logger.opt(exception=exc).error("{}: pre hook failed: {}", info.path, exc)
                if policy is FailPolicy.FAIL:
                    return self._refuse(st, _INTERNAL, f"cri-proxy: {info.name} hook failed: {exc}")
                changed = None
            if changed is not None:
                message = changed
                body = h2.grpc_message(changed.SerializeToString())
        hook.request = message
        self._release(st, body)

    def _release(self, st: _Stream, body: bytes) -> None:
        hook = st.hook
        if hook is None:
            return
        if self.streams.get(st.id) is not st or self.runtime is None:
            self._settle(hook)  # cancelled, or ended by the runtime, meanwhile: nothing to send
            if hook.request is not None and hook.hooks.failed is not None:
                # the pre hook did its work for a call that will never run: let it roll back
                self._spawn(
                    _run_observer(hook.hooks.failed, hook.request, grpc.StatusCode.CANCELLED, hook.info)
                )
            return
        hook.out, hook.out_at, hook.sending = body, 0, True
        if st.measured:
            st.sent_at = perf_counter()
        self._pump(st)

    def _pump(self, st: _Stream) -> None:
        """Send what the stream's window allows, in frames the runtime accepts."""
        hook = st.hook
        assert hook is not None
        while hook.sending and not hook.finished:
            left = len(hook.out) - hook.out_at
            size = min(left, hook.window, self.max_frame)
            if size <= 0 and left > 0:
                return  # wait for the runtime's WINDOW_UPDATE on this stream
            piece = hook.out[hook.out_at : hook.out_at + size]
            hook.out_at += size
            hook.window -= size
            hook.sent += size
            self.withheld += size
            last = hook.out_at >= len(hook.out)
            self._inject_c2r(h2.frame(h2.DATA, h2.END_STREAM if last else 0, st.id, piece), size)
            if last:
                hook.finished = True
                hook.out = b""
                self._settle(hook)

    def _settle(self, hook: _Hooked) -> None:
        """The stream sends nothing more to the runtime (sent, refused, cancelled or ended)."""
        hook.finished = True
        hook.held = []
        hook.out = b""

    def _give_credit(self) -> None:
        """Send the client the WINDOW_UPDATEs owed for request bytes we hold."""
        credit, self.credit = self.credit, {}
        self._inject_r2c(b"".join(h2.window_update(sid, n) for sid, n in credit.items() if n > 0))

    def _refuse(self, st: _Stream, code: int, message: str) -> None:
        """Answer the call ourselves and cancel it at the runtime (which has its headers only)."""
        if self.streams.get(st.id) is not st:
            if st.hook is not None:
                self._settle(st.hook)
            return
        del self.streams[st.id]
        self._measure(st, code, upstream=False)
        self._inject_r2c(h2.status_frames(st.id, code, message, not st.responded, h2.DEFAULT_MAX_FRAME_SIZE))
        self._inject_c2r(h2.rst_stream(st.id, h2.CANCEL))
        if st.hook is not None:
            self._settle(st.hook)

    def _measure(self, st: _Stream, code: int, upstream: bool) -> None:
        """Count and time a finished unary call (metrics), as the grpc relay does."""
        if not st.measured or self.observer is None:
            return
        now = perf_counter()
        status = _CODES.get(code, grpc.StatusCode.UNKNOWN)
        self.observer.observe(st.measured, status, now - st.began, now - st.sent_at if upstream else 0.0)

    def _observe(self, st: _Stream, headers: list[tuple[bytes, bytes]] | None) -> None:
        """The runtime ended a hooked call: hand its answer to the post or failed hook."""
        hook = st.hook
        if hook is None or hook.request is None or headers is None:
            return
        code = _status(headers)
        info = hook.info
        if code == _OK and hook.hooks.post is not None:
            framed = h2.single_grpc_message(bytes(hook.response))
            if framed is None or framed[0]:
                logger.warning("{}: response is not one uncompressed message; no post hook", info.path)
                return
            try:
                response = info.response_type.FromString(framed[1])
            except DecodeError as exc:
                logger.warning("{}: cannot decode the runtime's response for post hook: {}", info.path, exc)
                return
            self._spawn(_run_observer(hook.hooks.post, hook.request, response, info))
        elif code != _OK and hook.hooks.failed is not None:
            status = _CODES.get(code, grpc.StatusCode.UNKNOWN)
            self._spawn(_run_observer(hook.hooks.failed, hook.request, status, info))


async def _run_observer(hook: Any, *args: Any) -> None:
    """Run a post/failed hook; its failure is logged, never shown to the caller."""
    try:
        await hook(*args)
    except Exception as exc:
        logger.opt(exception=exc).error("post hook failed: {}", exc)
