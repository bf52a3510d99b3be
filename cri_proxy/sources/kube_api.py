"""This node's pods through the Kubernetes API: re-binds that CRI never reports.

The official `kubernetes` client (sync) does the HTTP: config loading (a kubeconfig path, else the
in-cluster service account, else ~/.kube/config; read again at each session, so renewed credentials
and an edited address take effect), TLS and auth. Every blocking call runs in a
daemon thread of its own, so no CRI call ever waits on the API and a hung API server never holds
up the proxy's shutdown; the events come back to the event loop, which alone changes the state.

The protocol, as client-go's reflector does it:
- list `GET /api/v1/pods?fieldSelector=spec.nodeName=<node>`; its `metadata.resourceVersion` is
  where the watch starts; API views of pods no longer listed are forgotten;
- watch from the last resourceVersion seen (an event's object, or a BOOKMARK), with bookmarks
  asked for; a watch that ends (server time-out, dropped connection) resumes from there at once;
- 410 Gone (an ERROR event with code 410, or the watch request answered 410): list again (from
  the third 410 in a row, spaced out with back-off: each list is still the truth, so no problem);
- anything else (refused, time-out, 5xx, 403, bad config): `problem` is `api-unreachable`, the
  proxy goes on with CRI data alone (and the API views it already had), retrying with back-off;
- none of the pods the runtime runs bound to the node in the API (checked after each list and
  each watch's normal end): `problem` is `api-wrong-node`, as the node name is not the kubelet's.

Only the QoS label and the allocation annotations are read, matched to sandboxes by pod uid
(`NodeState.set_api_view`; the precedence rule is in `cri_proxy.state.model`). DELETED forgets.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from loguru import logger
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_never, wait_exponential

from cri_proxy.cpu import Problem, ProblemKind
from cri_proxy.files import read_small
from cri_proxy.state.model import NodeState
from cri_proxy.threads import in_daemon_thread

CONNECT_TIMEOUT = 5.0
LIST_TIMEOUT = 60.0
LIST_PAGE = 500
GONE_STREAK = 3
"""410s in a row from which the lists are spaced out with back-off."""
CONFIG_SOURCE = "kubernetes.io/config.source"
"""The kubelet's annotation on a pod (and its sandbox): "file" or "http" for a static pod, whose
mirror in the API has a uid of its own, so it never matches the runtime's."""
MAX_KUBECONFIG_BYTES = 16 * 1024 * 1024  # a kubeconfig with inline certificates is kilobytes


class ApiError(Exception):
    """The API answered, but not usefully (an ERROR event, a body that is not a pod list...)."""


class _Gone(Exception):
    """410 Gone: the resourceVersion is too old; list again."""


def default_node_name() -> str:
    """kubelet's default node name: the host name, lower-cased."""
    return socket.gethostname().lower()


def describe(exc: BaseException) -> str:
    """One short line for an error of the client, urllib3 or the config loader."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status:
        reason = getattr(exc, "reason", "") or ""
        return f"HTTP {status} {reason}".strip()
    inner = getattr(exc, "reason", None)  # urllib3's MaxRetryError wraps the real cause
    if isinstance(inner, BaseException):
        return describe(inner)
    first = exc.args[0] if exc.args else None  # urllib3's ProtocolError: (message, cause)
    text = (first if isinstance(first, str) else str(exc)).strip() or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _close_response(response: Any) -> None:
    """Unblock a thread reading this urllib3 response, then release it."""
    conn = getattr(response, "connection", None)
    sock = getattr(conn, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        response.close()
    with contextlib.suppress(Exception):
        response.release_conn()


def _close_client(client: Any) -> None:
    client.close()


def _host_of(client: Any) -> str:
    """The API server address an ApiClient talks to."""
    return str(getattr(getattr(client, "configuration", None), "host", "") or "")


def _load_client(kubeconfig: str) -> Any:
    """An ApiClient: the kubeconfig file when given, else in-cluster config, else ~/.kube/config."""
    from kubernetes import client
    from kubernetes import config as loaders

    config: Any = loaders  # its loaders are untyped
    configuration = client.Configuration()
    if kubeconfig:  # the loader opens it blindly: a FIFO there would hold this thread for good
        read_small(kubeconfig, MAX_KUBECONFIG_BYTES)
        config.load_kube_config(
            config_file=kubeconfig, client_configuration=configuration, persist_config=False
        )
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration, persist_config=False)
    configuration.retries = 1  # our own back-off does the retrying
    return client.ApiClient(configuration)


def _pod_fields(pod: Any) -> tuple[str, str, dict[str, str], dict[str, str], str] | None:
    """(uid, namespace/name, labels, annotations, resourceVersion) of a pod object; None: not a pod."""
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("uid"), str) or not meta["uid"]:
        return None

    def strings(value: Any) -> dict[str, str]:
        if not isinstance(value, dict):
            return {}
        return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}

    key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    rv = meta.get("resourceVersion")
    return (
        meta["uid"],
        key,
        strings(meta.get("labels")),
        strings(meta.get("annotations")),
        rv if isinstance(rv, str) else "",
    )


class KubeApiWatcher:
    """List + watch this node's pods; keeps `NodeState`'s API views current.

    `on_change()` is called (in the loop) after the API views or `problem` changed. `problem` is
    None while the API answers, an `api-unreachable` Problem while it does not. `resource_version`
    is the last one seen ("" before the first list, and after a 410: list again).
    """

    def __init__(
        self,
        state: NodeState,
        node_name: str = "",
        kubeconfig: str = "",
        on_change: Callable[[], None] | None = None,
        *,
        backoff: float = 0.25,
        backoff_max: float = 30.0,
        watch_seconds: int = 300,
        pods_current: Callable[[], bool] = lambda: True,
    ) -> None:
        self.state = state
        self.pods_current = pods_current  # the state holds the runtime's pods (not a stale checkpoint's)
        self.node_name = node_name or default_node_name()
        self.kubeconfig = kubeconfig
        self.on_change = on_change or (lambda: None)
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.watch_seconds = watch_seconds
        self._unreachable: Problem | None = None
        self._wrong_node: Problem | None = None
        self.resource_version = ""
        self.lists = 0  # successful lists
        self.watches = 0  # watch requests answered 200
        self.events = 0  # watch events handled
        self._client: Any = None
        self._response: Any = None  # the open watch, to unblock its reader on stop
        self._gones = 0  # 410s with no event nor a watch's normal end in between

    @property
    def field_selector(self) -> str:
        return f"spec.nodeName={self.node_name}"

    # -- running ------------------------------------------------------------------------------
    async def run(self) -> None:
        """Forever (until cancelled): list, watch, resume, re-list; back off while it fails."""
        logger.info("watching the Kubernetes API for the pods of node {}", self.node_name)
        try:
            while True:
                async for attempt in AsyncRetrying(
                    wait=wait_exponential(multiplier=self.backoff, max=self.backoff_max),
                    retry=retry_if_exception_type(Exception),
                    stop=stop_never,
                    before_sleep=self._failed,
                    reraise=True,
                ):
                    with attempt:
                        await self._session()
        finally:
            self.close()

    @property
    def api_client(self) -> Any:
        """The connected ApiClient (None before the first session): for posting Events."""
        return self._client

    def close(self) -> None:
        response, self._response = self._response, None
        if response is not None:
            _close_response(response)
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def _failed(self, retry: RetryCallState) -> None:
        exc = retry.outcome.exception() if retry.outcome is not None else None
        reason = describe(exc) if exc is not None else "unknown error"
        where = self._host() or "(no config)"
        problem = Problem(
            None,
            ProblemKind.API_UNREACHABLE,
            f"Kubernetes API {where}: {reason}; working on CRI data alone, retrying",
        )
        delay = retry.next_action.sleep if retry.next_action is not None else 0.0
        if problem != self.problem:
            logger.warning("{} (next try in {:.1f} s)", problem.message, delay)
            self._set_problem(problem)
        else:
            logger.debug("Kubernetes API still unreachable: {} (next try in {:.1f} s)", reason, delay)

    @property
    def problem(self) -> Problem | None:
        """`api-unreachable` while the API does not answer, else `api-wrong-node` while none of the
        runtime's pods is bound to the watched node there."""
        return self._unreachable or self._wrong_node

    def _set_problem(self, problem: Problem | None) -> None:
        if problem != self._unreachable:
            if problem is None and self._unreachable is not None:
                logger.info("Kubernetes API {} answers again", self._host())
            self._unreachable = problem
            self.on_change()

    def _check_node(self) -> None:
        """The API binds some of the pods the runtime runs to this node, or the node name is wrong
        (kubelet's --hostname-override, a cloud's node name that is not the host name): then the
        watch follows nothing, and says so instead of looking healthy."""
        if not self.pods_current():
            return  # a checkpoint's pods, from before an outage, may all be gone from the API
        running = {
            p.uid
            for p in self.state.pods()
            if p.ready and p.uid and p.annotations.get(CONFIG_SOURCE, "api") == "api"
        }
        wrong = None
        if running and not running & self.state.api_views().keys():
            wrong = Problem(
                None,
                ProblemKind.API_WRONG_NODE,
                f"none of the pods the runtime runs is bound to node {self.node_name} in the Kubernetes "
                "API: is [kubernetes] node_name the kubelet's node name (its --hostname-override)?",
            )
        if wrong != self._wrong_node:
            if wrong is not None:
                logger.warning("{}", wrong.message)
            else:
                logger.info("Kubernetes API: this node's pods are bound to node {}", self.node_name)
            self._wrong_node = wrong
            self.on_change()

    def _host(self) -> str:
        return _host_of(self._client) if self._client is not None else ""

    async def _session(self) -> None:
        """One connection's worth: the kubeconfig read again, (list if needed and) watch until it
        ends. Raises on failure.

        Read at every session, as client-go reads a `tokenFile` again every minute: a token or
        certificate renewed on disk, or an address edited, takes effect at the next watch (every
        few minutes) or the next try after a failure (a 401 included), never only at a restart."""
        client = await in_daemon_thread(
            lambda: _load_client(self.kubeconfig), on_orphan=_close_client, name="kube-api"
        )
        old, self._client = self._client, client
        if old is not None:
            if _host_of(old) != _host_of(client) and self.resource_version:
                logger.info("Kubernetes API: now {} (was {}): listing again", _host_of(client), _host_of(old))
                self.resource_version = ""  # another server's resourceVersions mean nothing here
            _close_client(old)  # a post in flight on it still ends: only its idle connections go
        try:
            if not self.resource_version:
                await self._list()
            await self._watch()
        except _Gone:
            expired, self.resource_version = self.resource_version, ""
            self._gones += 1
            if self._gones < GONE_STREAK:
                logger.info("resourceVersion {} expired (410 Gone): listing again", expired or "-")
                return
            # even a fresh list's resourceVersion is refused (an API server whose watch cache lags
            # the one that listed). Each list is still the truth, so no problem: only lists
            # spaced out with back-off, so as not to hammer the API server.
            delay = min(self.backoff_max, self.backoff * 2 ** (self._gones - GONE_STREAK))
            say = logger.warning if self._gones == GONE_STREAK else logger.debug
            say(
                "Kubernetes API {}: 410 Gone right after each list ({} in a row); listing again in {:.1f} s",
                self._host(),
                self._gones,
                delay,
            )
            await asyncio.sleep(delay)

    async def _list(self) -> None:
        pods: list[Any] = []
        cont = ""
        while True:
            page = await in_daemon_thread(functools.partial(self._get_list, cont), name="kube-api")
            items = page.get("items")
            meta = page.get("metadata")
            if not isinstance(items, list) or not isinstance(meta, dict):
                raise ApiError("the pod list has no items or metadata")
            pods.extend(items)
            cont = meta.get("continue") or ""
            if not cont:
                break
        rv = meta.get("resourceVersion")
        if not isinstance(rv, str) or not rv:
            raise ApiError("the pod list has no resourceVersion")
        changed = False
        listed = set()
        known = self.state.api_views()
        for pod in pods:
            fields = _pod_fields(pod)
            if fields is None:
                continue
            uid, key, labels, annotations, pod_rv = fields
            listed.add(uid)
            changed |= self._apply(uid, key, labels, annotations, pod_rv, uid in known)
        for uid in set(known) - listed:
            changed |= self.state.forget_api_view(uid)
        self.resource_version = rv
        self.lists += 1
        logger.info(
            "Kubernetes API: {} pods on node {} at resourceVersion {}", len(listed), self.node_name, rv
        )
        self._set_problem(None)
        self._check_node()
        if changed:
            self.on_change()

    def _get_list(self, cont: str) -> Any:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        api: Any = client.CoreV1Api(self._client)  # Any: called for the raw urllib3 response
        try:
            response = api.list_pod_for_all_namespaces(
                field_selector=self.field_selector,
                limit=LIST_PAGE,
                _continue=cont or None,
                _preload_content=False,
                _request_timeout=(CONNECT_TIMEOUT, LIST_TIMEOUT),
            )
        except ApiException as exc:
            if exc.status == 410:
                raise _Gone() from exc
            raise
        try:
            return json.loads(response.data)
        except ValueError as exc:
            raise ApiError(f"the pod list is not JSON: {exc}") from None
        finally:
            response.release_conn()

    def _open_watch(self, rv: str) -> Any:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        api: Any = client.CoreV1Api(self._client)  # Any: called for the raw urllib3 response
        seconds = self.watch_seconds + random.randint(0, max(self.watch_seconds // 5, 0))
        try:
            return api.list_pod_for_all_namespaces(
                field_selector=self.field_selector,
                watch=True,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=seconds,
                _preload_content=False,
                _request_timeout=(CONNECT_TIMEOUT, seconds + 30),
            )
        except ApiException as exc:
            if exc.status == 410:
                raise _Gone() from exc
            raise

    async def _watch(self) -> None:
        rv = self.resource_version
        response = await in_daemon_thread(
            lambda: self._open_watch(rv), on_orphan=_close_response, name="kube-api"
        )
        self._response = response
        self.watches += 1
        self._set_problem(None)
        began, handled = time.monotonic(), 0
        # "at once": well before the time-out asked, which the server counts from before `began`
        at_once = min(1.0, self.watch_seconds / 2)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str | None, BaseException | None]] = asyncio.Queue()

        def put(item: tuple[str | None, BaseException | None]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def pump() -> None:
            try:
                for line in _lines(response):
                    put((line, None))
            except BaseException as exc:
                put((None, exc))
                return
            put((None, None))

        threading.Thread(target=pump, name="kube-api-watch", daemon=True).start()
        try:
            while True:
                line, error = await queue.get()
                if line is None:
                    if error is not None:
                        if handled == 0 and time.monotonic() - began < at_once:
                            raise error
                        logger.info(
                            "watch connection dropped ({}); resuming from resourceVersion {}",
                            describe(error),
                            self.resource_version,
                        )
                    elif handled == 0 and time.monotonic() - began < at_once:
                        raise ApiError("the watch ended at once")
                    else:
                        self._progress()  # the server's time-out: this resourceVersion held
                        self._check_node()  # pods the runtime started since the list
                    return
                if line.strip():
                    self._event(line)
                    handled += 1
        finally:
            self._response = None
            _close_response(response)

    # -- events -------------------------------------------------------------------------------
    def _event(self, line: str) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            logger.warning("Kubernetes API watch: not a JSON event: {!r}", line[:200])
            return
        if not isinstance(event, dict):
            return
        kind, obj = event.get("type"), event.get("object")
        if kind == "ERROR":
            code = obj.get("code") if isinstance(obj, dict) else None
            if code == 410:
                raise _Gone()
            message = obj.get("message") if isinstance(obj, dict) else None
            raise ApiError(f"watch error {code}: {message}")
        self.events += 1
        self._progress()
        if kind == "BOOKMARK":
            meta = obj.get("metadata") if isinstance(obj, dict) else None
            rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
            if isinstance(rv, str) and rv:
                self.resource_version = rv
            return
        fields = _pod_fields(obj)
        if fields is None:
            return
        uid, key, labels, annotations, rv = fields
        if kind in ("ADDED", "MODIFIED"):
            changed = self._apply(uid, key, labels, annotations, rv, uid in self.state.api_views())
        elif kind == "DELETED":
            changed = self.state.forget_api_view(uid)
            if changed:
                logger.info("pod {} deleted in the Kubernetes API: CRI values again", key)
        else:
            return
        if rv:
            self.resource_version = rv
        if changed:
            self.on_change()

    def _progress(self) -> None:
        """The watch works: a streak of 410s is over."""
        if self._gones >= GONE_STREAK:
            logger.info(
                "Kubernetes API {}: watching again after {} times 410 Gone", self._host(), self._gones
            )
        self._gones = 0

    def _apply(
        self, uid: str, key: str, labels: dict[str, str], annotations: dict[str, str], rv: str, known: bool
    ) -> bool:
        changed = self.state.set_api_view(uid, labels, annotations, rv)
        if changed and known:
            logger.info("pod {}: QoS label or allocation changed in the Kubernetes API", key)
        return changed


def _lines(response: Any) -> Iterator[str]:
    """The watch body, one event a line, as the chunks arrive."""
    from kubernetes.watch import watch

    lines: Iterator[str] = watch.iter_resp_lines(response)  # type: ignore[no-untyped-call]
    yield from lines
