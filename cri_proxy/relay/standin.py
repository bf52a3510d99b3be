"""The stand-in for an unreachable runtime: a well-formed HTTP/2 server answering every call
UNAVAILABLE (naming the runtime), so the caller learns why at once. A pure object, no I/O."""

from __future__ import annotations

from cri_proxy.relay import wire
from cri_proxy.relay.wire import Buf

UNAVAILABLE = 14
DEFAULT_TABLE = 4096  # HPACK's initial dynamic table size
LINGER = 0.2  # seconds a stand-in connection stays after answering its first call
LIFETIME = 2.0  # ... and at most, so an idle client reconnects (and retries the runtime)


class StandIn:
    """Answers SETTINGS, PING and every request (UNAVAILABLE); `receive` gives what to write."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.split = wire.FrameSplitter(preface=True)
        self.last_stream = 0
        self.answered = 0
        self.broken = False
        self.table = DEFAULT_TABLE  # the client's HPACK table size, as our blocks have left it
        self.allowed = DEFAULT_TABLE  # the last size the client announced (we ACK at once)

    def start(self) -> bytes:
        """The server preface: SETTINGS, all defaults."""
        return wire.settings()

    def receive(self, data: bytes) -> list[Buf]:
        """What to write back for the client's bytes (nothing once it broke the protocol)."""
        if self.broken:
            return []
        try:
            buf, first, frames = self.split.feed(data)
        except (wire.PrefaceError, wire.FrameTooLarge):
            self.broken = True
            return [wire.goaway(self.last_stream, wire.PROTOCOL_ERROR)]
        out: list[Buf] = []
        for at, end, ftype, flags, sid in frames:
            if ftype == wire.SETTINGS and not flags & wire.ACK:
                for ident, value in wire.settings_pairs(bytes(buf[at + wire.HEADER_LEN : end])):
                    if ident == wire.SETTINGS_HEADER_TABLE_SIZE:
                        self.allowed = value
                out.append(wire.SETTINGS_ACK)
            elif ftype == wire.PING and not flags & wire.ACK:
                out.append(wire.frame(wire.PING, wire.ACK, 0, bytes(buf[at + wire.HEADER_LEN : end])))
            elif ftype == wire.DATA and end - at > wire.HEADER_LEN:
                out.append(wire.window_update(0, end - at - wire.HEADER_LEN))
            elif (
                ftype in (wire.HEADERS, wire.CONTINUATION)
                and flags & wire.END_HEADERS
                and sid > self.last_stream
                and sid & 1
            ):
                self.last_stream = sid
                self.answered += 1
                shrink = None
                if self.allowed < self.table:  # a smaller table: our next block must say so first
                    shrink = self.table = self.allowed
                max_frame = wire.DEFAULT_MAX_FRAME_SIZE
                out.append(wire.status_frames(sid, UNAVAILABLE, self.message, True, max_frame, shrink))
        self.split.keep(buf, frames[-1][1] if frames else first)
        return out

    def finish(self) -> bytes:
        """GOAWAY, so the client's next call makes a fresh attempt at the runtime."""
        return wire.goaway(self.last_stream, wire.NO_ERROR)
