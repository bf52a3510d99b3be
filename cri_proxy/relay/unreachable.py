"""The stand-in for an unreachable runtime: answers every call UNAVAILABLE, then goes away."""

from __future__ import annotations

import asyncio

from cri_proxy.relay import frames as h2
from cri_proxy.relay.linkstate import _UNAVAILABLE

_UNREACHABLE_LINGER = 0.2  # seconds a stand-in connection stays after answering its first call
_UNREACHABLE_LIFETIME = 2.0  # ... and at most, so an idle client reconnects (and retries the runtime)


class _Unreachable:
    """Stands in for an unreachable runtime: a minimal HTTP/2 server answering UNAVAILABLE."""

    def __init__(self, client: asyncio.Transport, message: str) -> None:
        self.client = client
        self.message = message
        self.buf = bytearray()
        self.preface_left = len(h2.PREFACE)
        self.last_stream = 0
        self.answered: set[int] = set()
        client.write(h2.settings())
        self.timer = asyncio.get_running_loop().call_later(_UNREACHABLE_LIFETIME, self.finish)

    def feed(self, data: bytes) -> None:
        self.buf += data
        if self.preface_left:
            take = min(self.preface_left, len(self.buf))
            self.preface_left -= take
            del self.buf[:take]
        off = 0
        while len(self.buf) - off >= h2.HEADER_LEN:
            length, ftype, flags, sid = h2.read_head(self.buf, off)
            end = off + h2.HEADER_LEN + length
            if end > len(self.buf):
                break
            self._frame(ftype, flags, sid, bytes(self.buf[off + h2.HEADER_LEN : end]))
            off = end
        del self.buf[:off]

    def _frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if ftype == h2.SETTINGS and not flags & h2.ACK:
            self.client.write(h2.SETTINGS_ACK)
        elif ftype == h2.PING and not flags & h2.ACK:
            self.client.write(h2.frame(h2.PING, h2.ACK, 0, payload))
        elif ftype == h2.DATA and payload:
            self.client.write(h2.window_update(0, len(payload)))
        elif ftype in (h2.HEADERS, h2.CONTINUATION) and flags & h2.END_HEADERS and sid not in self.answered:
            self.answered.add(sid)
            self.last_stream = max(self.last_stream, sid)
            frames = h2.status_frames(sid, _UNAVAILABLE, self.message, True, h2.DEFAULT_MAX_FRAME_SIZE)
            self.client.write(frames)
            if len(self.answered) == 1:
                self.timer.cancel()
                self.timer = asyncio.get_running_loop().call_later(_UNREACHABLE_LINGER, self.finish)

    def finish(self) -> None:
        """GOAWAY and close, so the client's next call makes a fresh attempt at the runtime."""
        self.timer.cancel()
        if not self.client.is_closing():
            self.client.write(h2.goaway(self.last_stream, h2.NO_ERROR))
            self.client.close()

    def cancel(self) -> None:
        self.timer.cancel()
