"""A Link's frame relay: the frames parsed both ways, the runtime's windows and the backlog of
client frames waiting for them, frames of our own injected between theirs, open calls ended."""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING

import grpc
import hpack
from loguru import logger

from cri_proxy.relay import frames as h2
from cri_proxy.relay.hooked import _HookedStreams, _run_observer
from cri_proxy.relay.linkstate import (
    _DONE,
    _PASS,
    _RESOURCE_EXHAUSTED,
    _SKIP,
    _UNAVAILABLE,
    Buf,
    _Hooked,
    _scan,
    _status,
    _Stream,
)
from cri_proxy.relay.methods import KNOWN, Shape


class _FrameLink(_HookedStreams):
    """A Link's frame relay, both ways (the connection's life is Link's, in fastpath.py)."""

    if TYPE_CHECKING:  # Link's (fastpath.py)

        def close(self) -> None: ...

    def _fatal(self, why: str) -> None:
        """A header block we cannot decode: the runtime cannot either; end the connection cleanly."""
        logger.error("frame relay: {}; closing the connection", why)
        if self.client is not None:
            self.client.write(h2.goaway(self.last_stream, h2.COMPRESSION_ERROR))
        self.close()

    # -- client -> runtime --------------------------------------------------------------------
    def _from_client(self, data: bytes) -> None:
        if self.c_buf:
            self.c_buf += data
            buf: Buf = self.c_buf
        else:
            buf = data
        size = len(buf)
        off = 0
        if self.preface_left:
            off = min(self.preface_left, size)
            self.preface_left -= off
        start = 0
        self.c_parsing = True
        while size - off >= h2.HEADER_LEN and not self.closed:
            length, ftype, flags, sid = h2.read_head(buf, off)
            end = off + h2.HEADER_LEN + length
            if end > size:
                break
            flow = 0
            if ftype == h2.DATA:
                flow = length
                action = self._client_data(sid, flags, buf, off + h2.HEADER_LEN, end)
            elif ftype == h2.HEADERS or ftype == h2.CONTINUATION:
                action = self._client_headers(ftype, flags, sid, buf, off + h2.HEADER_LEN, end)
            elif ftype == h2.RST_STREAM:
                action = self._client_reset(sid)
            elif ftype == h2.SETTINGS and not flags & h2.ACK:
                action = self._client_settings(buf[off + h2.HEADER_LEN : end])
            else:
                action = _PASS
            if action == _PASS and (self.backlog or flow > self.conn_window):
                action = _SKIP
                self._to_runtime(buf[start:off])
                self._queue(buf[off:end], flow)
            elif action == _PASS:
                self.conn_window -= flow
            else:
                self._to_runtime(buf[start:off])
            if action != _PASS:
                start = end
            off = end
            if not self.c_block.open and self.deferred_c2r:
                self._to_runtime(buf[start:off])
                start = off
                deferred, self.deferred_c2r = self.deferred_c2r, []
                for chunk, chunk_flow in deferred:
                    self._emit(chunk, chunk_flow)
        self._to_runtime(buf[start:off])
        self.c_parsing = False
        if not self.c_block.open and self.deferred_c2r:
            deferred, self.deferred_c2r = self.deferred_c2r, []
            for chunk, chunk_flow in deferred:
                self._emit(chunk, chunk_flow)
        if self.credit:
            self._give_credit()
        _keep_rest(self, "c_buf", buf, off)

    def _client_headers(self, ftype: int, flags: int, sid: int, buf: Buf, start: int, end: int) -> int:
        block = self.c_block
        if not block.feed(ftype, flags, sid, buf, start, end):
            return _PASS
        try:
            headers = block.decode()
        except hpack.HPACKError as exc:
            self._fatal(f"client header block does not decode: {exc}")
            return _SKIP
        sid = block.sid
        if sid in self.streams or sid <= self.last_stream:
            return _PASS  # trailers from the client, or a stream we no longer track
        path = ""
        if headers is not None:
            path = (h2.header_value(headers, b":path") or b"").decode("utf-8", "replace")
        self.last_stream = sid
        st = _Stream(sid)
        self.streams[sid] = st
        if headers is not None and not block.end:
            hooks = self.relay.hooks.get(path)
            info = KNOWN.get(path)
            if hooks is not None and info is not None:
                st.hook = _Hooked(info, hooks, self.initial_window)
            if self.observer is not None and info is not None and info.shape is Shape.UNARY:
                st.measured, st.began = path, perf_counter()
                st.sent_at = st.began
        return _PASS

    def _client_reset(self, sid: int) -> int:
        st = self._reset(sid)
        hook = None if st is None else st.hook
        if hook is not None and hook.request is not None and hook.hooks.failed is not None:
            # the caller cancelled a call already forwarded: roll back as for a failure
            self._spawn(_run_observer(hook.hooks.failed, hook.request, grpc.StatusCode.CANCELLED, hook.info))
        return _PASS

    def _client_settings(self, payload: Buf) -> int:
        for ident, value in h2.settings_pairs(bytes(payload)):
            if ident == h2.SETTINGS_HEADER_TABLE_SIZE and self.r_block.dec is not None:
                self.r_block.dec.max_allowed_table_size = value
        return _PASS

    def _to_runtime(self, chunk: Buf) -> None:
        """Client frames whose window was already counted (or that need none), in order."""
        if not chunk or self.runtime is None:
            return
        if self.backlog:
            self._queue(chunk, 0)
        else:
            self.runtime.write(chunk)

    def _emit(self, chunk: Buf, flow: int) -> None:
        """A frame for the runtime: now if the connection window allows and nothing waits, else queued."""
        if self.runtime is None:
            return
        if self.backlog or flow > self.conn_window:
            self._queue(chunk, flow)
        else:
            self.conn_window -= flow
            self.runtime.write(chunk)

    def _inject_c2r(self, chunk: Buf, flow: int = 0) -> None:
        """A frame of our own for the runtime; never inside the client's open header block."""
        if self.c_block.open or self.c_parsing:  # after the client frames read so far
            self.deferred_c2r.append((chunk, flow))
        else:
            self._emit(chunk, flow)

    def _queue(self, chunk: Buf, flow: int) -> None:
        """Hold a frame until the runtime's connection window has room (kept in order)."""
        self.backlog.append((chunk, flow))
        self.queued += flow
        self.queued_peak = max(self.queued_peak, self.queued)

    def _drain(self) -> None:
        out: list[Buf] = []
        while self.backlog and self.backlog[0][1] <= self.conn_window:
            chunk, flow = self.backlog.popleft()
            self.conn_window -= flow
            self.queued -= flow
            out.append(chunk)
        if out and self.runtime is not None:
            self.runtime.writelines(out)

    # -- runtime -> client --------------------------------------------------------------------
    def from_runtime(self, data: bytes) -> None:
        if self.client is None or self.closed:
            return
        if self.r_buf:
            self.r_buf += data
            buf: Buf = self.r_buf
        else:
            buf = data
        size = len(buf)
        off = start = 0
        while size - off >= h2.HEADER_LEN:
            length, ftype, flags, sid = h2.read_head(buf, off)
            end = off + h2.HEADER_LEN + length
            if end > size:
                break
            body = off + h2.HEADER_LEN
            if ftype == h2.DATA:
                action = self._runtime_data(sid, flags, buf, body, end, start)
            elif ftype == h2.HEADERS or ftype == h2.CONTINUATION:
                action = self._runtime_headers(ftype, flags, sid, buf, body, end)
            elif ftype == h2.WINDOW_UPDATE:
                action = self._runtime_window(sid, buf[body:end], buf, start, off)
            elif ftype == h2.SETTINGS and not flags & h2.ACK:
                action = self._runtime_settings(buf[body:end])
            elif ftype == h2.RST_STREAM:
                action = self._runtime_reset(sid)
            elif ftype == h2.GOAWAY:
                action = self._runtime_goaway(buf[body:end], buf, start, off)
            else:
                action = _PASS
            if action != _PASS:
                if action == _SKIP:
                    self._to_client(buf[start:off])
                start = end
            off = end
            if not self.r_block.open and self.deferred_r2c:
                self._to_client(buf[start:off])
                start = off
                deferred, self.deferred_r2c = self.deferred_r2c, []
                self._to_client(b"".join(deferred))
        self._to_client(buf[start:off])
        _keep_rest(self, "r_buf", buf, off)

    def _to_client(self, chunk: Buf) -> None:
        if chunk and self.client is not None:
            self.client.write(chunk)

    def _inject_r2c(self, chunk: Buf) -> None:
        """A frame of our own for the client; never inside the runtime's open header block."""
        if self.r_block.open:
            self.deferred_r2c.append(chunk)
        else:
            self._to_client(chunk)

    def _runtime_data(self, sid: int, flags: int, buf: Buf, start: int, end: int, span: int) -> int:
        """Track a response's message boundaries (size limit) and copy it for a post hook."""
        st = self.streams.get(sid)
        if st is None:
            if sid in self.dropping:
                self._inject_c2r(h2.window_update(0, end - start))  # the client will never see them
                return _SKIP
            return _PASS
        if flags & h2.PADDED:
            content = h2.unpad(flags, bytes(buf[start:end]))
            too_big = _scan(st, content, 0, len(content), self.relay.message_limit)
        else:
            content = b""
            too_big = _scan(st, buf, start, end, self.relay.message_limit)
        if too_big:
            self._to_client(buf[span : start - h2.HEADER_LEN])  # what came before goes first
            self._drop_response(st, too_big, end - start)
            return _DONE
        if st.hook is not None and st.hook.hooks.post is not None:
            st.hook.response += content if flags & h2.PADDED else buf[start:end]
        if flags & h2.END_STREAM:
            del self.streams[sid]
        return _PASS

    def _drop_response(self, st: _Stream, size: int, flow: int) -> None:
        """A response message over the limit: end the call with RESOURCE_EXHAUSTED, as grpc mode does."""
        del self.streams[st.id]
        self._measure(st, _RESOURCE_EXHAUSTED, upstream=True)
        self.dropping.add(st.id)
        limit = self.relay.message_limit
        message = f"cri-proxy: response larger than max ({size} vs. {limit})"
        self._inject_r2c(
            h2.status_frames(st.id, _RESOURCE_EXHAUSTED, message, False, h2.DEFAULT_MAX_FRAME_SIZE)
        )
        self._inject_c2r(h2.rst_stream(st.id, h2.CANCEL))
        self._inject_c2r(h2.window_update(0, flow))

    def _runtime_headers(self, ftype: int, flags: int, sid: int, buf: Buf, start: int, end: int) -> int:
        block = self.r_block
        if not block.feed(ftype, flags, sid, buf, start, end):
            return _PASS
        try:
            headers = block.decode()
        except hpack.HPACKError as exc:
            self._fatal(f"runtime header block does not decode: {exc}")
            return _SKIP
        if block.end:
            self.dropping.discard(block.sid)
        st = self.streams.get(block.sid)
        if st is not None:
            st.responded = True
            if block.end:
                del self.streams[st.id]
                if st.measured and headers is not None:
                    self._measure(st, _status(headers), upstream=True)
                self._observe(st, headers)
        return _PASS

    def _runtime_window(self, sid: int, payload: Buf, buf: Buf, start: int, off: int) -> int:
        increment = h2.window_increment(bytes(payload))
        if sid != 0:
            st = self.streams.get(sid)
            if st is not None and st.hook is not None:
                st.hook.window += increment
                self._pump(st)
            return _PASS
        self.conn_window += increment
        self._drain()
        if self.withheld <= 0:
            return _PASS
        self._to_client(buf[start:off])
        if increment > self.withheld:  # credit for rewritten bytes: the client had it already
            self._to_client(h2.window_update(0, increment - self.withheld))
            self.withheld = 0
        else:
            self.withheld -= increment
        return _DONE

    def _runtime_settings(self, payload: Buf) -> int:
        for ident, value in h2.settings_pairs(bytes(payload)):
            if ident == h2.SETTINGS_INITIAL_WINDOW_SIZE:
                change, self.initial_window = value - self.initial_window, value
                for st in list(self.streams.values()):
                    if st.hook is not None:
                        st.hook.window += change
                        self._pump(st)
            elif ident == h2.SETTINGS_MAX_FRAME_SIZE:
                self.max_frame = value
            elif ident == h2.SETTINGS_HEADER_TABLE_SIZE and self.c_block.dec is not None:
                self.c_block.dec.max_allowed_table_size = value
        return _PASS

    def _runtime_reset(self, sid: int) -> int:
        st = self._reset(sid)
        hook = None if st is None else st.hook
        if hook is not None and hook.request is not None and hook.hooks.failed is not None:
            self._spawn(_run_observer(hook.hooks.failed, hook.request, grpc.StatusCode.CANCELLED, hook.info))
        self.dropping.discard(sid)
        return _PASS

    def _runtime_goaway(self, payload: Buf, buf: Buf, start: int, off: int) -> int:
        """A GOAWAY with an error ends every open call: end them first, naming the runtime."""
        self.goaway_forwarded = True
        code = int.from_bytes(payload[4:8], "big") if len(payload) >= 8 else h2.NO_ERROR
        if code == h2.NO_ERROR or not self.streams:
            return _PASS
        self._to_client(buf[start:off])
        text = bytes(payload[8:]).decode("utf-8", "replace")
        self._end_open_calls(
            f"runtime {self.relay.endpoint} closed the connection (HTTP/2 error {code}: {text})"
        )
        return self._forward_after(buf, off)

    def _forward_after(self, buf: Buf, off: int) -> int:
        """Write the frame at `off` now (after frames we injected) and report it written."""
        length = h2.read_head(buf, off)[0]
        self._to_client(buf[off : off + h2.HEADER_LEN + length])
        return _DONE

    def _end_open_calls(self, why: str) -> None:
        """Answer every open call with UNAVAILABLE (trailers-only when no response headers went out)."""
        message = f"cri-proxy: {why}"
        if self.streams:
            logger.warning("{} ({} calls open)", message, len(self.streams))
        if self.client is not None and not self.r_block.open:  # mid header block nothing may be added
            self.client.writelines(
                [
                    h2.status_frames(sid, _UNAVAILABLE, message, not st.responded, h2.DEFAULT_MAX_FRAME_SIZE)
                    for sid, st in self.streams.items()
                ]
            )
        for st in self.streams.values():
            self._measure(st, _UNAVAILABLE, upstream=True)
            if st.hook is not None and st.hook.task is not None:
                st.hook.task.cancel()
        self.streams.clear()

    def runtime_lost(self, exc: Exception | None) -> None:
        """End every open call with UNAVAILABLE naming the runtime, then GOAWAY and close."""
        self.runtime = None
        if self.closed or self.client is None:
            return
        reason = f": {exc}" if exc else ""
        self._end_open_calls(f"lost the connection to runtime {self.relay.endpoint}{reason}")
        if not self.goaway_forwarded and not self.r_block.open:
            self.client.write(h2.goaway(self.last_stream, h2.NO_ERROR))
        self.client.close()


def _keep_rest(link: _FrameLink, attr: str, buf: Buf, off: int) -> None:
    """Keep an incomplete frame's bytes for the next read."""
    kept: bytearray = getattr(link, attr)
    if buf is kept:
        del kept[:off]
    elif off < len(buf):
        setattr(link, attr, bytearray(buf[off:]))
