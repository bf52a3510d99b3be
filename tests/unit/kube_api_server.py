"""A Kubernetes API server for the tests: the pods list/watch protocol, served from memory.

Real HTTP/1.1 on 127.0.0.1 (ThreadingHTTPServer), so the proxy's real `kubernetes` client talks to
it through a kubeconfig file (`kubeconfig(path)`). What it speaks:

- `GET /api/v1/pods?fieldSelector=spec.nodeName=<node>`: a PodList of the pods bound to that node,
  `metadata.resourceVersion` the current one;
- `...&watch=true&resourceVersion=N`: chunked transfer encoding, one JSON event a line, first every
  event after N (from the history kept), then each new one as it happens; `allowWatchBookmarks`
  honoured by `bookmark()`; a watch from a resourceVersion older than the last `expire()` gets
  an ERROR event with code 410 (or, after `gone_http_next()`, an HTTP 410 answer);
- `expire()` also ends the open watches with that ERROR 410; `drop_watches()` cuts them in the
  middle of a chunk; `stop()` takes the whole server down (connections cut, port closed) and
  `start()` brings it back on the same port.

`requests` records every request (`kind` "list" or "watch", the query parameters, the
Authorization header) for the tests to assert on. `tokens`, when set, are the bearer tokens it
takes: any other request is answered 401 Unauthorized, as an API server answers an expired token.

Events: `POST /api/v1/namespaces/<ns>/events` creates one (409 when its name exists),
`PATCH /api/v1/namespaces/<ns>/events/<name>` merges a patch into it (404 when absent); `events`
holds them by (namespace, name) and `event_requests` records ("create" | "patch", ns, name, body).
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

TRUE = ("true", "1")


@dataclass
class Request:
    kind: str  # "list" | "watch" | "other"
    params: dict[str, str]
    authorization: str = ""
    status: int = 200


@dataclass(eq=False)
class _Watch:
    drop: bool = False
    gone: bool = False


@dataclass
class _Event:
    rv: int
    type: str
    object: dict[str, Any]
    node: str | None = field(default=None)  # None: for every watch (bookmarks)


class KubeApiServer:
    def __init__(self, node: str = "node-1", port: int = 0) -> None:
        self.node = node
        self.port = port
        self.requests: list[Request] = []
        self._cond = threading.Condition()
        self._rv = 1000
        self._pods: dict[str, dict[str, Any]] = {}
        self._history: list[_Event] = []
        self._oldest = 0  # a watch from below this resourceVersion is 410 Gone
        self._gone_http = 0
        self._watches: set[_Watch] = set()
        self._conns: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.tokens: set[str] | None = None  # None: any Authorization (or none) goes
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self.event_requests: list[tuple[str, str, str, dict[str, Any]]] = []

    # -- life ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._httpd is not None

    def start(self) -> KubeApiServer:
        server = self

        class Handler(_Handler):
            api = server

        httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        httpd.daemon_threads = True
        self.port = httpd.server_address[1]
        self._stopping = False
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Down: no more connections, the open ones cut."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            conns = list(self._conns)
        httpd.shutdown()
        httpd.server_close()
        for conn in conns:
            _cut(conn)
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> KubeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kubeconfig(self, path: Path, token_file: Path | None = None) -> Path:
        """A kubeconfig (JSON is YAML) pointing at this server, with a bearer token (inline, or
        `tokenFile` naming `token_file`)."""
        user = {"tokenFile": str(token_file)} if token_file is not None else {"token": "test-token"}
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "test", "cluster": {"server": self.url}}],
                    "users": [{"name": "test", "user": user}],
                    "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
                    "current-context": "test",
                }
            )
        )
        return path

    # -- the pods -----------------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        return self._rv

    def put_pod(
        self,
        name: str,
        uid: str | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        *,
        namespace: str = "default",
        node: str | None = None,
        emit: bool = True,
    ) -> dict[str, Any]:
        """Create or replace a pod (ADDED / MODIFIED). `emit=False`: change it without an event, as
        if the event had been lost to compaction (only a re-list sees it)."""
        uid = uid or f"uid-{name}"
        with self._cond:
            self._rv += 1
            kind = "MODIFIED" if uid in self._pods else "ADDED"
            pod = {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": uid,
                    "resourceVersion": str(self._rv),
                    "labels": dict(labels or {}),
                    "annotations": dict(annotations or {}),
                },
                "spec": {"nodeName": node or self.node, "containers": [{"name": "main", "image": "busybox"}]},
                "status": {"phase": "Running"},
            }
            self._pods[uid] = pod
            if emit:
                self._history.append(_Event(self._rv, kind, copy.deepcopy(pod), node or self.node))
            self._cond.notify_all()
            return pod

    def pods_on(self, node: str) -> dict[str, str]:
        """uid -> resourceVersion of the pods bound to `node` now."""
        with self._cond:
            return {
                uid: p["metadata"]["resourceVersion"]
                for uid, p in self._pods.items()
                if p["spec"]["nodeName"] == node
            }

    def annotate(self, uid: str, annotations: dict[str, str], *, emit: bool = True) -> None:
        """Replace a pod's annotations (a MODIFIED event)."""
        meta = self._pods[uid]["metadata"]
        self.put_pod(
            meta["name"],
            uid,
            meta["labels"],
            annotations,
            namespace=meta["namespace"],
            node=self._pods[uid]["spec"]["nodeName"],
            emit=emit,
        )

    def label(self, uid: str, labels: dict[str, str], *, emit: bool = True) -> None:
        """Replace a pod's labels (a MODIFIED event; `emit=False` as for `put_pod`)."""
        meta = self._pods[uid]["metadata"]
        self.put_pod(
            meta["name"],
            uid,
            labels,
            meta["annotations"],
            namespace=meta["namespace"],
            node=self._pods[uid]["spec"]["nodeName"],
            emit=emit,
        )

    def pod(self, uid: str) -> dict[str, Any] | None:
        """A copy of pod `uid` as the API holds it now; None when there is none."""
        with self._cond:
            pod = self._pods.get(uid)
            return copy.deepcopy(pod) if pod is not None else None

    def delete_pod(self, uid: str, *, emit: bool = True) -> None:
        """DELETED; `emit=False`: without the event, as if lost to compaction."""
        with self._cond:
            pod = self._pods.pop(uid)
            self._rv += 1
            pod["metadata"]["resourceVersion"] = str(self._rv)
            if emit:
                self._history.append(_Event(self._rv, "DELETED", pod, pod["spec"]["nodeName"]))
            self._cond.notify_all()

    def bookmark(self) -> int:
        """A BOOKMARK event at the current resourceVersion to the watches that asked for them."""
        with self._cond:
            obj = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(self._rv)}}
            self._history.append(_Event(self._rv, "BOOKMARK", obj))
            self._cond.notify_all()
            return self._rv

    # -- faults -------------------------------------------------------------------------------
    def expire(self) -> None:
        """Compaction: every resourceVersion so far is too old; open watches get ERROR 410."""
        with self._cond:
            self._oldest = self._rv  # only the current resourceVersion is still good
            self._history.clear()
            for w in self._watches:
                w.gone = True
            self._cond.notify_all()

    def gone_http_next(self) -> None:
        """The next watch request is answered HTTP 410 instead of opening."""
        with self._cond:
            self._gone_http += 1

    def fault(self, name: str) -> None:
        """A fault by name, for the tests' random steps: "drop" (`drop_watches`), "expire",
        "gone-http" (`gone_http_next`), "bookmark", "down" (`stop`), "up" (`start` on the port
        it had, when down)."""
        if name == "up":
            if not self.running:
                self.start()
            return
        faults = {
            "drop": self.drop_watches,
            "expire": self.expire,
            "gone-http": self.gone_http_next,
            "bookmark": self.bookmark,
            "down": self.stop,
        }
        faults[name]()

    def drop_watches(self) -> int:
        """Cut every open watch in the middle of a chunk; how many were open."""
        with self._cond:
            for w in self._watches:
                w.drop = True
            self._cond.notify_all()
            return len(self._watches)

    @property
    def open_watches(self) -> int:
        with self._cond:
            return len(self._watches)

    def watch_requests(self) -> list[Request]:
        return [r for r in list(self.requests) if r.kind == "watch"]

    def list_requests(self) -> list[Request]:
        return [r for r in list(self.requests) if r.kind == "list"]


def _cut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    api: KubeApiServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.api._cond:
            self.api._conns.add(self.connection)

    def finish(self) -> None:
        with self.api._cond:
            self.api._conns.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def _json(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        loaded: dict[str, Any] = json.loads(self.rfile.read(length) or b"{}")
        return loaded

    def _unauthorized(self) -> bool:
        """Answered 401 when `tokens` are set and this request's bearer token is not one of them."""
        tokens = self.api.tokens
        given = self.headers.get("Authorization", "")
        if tokens is None or given.removeprefix("Bearer ") in tokens:
            return False
        self._json(401, _status(401, "Unauthorized", "Unauthorized"))
        return True

    def _event_path(self) -> tuple[str, str] | None:
        parts = urlsplit(self.path).path.strip("/").split("/")
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) in (5, 6) and parts[4] == "events":
            return parts[3], parts[5] if len(parts) == 6 else ""
        return None

    def do_POST(self) -> None:
        api, where, body = self.api, self._event_path(), self._body()
        if self._unauthorized():
            return
        if where is None or where[1]:
            self._json(404, _status(404, "NotFound", f"{self.path} not found"))
            return
        ns, name = where[0], str(body.get("metadata", {}).get("name", ""))
        with api._cond:
            api.event_requests.append(("create", ns, name, body))
            if (ns, name) in api.events:
                self._json(409, _status(409, "AlreadyExists", f"events {name!r} already exists"))
                return
            api.events[(ns, name)] = body
        self._json(201, body)

    def do_PATCH(self) -> None:
        api, where, body = self.api, self._event_path(), self._body()
        if self._unauthorized():
            return
        if where is None or not where[1]:
            self._json(404, _status(404, "NotFound", f"{self.path} not found"))
            return
        with api._cond:
            api.event_requests.append(("patch", where[0], where[1], body))
            found = api.events.get(where)
            if found is None:
                self._json(404, _status(404, "NotFound", f"events {where[1]!r} not found"))
                return
            found.update(body)
        self._json(200, found)

    def do_GET(self) -> None:
        api = self.api
        url = urlsplit(self.path)
        params = {k: v[-1] for k, v in parse_qs(url.query).items()}
        watch = params.get("watch", "").lower() in TRUE
        request = Request("watch" if watch else "list", params, self.headers.get("Authorization", ""))
        if url.path != "/api/v1/pods":
            request.kind, request.status = "other", 404
            api.requests.append(request)
            self._json(404, _status(404, "NotFound", f"{url.path} not found"))
            return
        api.requests.append(request)
        if self._unauthorized():
            request.status = 401
            return
        node = None
        selector = params.get("fieldSelector", "")
        if selector:
            key, _, value = selector.partition("=")
            if key != "spec.nodeName":
                request.status = 400
                self._json(400, _status(400, "BadRequest", f"unsupported field selector {selector}"))
                return
            node = value
        if watch:
            self._watch(request, node)
        else:
            with api._cond:
                items = [
                    copy.deepcopy(p)
                    for p in api._pods.values()
                    if node is None or p["spec"]["nodeName"] == node
                ]
                rv = api._rv
            self._json(
                200,
                {
                    "kind": "PodList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(rv)},
                    "items": items,
                },
            )

    def _chunk(self, event: dict[str, Any]) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _watch(self, request: Request, node: str | None) -> None:
        api = self.api
        try:
            since = int(request.params.get("resourceVersion") or api._rv)
        except ValueError:
            request.status = 400
            self._json(400, _status(400, "BadRequest", "resourceVersion is not a number"))
            return
        bookmarks = request.params.get("allowWatchBookmarks", "").lower() in TRUE
        timeout = float(request.params.get("timeoutSeconds") or 1800)
        with api._cond:
            if api._gone_http:
                api._gone_http -= 1
                request.status = 410
                self._json(410, _status(410, "Expired", f"too old resource version: {since}"))
                return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        me = _Watch()
        with api._cond:
            gone = since < api._oldest
            if not gone:
                api._watches.add(me)
            cursor = next((i for i, e in enumerate(api._history) if e.rv > since), len(api._history))
        try:
            if gone:
                self._chunk(
                    {"type": "ERROR", "object": _status(410, "Expired", f"too old resource version: {since}")}
                )
                self.wfile.write(b"0\r\n\r\n")
                return
            deadline = time.monotonic() + timeout
            while True:
                with api._cond:
                    while True:
                        pending = api._history[cursor:]
                        if pending or me.drop or me.gone or api._stopping or time.monotonic() >= deadline:
                            break
                        api._cond.wait(min(0.5, max(0.0, deadline - time.monotonic())))
                    drop, gone, stopping = me.drop, me.gone, api._stopping
                    cursor += len(pending)
                if drop:
                    self.wfile.write(b"%x\r\n" % 200 + b'{"type":"MODIFIED","obj')  # half a chunk, then cut
                    self.wfile.flush()
                    _cut(self.connection)
                    return
                if stopping:
                    _cut(self.connection)
                    return
                for e in pending:
                    if e.type == "BOOKMARK":
                        if bookmarks:
                            self._chunk({"type": "BOOKMARK", "object": e.object})
                    elif node is None or e.node == node:
                        self._chunk({"type": e.type, "object": e.object})
                if gone:
                    self._chunk(
                        {
                            "type": "ERROR",
                            "object": _status(410, "Expired", "the watch's history was compacted"),
                        }
                    )
                    self.wfile.write(b"0\r\n\r\n")
                    return
                if time.monotonic() >= deadline:
                    self.wfile.write(b"0\r\n\r\n")
                    return
        except OSError:
            return
        finally:
            with api._cond:
                api._watches.discard(me)
