"""What the link core keeps per open stream. No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf.message import Message

from cri_proxy.relay.hooks import Hooks
from cri_proxy.relay.messages import Boundaries
from cri_proxy.relay.methods import MethodInfo
from cri_proxy.relay.wire import Buf


@dataclass(slots=True, eq=False)
class HookedRequest:
    """A request whose method has hooks: its DATA is held until the client ends it, then hooked."""

    info: MethodInfo
    hooks: Hooks
    window: int  # the runtime's send window for this stream
    encoding: bytes | None = None  # the request's grpc-encoding
    held: list[Buf] = field(default_factory=list)
    held_bytes: int = 0  # request bytes held (budgeted)
    prefix: Boundaries = field(default_factory=Boundaries)
    released: bool = False  # the client ended its request (or it was refused): nothing more is held
    running: bool = False  # the pre hook runs
    trailers: bool = False  # the client ends with trailers: its frames wait for the hooked request
    out: bytes = b""  # the request to send (gRPC-framed), from out_at on
    out_at: int = 0
    sending: bool = False
    finished: bool = False  # END_STREAM sent to the runtime, or nothing more will be
    request: Message | bytes | None = None  # as forwarded (bytes: not decoded yet), for the post/failed hooks
    response: bytearray = field(default_factory=bytearray)


@dataclass(slots=True, eq=False)
class Stream:
    """An open stream: enough to follow its response and to end it ourselves if needed."""

    id: int
    path: str = ""  # unary method path when the call is measured
    responded: bool = False  # response headers forwarded to the client
    slow: bool = False  # a call the runtime works on for a while (methods.SLOW)
    hook: HookedRequest | None = None
    response: Boundaries = field(default_factory=Boundaries)
    began: float = 0.0  # when its headers arrived
    sent_at: float = 0.0  # when its request went on to the runtime
