"""The asyncio side of the frame relay: the listener, and per client connection a thin adapter that
dials the runtime, feeds both sides' bytes to its LinkCore, writes what the core says, and runs the
hooks it asks for. Every HTTP/2 decision is the core's (core.py); this file only moves bytes."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import select
import socket
from collections.abc import Callable, Coroutine
from functools import partial
from time import perf_counter
from typing import Any, cast

from google.protobuf.message import Message
from loguru import logger

from cri_proxy.config import Config
from cri_proxy.endpoints import socket_path
from cri_proxy.errors import EndpointError
from cri_proxy.relay import inline, standin
from cri_proxy.relay.core import (
    CancelPre,
    Event,
    Limits,
    LinkCore,
    PreDone,
    Readied,
    RunFailed,
    RunPost,
    RunPre,
)
from cri_proxy.relay.flow import Budget
from cri_proxy.relay.forward import CallObserver
from cri_proxy.relay.heap import HeapTrim, malloc_trim
from cri_proxy.relay.hookrun import CODES, Forward, HookRunner, PreOutcome
from cri_proxy.relay.hooks import FailPolicy, HookTable
from cri_proxy.relay.methods import KNOWN

CONNECT_TIMEOUT = 5.0
WRITE_BUFFER_HIGH = 1 << 20  # a side's unsent bytes beyond which the other side is not read
PING_WAIT = 1.0  # seconds a runtime PING may wait for a write to the runtime before the core answers it
QUIET_WAIT = 0.05  # seconds the client's quiet frames (PING ACKs, ...) may wait for a write to the runtime
CLOSE_WAIT = 5.0  # seconds a closed side has to take what is still written to it; then it is dropped
GONE_CHECK = 1.0  # seconds between two looks at whether a client not read meanwhile has hung up
READY_WAIT = 0.1
"""Seconds a request that went on ready (`Readied`) waits, at most, to be decoded and handed to
`Ready.after` (a create's pending record): done right before the hooks after its call, not while
the runtime works on it (on two CPUs, 0.5 ms of the proxy's CPU there added 0.14-0.22 ms to a
create), and the two together are less work (`EnforceHooks._went_in`). docs/performance.md."""


class FrameRelay:
    """Accepts client connections on a bound Unix socket and pairs each with a runtime connection."""

    def __init__(
        self,
        config: Config,
        hooks: HookTable | None = None,
        fail_policy: Callable[[], FailPolicy] | None = None,
        observer: Callable[[], CallObserver | None] | None = None,
        runner: HookRunner | None = None,
    ) -> None:
        runtime = socket_path(config.runtime_endpoint)
        if runtime is None:
            raise EndpointError(
                f"relay_mode 'frames' needs a unix:// runtime_endpoint, not {config.runtime_endpoint!r}"
            )
        self.runtime_path = str(runtime)
        self.endpoint = config.runtime_endpoint
        self.hooks = hooks if hooks is not None else HookTable()
        fixed = FailPolicy(config.fail_policy)
        self.runner = runner if runner is not None else HookRunner(fail_policy or (lambda: fixed))
        self.observer = observer or (lambda: None)
        self.limits = Limits(
            message=min(config.max_recv_message_bytes, config.max_send_message_bytes),
            buffer=config.relay_buffer_bytes,
        )
        self.budget = Budget(config.relay_buffer_total_bytes)
        self.links: set[Link] = set()
        self.heap = HeapTrim(malloc_trim())
        self.measured: list[tuple[str, int, float, float]] = []  # calls ended, not yet observed
        self._server: asyncio.AbstractServer | None = None

    def watch_responses(self) -> bool:
        """Whether any hook needs the runtime's answers (then its header blocks are decoded too)."""
        found = (self.hooks.get(path) for path in KNOWN) if len(self.hooks) else ()
        return any(h is not None and (h.post is not None or h.failed is not None) for h in found)

    def new_core(self) -> LinkCore:
        observe = None
        if self.observer() is not None:
            observe = self._measured

        return LinkCore(
            self.hooks.get,
            self.limits,
            self.budget,
            observe,
            decode_client=True,
            decode_runtime=observe is not None or self.watch_responses(),
            runtime_name=self.endpoint,
            as_is=self.runner.as_is,
        )

    def _measured(self, path: str, code: int, total: float, upstream: float) -> None:
        self.measured.append((path, code, total, upstream))

    def report(self) -> None:
        """Hand the calls measured to the observer: after the answers were written, not before."""
        measured, self.measured = self.measured, []
        observer = self.observer()
        if observer is None:
            return
        for path, code, total, upstream in measured:
            observer.observe(path, CODES[code] if code in CODES else CODES[2], total, upstream)

    async def start(self, sock: socket.socket) -> None:
        """Serve on `sock`; a second start (the socket file was removed and bound again) stops
        accepting on the one before, whose connections go on."""
        loop = asyncio.get_running_loop()
        before, self._server = self._server, await loop.create_unix_server(lambda: Link(self), sock=sock)
        if before is not None:
            before.close()

    async def stop(self, grace: float) -> None:
        """Stop accepting; GOAWAY every client; wait up to `grace` for open calls; close the rest."""
        loop = asyncio.get_running_loop()
        if self._server is not None:
            self._server.close()
        self.heap.cancel()
        for link in list(self.links):
            link.go_away()
        deadline = loop.time() + grace
        while any(link.busy() for link in self.links) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for link in list(self.links):
            link.close()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):  # uvloop waits for every connection to detach
                await asyncio.wait_for(self._server.wait_closed(), 1.0)


class _RuntimeSide(asyncio.Protocol):
    """The runtime connection's protocol: hands everything to its Link."""

    def __init__(self, link: Link) -> None:
        self.link = link

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.link.runtime_up(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        self.link.runtime_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.runtime_down(exc)

    def pause_writing(self) -> None:
        self.link.runtime_full = True
        self.link.reading()

    def resume_writing(self) -> None:
        self.link.runtime_full = False
        self.link.reading()


class Link(asyncio.Protocol):
    """One client connection and its runtime connection: the client side's protocol."""

    def __init__(self, relay: FrameRelay) -> None:
        self.relay = relay
        self.core = relay.new_core()
        self.client: asyncio.Transport | None = None
        self.runtime: asyncio.Transport | None = None
        self.stand_in: standin.StandIn | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.waiting: list[bytes] = []  # client bytes that came before the runtime connection
        self.waiting_bytes = 0
        self.closed = False
        self.paused = False  # client reading paused
        self.runtime_full = False  # the runtime's transport buffer is full
        self.decode_soon: asyncio.Handle | None = None  # the next step of a big header block's decoding
        self.ping_due: asyncio.TimerHandle | None = None  # when the runtime's held PINGs get answered
        self.gone_check: asyncio.TimerHandle | None = None  # while the client is not read
        self.quiet_due: asyncio.TimerHandle | None = None  # when the client's quiet frames go
        # stream -> its request that went on ready, not decoded yet, and when it is due (loop time)
        self.readied: dict[int, tuple[Readied, float]] = {}
        self.ready_due: asyncio.TimerHandle | None = None  # when the oldest of those is decoded
        self.pres: dict[int, asyncio.Future[PreOutcome]] = {}
        self.tasks: set[asyncio.Future[Any]] = set()

    # -- life -------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.client = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses
        self.client.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        self.relay.links.add(self)
        self._spawn(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(
                loop.create_unix_connection(lambda: _RuntimeSide(self), self.relay.runtime_path),
                CONNECT_TIMEOUT,
            )
        except (TimeoutError, OSError) as exc:
            if not self.closed and self.client is not None:
                reason, endpoint = str(exc) or type(exc).__name__, self.relay.endpoint
                if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
                    # the runtime is fine: the proxy itself is at its limit (daemon/fds.py says so)
                    message = f"cri-proxy: out of file descriptors, {endpoint} not dialled: {reason}"
                else:
                    message = f"cri-proxy: runtime {endpoint} is not reachable: {reason}"
                logger.debug("{}", message)
                self._stand_in(message)

    def _stand_in(self, message: str) -> None:
        assert self.client is not None
        self.stand_in = standin.StandIn(message)
        self.client.write(self.stand_in.start())
        self.timer = asyncio.get_running_loop().call_later(standin.LIFETIME, self._stand_in_done)
        waiting, self.waiting = self.waiting, []
        for chunk in waiting:
            self._to_stand_in(chunk)
        self.reading()

    def _to_stand_in(self, data: bytes) -> None:
        assert self.stand_in is not None and self.client is not None
        answered = self.stand_in.answered
        self.client.writelines(self.stand_in.receive(data))
        if self.stand_in.broken:
            shut(self.client, CLOSE_WAIT)
        elif answered == 0 and self.stand_in.answered and self.timer is not None:
            self.timer.cancel()
            self.timer = asyncio.get_running_loop().call_later(standin.LINGER, self._stand_in_done)

    def _stand_in_done(self) -> None:
        if self.stand_in is not None and self.client is not None and not self.client.is_closing():
            self.client.write(self.stand_in.finish())
            shut(self.client, CLOSE_WAIT)

    def runtime_up(self, transport: asyncio.Transport) -> None:
        if self.closed:
            transport.close()
            return
        self.runtime = transport
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        waiting, self.waiting, self.waiting_bytes = self.waiting, [], 0
        for chunk in waiting:
            self.core.receive_from_client(chunk, perf_counter())
        self.flush()

    def runtime_down(self, exc: Exception | None) -> None:
        self.runtime = None
        if self.closed:
            return
        self.core.runtime_lost(f": {exc}" if exc else "")
        self.flush()

    def data_received(self, data: bytes) -> None:
        if self.runtime is not None:
            self.core.receive_from_client(data, perf_counter())
            self.flush()
        elif self.stand_in is not None:
            self._to_stand_in(data)
        else:
            self.waiting.append(data)
            self.waiting_bytes += len(data)
            self.reading()

    def runtime_data(self, data: bytes) -> None:
        """The runtime's bytes: what they carry for the client is written before their header
        blocks are read (`answers_later`), then the hooks after the calls they end run."""
        self.core.receive_from_runtime(data, perf_counter(), answers_later=True)
        self.flush()

    def eof_received(self) -> bool | None:
        return None  # the client half-closed: close (its calls can no longer be cancelled by it)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.relay.links.discard(self)
        if self.timer is not None:
            self.timer.cancel()
        if self.decode_soon is not None:
            self.decode_soon.cancel()
        if self.ping_due is not None:
            self.ping_due.cancel()
        if self.gone_check is not None:
            self.gone_check.cancel()
        if self.quiet_due is not None:
            self.quiet_due.cancel()
        self.core.client_lost()
        self._events()
        self._decode_readied(everything=True)  # those whose calls ended without a hook after them
        if self.relay.measured:
            self.relay.report()
        # what is still to go to the runtime is the requests of a client that is gone: dropped at
        # once (the runtime would cancel them), not kept, with the socket, while the runtime reads
        # nothing (it does not when its answers to that client cannot be written)
        shut(self.runtime, 0.0)
        self.relay.heap.look()

    def pause_writing(self) -> None:
        if self.runtime is not None:
            self.runtime.pause_reading()

    def resume_writing(self) -> None:
        if self.runtime is not None:
            self.runtime.resume_reading()

    def go_away(self) -> None:
        if self.stand_in is not None:
            self._stand_in_done()
        elif not self.closed:
            self.core.go_away()
            self.flush()

    def busy(self) -> bool:
        return not self.closed and self.core.busy()

    def close(self) -> None:
        self.closed = True
        shut(self.client, CLOSE_WAIT)
        shut(self.runtime, CLOSE_WAIT)

    # -- moving what the core says ------------------------------------------------------------------
    def flush(self) -> None:
        core = self.core
        after: list[Event] = []
        if core.events:
            # pre hooks first: one that ends in this turn adds its request's DATA, which then leaves
            # in one write with the HEADERS before it (one wake-up of the runtime, not two); the
            # hooks that come after a call wait until its answer is written
            for event in core.take_events():
                if isinstance(event, RunPre | CancelPre):
                    self._event(event)
                else:
                    after.append(event)
        # unless one of them is to run before its answer (`Hooks.post_first`): then they all run,
        # in their order, before this turn's write
        first = bool(core.answers or core.unread) and core.posts_first()
        if after and not first:
            first = any(isinstance(e, RunPost) and e.hooks.post_first for e in after)
        if not first:
            self._write()
        if core.answers or core.unread:  # the runtime's answers are passed on: now read them
            # (their frames followed, the calls they end measured, hooks asked for)
            core.read_answers()
            after.extend(core.take_events())
            if not first:
                self._write()
        for event in after:
            self._event(event)
        if first:
            self._write()
        if core.warnings:
            for text in core.warnings:
                logger.warning("frame relay: {}", text)
            core.warnings.clear()
        if core.closing:
            self.close()
        else:
            if self.decode_soon is None and core.decoding():
                # a big header block: one bounded step a loop turn, other connections go between
                self.decode_soon = asyncio.get_running_loop().call_soon(self._decode_more)
            if core.quiet and self.quiet_due is None:  # one timer at a time, not one per read
                self.quiet_due = asyncio.get_running_loop().call_later(QUIET_WAIT, self._release_quiet)
            if core.held_pings and self.ping_due is None:
                # not re-armed per PING: one timer a second at most, whatever the call rate
                self.ping_due = asyncio.get_running_loop().call_later(PING_WAIT, self._answer_pings)
            self.reading()
        if self.relay.measured:
            self.relay.report()

    def _write(self) -> None:
        """What the core has for each side, written; dropped for a side whose transport is closing
        (shut by the link, or lost: a write there raises on uvloop, and on 3.12's and 3.13.0's own
        loop once closed)."""
        core = self.core
        if core.out_r and self.runtime is not None:
            out = core.take_runtime()
            if not self.runtime.is_closing():
                self.runtime.writelines(out)
        if core.out_c and self.client is not None:
            out = core.take_client()
            if not self.client.is_closing():
                self.client.writelines(out)

    def _decode_more(self) -> None:
        self.decode_soon = None
        if not self.closed:
            self.core.decode_more(perf_counter())
            self.flush()

    def _release_quiet(self) -> None:
        """The client's quiet frames go to the runtime (those held after this timer was set, sooner
        than QUIET_WAIT: early is harmless)."""
        self.quiet_due = None
        if not self.closed:
            self.core.release_quiet()
            self.flush()

    def _answer_pings(self) -> None:
        """The runtime's PINGs held since this timer was set are answered (those held later, sooner
        than PING_WAIT: early is harmless)."""
        self.ping_due = None
        if not self.closed:
            self.core.answer_pings()
            self.flush()

    def reading(self) -> None:
        """Read the client while the core wants its bytes and the runtime takes ours."""
        if self.client is None or self.closed:
            return
        want = (
            not self.runtime_full
            and self.waiting_bytes < self.relay.limits.buffer
            and self.core.wants_client()
        )
        if want and self.paused:
            self.paused = False
            self.client.resume_reading()
        elif not want and not self.paused:
            self.paused = True
            self.client.pause_reading()
            if self.gone_check is None:
                self.gone_check = asyncio.get_running_loop().call_later(GONE_CHECK, self._client_gone)

    def _client_gone(self) -> None:
        """A client that is not read would hang up unseen (its end of file waits behind the bytes not
        read), and the link with all it holds would stay for good: its socket is asked directly."""
        self.gone_check = None
        if self.closed or not self.paused or self.client is None:
            return
        if hung_up(self.client):
            self.client.abort()  # what it sent and what it was owed go with it; connection_lost follows
        else:
            self.gone_check = asyncio.get_running_loop().call_later(GONE_CHECK, self._client_gone)

    def _events(self) -> None:
        for event in self.core.take_events():
            self._event(event)

    def _event(self, event: Event) -> None:
        runner = self.relay.runner
        if isinstance(event, RunPre):
            self._pre(event)
        elif isinstance(event, CancelPre):
            task = self.pres.pop(event.stream, None)
            if task is not None:
                task.cancel()
        elif isinstance(event, RunPost):
            request = self._as_sent(event.stream, event.request)
            if request is not None:
                self._after_call(runner.post(event.info, event.hooks, request, event.response))
        elif isinstance(event, RunFailed):
            request = self._as_sent(event.stream, event.request)
            if request is not None:
                self._after_call(runner.failed(event.info, event.hooks, request, event.code))
        elif isinstance(event, Readied):
            loop = asyncio.get_running_loop()
            due = loop.time() + READY_WAIT
            self.readied[event.stream] = (event, due)
            if self.ready_due is None:
                self.ready_due = loop.call_at(due, self._decode_readied)

    def _as_sent(self, stream: int, request: Message | bytes) -> Message | bytes | None:
        """The request of a call that ended, for its hooks after it: a ready one still waiting is
        decoded now and handed to `Ready.after` first (None: it does not decode, no hook sees it)."""
        waiting = self.readied.pop(stream, None)
        if waiting is None:
            return request
        readied = waiting[0]
        return self.relay.runner.readied(readied.info, readied.ready, readied.request)

    def _decode_readied(self, everything: bool = False) -> None:
        """The ready requests that waited `READY_WAIT` (or all: the link closed), decoded now: what
        the hooks after their calls get. Those written since wait on (a timer for the oldest)."""
        if self.ready_due is not None:
            self.ready_due.cancel()
            self.ready_due = None
        runner, readied, loop = self.relay.runner, self.readied, asyncio.get_running_loop()
        now = loop.time()
        for stream, (event, due) in list(readied.items()):  # oldest first
            if due > now and not everything:
                self.ready_due = loop.call_at(due, self._decode_readied)
                return
            del readied[stream]
            self.core.request_decoded(stream, runner.readied(event.info, event.ready, event.request))

    def _after_call(self, hook: Coroutine[Any, Any, None]) -> None:
        """A hook after the call (its answer is written): run now; one that waits goes on in a task."""
        try:
            started = inline.start(hook)
        except Exception as exc:  # a bug outside the hook's guard: logged; the link lives on
            hook.close()
            logger.opt(exception=exc).error("hook after a call failed: {}", exc)
            return
        if not isinstance(started, inline.Finished):
            self.tasks.add(started)
            started.add_done_callback(self.tasks.discard)

    def _pre(self, event: RunPre) -> None:
        """Run the pre hook now, in this loop turn; a hook that waits goes on in a task."""
        runner = self.relay.runner
        if event.message is None:
            return self._pre_done(event.stream, runner.unreadable(event.info, event.why, event.hooks))
        hook = runner.pre(event.info, event.hooks, event.message)
        try:
            started = inline.start(hook)
        except Exception as exc:  # outside the hook's guard (the runner, the task's start): the call
            hook.close()  # still ends, as the fail policy says, instead of waiting for good
            return self._pre_done(event.stream, runner.crashed(event.info, event.hooks, exc))
        if isinstance(started, inline.Finished):
            return self._pre_done(event.stream, started.value)
        self.pres[event.stream] = started
        self.tasks.add(started)
        started.add_done_callback(partial(self._pre_ended, event))

    def _pre_ended(self, event: RunPre, task: asyncio.Future[PreOutcome]) -> None:
        self.tasks.discard(task)
        self.pres.pop(event.stream, None)
        if task.cancelled():
            self.core.hook_cancelled(event.stream)
            return
        exc = task.exception()
        if exc is not None:  # as in `_pre`: the call ends all the same
            outcome = self.relay.runner.crashed(event.info, event.hooks, exc)
        else:
            outcome = task.result()
        self._pre_done(event.stream, outcome)

    def _pre_done(self, stream: int, outcome: PreOutcome) -> None:
        if isinstance(outcome, Forward):
            done = PreDone(outcome.message, outcome.request)
        else:
            done = PreDone(None, None, (outcome.code, outcome.message))
        self.core.hook_finished(stream, done, perf_counter())
        self.flush()

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task


def shut(transport: asyncio.Transport | None, wait: float) -> None:
    """Close `transport`. What it still holds is written if its peer reads it within `wait` seconds,
    else dropped: a peer that never reads would keep it, and the socket, open for good."""
    if transport is None:
        return
    transport.close()
    if transport.get_write_buffer_size():
        if wait <= 0:
            transport.abort()
        else:
            asyncio.get_running_loop().call_later(wait, transport.abort)


def hung_up(transport: asyncio.Transport) -> bool:
    """Whether the peer of `transport`'s socket has closed it, asked without reading a byte."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLRDHUP)
    return any(mask & (select.POLLRDHUP | select.POLLHUP) for _, mask in poller.poll(0))


def bind_unix(path: str) -> socket.socket:
    """A bound Unix stream socket for the frame relay (the caller sets the umask around this)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise EndpointError(f"cannot listen on {path}: {exc.strerror or exc}") from exc
    return sock
