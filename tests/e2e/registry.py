"""A read-only image registry on 127.0.0.1: image pulls for a test bed that has no network.

critest pulls its images from registry.k8s.io and gcr.io. Here each of those names is served as a
small image of Debian's static busybox (`tests/e2e/containerd.py: busybox_image`) that does what the
specs ask of the original: a shell and its tools; a user or group set in the image; a file that
tells apart the images of different tags; a web server answering 200 on the port the spec dials
(busybox `httpd`). containerd is pointed at it through its registry hosts folder (`hosts_dir`),
so a pull goes the whole way: resolve, manifest, config and layer, unpacked by the snapshotter.

Not served, so their specs fail at the pull on both paths alike: an image pinned by a digest no
local build can give (`test-image-digest@sha256:...`) and those whose program busybox cannot stand
in for (`nonewprivs`, the AppArmor and seccomp helpers).

    registry = Registry(critest_images()); registry.start(); registry.hosts_dir(path)

The protocol is the distribution API's read side: `GET /v2/`, `GET|HEAD /v2/<name>/manifests/<tag or
digest>` and `GET|HEAD /v2/<name>/blobs/<digest>`; anything else is 404 with the API's error body.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

from containerd import MANIFEST_TYPE, ROOT_GROUPS, ROOT_USERS, ImageBlobs, busybox_image

E2E = "registry.k8s.io/e2e-test-images/"
TOOLS = "gcr.io/k8s-staging-cri-tools/"
# busybox's own accounts, as in the images critest's test images start from
USERS = (*ROOT_USERS, "www-data:x:33:33:www-data:/var/www:/bin/false")
GROUPS = (*ROOT_GROUPS, "www-data:x:33:")
PAGE = {"www/index.html": b"<html><body>cri-proxy conformance</body></html>\n"}


def _web(port: int, say: str = "") -> ImageBlobs:
    serve = f"exec httpd -f -v -p {port} -h /www"
    return busybox_image(
        cmd=("sh", "-c", f"echo {say}; {serve}" if say else serve),
        stop_signal="",
        users=USERS,
        groups=GROUPS,
        files=PAGE,
    )


def _shell(
    user: str = "", mark: str = "", users: Iterable[str] = USERS, groups: Iterable[str] = GROUPS
) -> ImageBlobs:
    """busybox's shell as the image's command (the specs give their own), run as `user`; `mark`: a
    file of that name, so that images of different tags differ."""
    files = {mark: b""} if mark else None
    return busybox_image(cmd=("sh",), user=user, stop_signal="", users=users, groups=groups, files=files)


def critest_images() -> dict[str, ImageBlobs]:
    """Each name critest (1.26 to 1.36) pulls and busybox can stand in for, with its image."""
    shell = _shell()
    pause = busybox_image(cmd=("sleep", "inf"), users=USERS, groups=GROUPS)
    images = {
        E2E + "busybox:1.29-2": shell,
        E2E + "busybox:1.29-4": shell,
        E2E + "nginx:1.14-2": _web(80),
        E2E + "nginx:1.15-4": _web(80),
        E2E + "httpd:2.4.39-4": _web(80, "httpd"),
        TOOLS + "hostnet-nginx-amd64:latest": _web(12003),
        "registry.k8s.io/pause:3.9": pause,
        "k8s.gcr.io/pause:3.9": pause,
        "gcr.io/pause:3.9": pause,
        TOOLS + "test-image-latest:latest": _shell(mark="latest"),
        TOOLS + "test-image-predefined-group:latest": _shell(
            "1000",
            users=(*USERS, "default-user:x:1000:1000::/home/default-user:/bin/sh"),
            groups=(*GROUPS, "default-user:x:1000:", "group-defined-in-image:x:50000:default-user"),
        ),
    }
    for tag in ("test", "all"):
        images[f"{TOOLS}test-image-tag:{tag}"] = _shell(mark=tag)
    same = _shell(mark="tags")
    for n in (1, 2, 3):
        images[f"{TOOLS}test-image-{n}:latest"] = _shell(mark=f"test-image-{n}")
        images[f"{TOOLS}test-image-tags:{n}"] = same
    for name, user in (
        ("user-uid", "1002"),
        ("user-username", "www-data"),
        ("user-uid-group", "1003:1004"),
        ("user-username-group", "www-data:1004"),
    ):
        images[f"{TOOLS}test-image-{name}:latest"] = _shell(user)
    return images


def pull_images() -> dict[str, ImageBlobs]:
    """A few of `critest_images`, for the end-to-end tests' pulls: a shell image and one whose user
    is set by name."""
    return {E2E + "busybox:1.29-2": _shell(), TOOLS + "test-image-user-username:latest": _shell("www-data")}


class Registry:
    """`images` (full name with tag -> blobs) served on 127.0.0.1 from a thread."""

    def __init__(self, images: Mapping[str, ImageBlobs]) -> None:
        self.hosts = sorted({name.split("/", 1)[0] for name in images})
        self.manifests: dict[tuple[str, str], ImageBlobs] = {}
        self.blobs: dict[str, bytes] = {}
        for name, image in images.items():
            repo, tag = name.split("/", 1)[1].rsplit(":", 1)
            self.manifests[(repo, tag)] = image
            self.manifests[(repo, image.digest)] = image
            self.blobs.update(image.blobs())
        self.server: ThreadingHTTPServer | None = None
        self.pulls: list[str] = []  # "GET /v2/...": what was asked, for the log
        self.delays: dict[str, float] = {}  # blob digest -> seconds its GET waits (a slow pull)

    @property
    def address(self) -> str:
        assert self.server is not None, "not started"
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Registry:
        registry = self

        class Handler(_Handler):
            served: ClassVar[Registry] = registry

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="registry", daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def hosts_dir(self, path: Path) -> Path:
        """containerd's registry hosts folder (`config_path`): each registry served goes here."""
        at = self.address
        for host in self.hosts:
            (path / host).mkdir(parents=True, exist_ok=True)
            (path / host / "hosts.toml").write_text(
                f'server = "{at}"\n\n[host."{at}"]\n  capabilities = ["pull", "resolve"]\n'
            )
        return path


_PATH = re.compile(r"^/v2/(?P<repo>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)$")


class _Handler(BaseHTTPRequestHandler):
    served: ClassVar[Registry]
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        self.served.pulls.append(f"{self.command} {path}")
        if path in ("/v2/", "/v2"):
            return self._send(200, b"{}", "application/json", body)
        m = _PATH.match(path)
        if m is None:
            return self._unknown("NAME_UNKNOWN", path, body)
        repo, kind, ref = m.group("repo", "kind", "ref")
        if kind == "manifests":
            image = self.served.manifests.get((repo, ref))
            if image is None:
                return self._unknown("MANIFEST_UNKNOWN", f"{repo}:{ref}", body)
            return self._send(200, image.manifest, MANIFEST_TYPE, body, image.digest)
        blob = self.served.blobs.get(ref)
        if blob is None:
            return self._unknown("BLOB_UNKNOWN", ref, body)
        if body and ref in self.served.delays:
            time.sleep(self.served.delays[ref])
        return self._send(200, blob, "application/octet-stream", body, ref)

    def _unknown(self, code: str, what: str, body: bool) -> None:
        error = {"errors": [{"code": code, "message": f"{what} is not served here", "detail": what}]}
        self._send(404, json.dumps(error).encode(), "application/json", body)

    def _send(self, status: int, data: bytes, kind: str, body: bool, digest: str = "") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        if digest:
            self.send_header("Docker-Content-Digest", digest)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass  # `Registry.pulls` keeps what was asked
