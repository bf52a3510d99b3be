"""End-to-end test bed: a private containerd with locally built images.

No public registry is reachable from the test machines, and the system containerd (if any) must not
be touched, so this module builds its own OCI images from Debian's static busybox and runs a containerd
whose every path (root, state, sockets, runc root, CNI dirs) lives under one temporary directory.
Images are imported; pulls go, when `registry_hosts` says so, to a local registry (`registry.py`).

Importable without pytest: ``with PrivateContainerd() as ctrd: ...`` works from a plain script too.
Facts behind the settings: the project spec shared/spec/containerd-e2e.md.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import importlib
import io
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import ModuleType, TracebackType
from typing import Any

import grpc

from tests.protowire import length_field

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE_DIR = REPO_ROOT / ".e2e-cache"
SETUP_SCRIPT = REPO_ROOT / "scripts" / "setup-e2e"

#: The one local image: test containers run it, and it is the sandbox ("pause") image too.
IMAGE = "localhost/busybox:latest"
PAUSE_IMAGE = IMAGE
BUSYBOX = Path("/bin/busybox")
CRI_NAMESPACE = "k8s.io"

# Bump when the image layout below changes, so cached tarballs are rebuilt.
_IMAGE_FORMAT = "1"
# Fixed timestamps keep the tarballs (and so the image digests) reproducible.
_EPOCH = 946684800  # 2000-01-01
_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_MT_INDEX = "application/vnd.oci.image.index.v1+json"
_MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_MT_CONFIG = "application/vnd.oci.image.config.v1+json"
_MT_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}


class E2EError(RuntimeError):
    """The test bed could not be set up; the message says what to look at."""


# ---------------------------------------------------------------------------------------------------
# Prerequisites
# ---------------------------------------------------------------------------------------------------


def missing_tools() -> list[str]:
    """Name what the test bed needs but the machine lacks (empty when all is there)."""
    missing = [tool for tool in ("containerd", "ctr", "runc") if shutil.which(tool) is None]
    if not _is_static_busybox(BUSYBOX):
        missing.append(f"{BUSYBOX} (static, package busybox-static)")
    return missing


def _is_static_busybox(path: Path) -> bool:
    """A dynamically linked busybox would not run inside the image, which has no libc."""
    try:
        with path.open("rb") as f:
            elf = f.read(1 << 16)
    except OSError:
        return False
    return elf.startswith(b"\x7fELF") and b"ld-linux" not in elf and b"ld-musl" not in elf


def run_setup_script(timeout: float = 900.0) -> None:
    """Install containerd, runc and busybox-static with the repo's own script (fresh CI machines)."""
    proc = subprocess.run([str(SETUP_SCRIPT)], capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise E2EError(f"{SETUP_SCRIPT} failed with exit code {proc.returncode}:\n{tail}")


# ---------------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _tar_add(
    tar: tarfile.TarFile,
    name: str,
    *,
    data: bytes | None = None,
    mode: int = 0o755,
    kind: bytes = tarfile.DIRTYPE,
    linkname: str = "",
) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.mtime = _EPOCH
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.linkname = linkname
    if data is not None:
        info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


ROOT_USERS = ("root:x:0:0:root:/root:/bin/sh", "nobody:x:65534:65534:nobody:/nonexistent:/bin/false")
ROOT_GROUPS = ("root:x:0:", "nogroup:x:65534:")


def _busybox_rootfs(
    busybox: bytes,
    applets: Iterable[str],
    *,
    users: Iterable[str] = ROOT_USERS,
    groups: Iterable[str] = ROOT_GROUPS,
    files: Mapping[str, bytes] | None = None,
) -> bytes:
    """A minimal rootfs (a tar): /bin/busybox, a link per applet in /bin, `users` in /etc/passwd and
    `groups` in /etc/group (lines), and `files` (path -> content, their folders made)."""
    buf = io.BytesIO()
    dirs = ["bin", "dev", "etc", "proc", "root", "sys", "usr", "usr/bin", "var"]
    folders = {str(d) for path in files or {} for d in PurePosixPath(path.strip("/")).parents}
    dirs += sorted(folders - {".", *dirs})  # a folder sorts before what is in it
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in dirs:
            _tar_add(tar, d)
        _tar_add(tar, "tmp", mode=0o1777)
        _tar_add(tar, "bin/busybox", data=busybox, kind=tarfile.REGTYPE)
        for applet in sorted(set(applets) - {"busybox"}):
            _tar_add(tar, f"bin/{applet}", kind=tarfile.SYMTYPE, mode=0o777, linkname="busybox")
        for name, lines in (("passwd", users), ("group", groups)):
            text = "".join(f"{line}\n" for line in lines).encode()
            _tar_add(tar, f"etc/{name}", kind=tarfile.REGTYPE, mode=0o644, data=text)
        for path, data in (files or {}).items():
            _tar_add(tar, path.strip("/"), kind=tarfile.REGTYPE, mode=0o644, data=data)
    return buf.getvalue()


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class ImageBlobs:
    """One image's blobs, as an image layout or a registry holds them: its config, its one layer
    (gzip) and the manifest naming both."""

    config: bytes
    layer: bytes
    manifest: bytes
    arch: str

    @property
    def digest(self) -> str:
        """The manifest's digest: what the image is pulled by."""
        return _sha256(self.manifest)

    @property
    def image_id(self) -> str:
        """The config's digest: the id a runtime gives the image once pulled."""
        return _sha256(self.config)

    def blobs(self) -> dict[str, bytes]:
        """Every blob by its digest."""
        return {_sha256(blob): blob for blob in (self.config, self.layer, self.manifest)}


MANIFEST_TYPE = _MT_MANIFEST


@functools.cache
def _busybox(busybox: Path) -> tuple[bytes, tuple[str, ...]]:
    """The binary and its applets, read once however many images are made of it (a registry's)."""
    applets = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True).stdout
    return busybox.read_bytes(), tuple(applets.split())


def busybox_image(
    busybox: Path = BUSYBOX,
    *,
    cmd: Iterable[str] = ("sleep", "inf"),
    user: str = "",
    stop_signal: str = "SIGKILL",
    users: Iterable[str] = ROOT_USERS,
    groups: Iterable[str] = ROOT_GROUPS,
    files: Mapping[str, bytes] | None = None,
) -> ImageBlobs:
    """An image of Debian's static busybox (`_busybox_rootfs`) that runs `cmd` as `user` (empty: the
    image's default, root); `stop_signal` empty: the runtime's default, SIGTERM."""
    binary, applets = _busybox(busybox)
    layer_tar = _busybox_rootfs(binary, applets, users=users, groups=groups, files=files)
    layer = gzip.compress(layer_tar, compresslevel=6, mtime=0)
    arch = _GOARCH.get(platform.machine(), platform.machine())
    settings: dict[str, object] = {"Env": [_PATH_ENV], "Cmd": list(cmd), "WorkingDir": "/"}
    if user:
        settings["User"] = user
    if stop_signal:
        settings["StopSignal"] = stop_signal
    config = _json(
        {
            "architecture": arch,
            "os": "linux",
            "config": settings,
            "rootfs": {"type": "layers", "diff_ids": [_sha256(layer_tar)]},
            "history": [{"created_by": "cri-proxy tests/e2e/containerd.py: Debian static busybox"}],
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": _MT_MANIFEST,
            "config": {"mediaType": _MT_CONFIG, "digest": _sha256(config), "size": len(config)},
            "layers": [{"mediaType": _MT_LAYER, "digest": _sha256(layer), "size": len(layer)}],
        }
    )
    return ImageBlobs(config, layer, manifest, arch)


def build_busybox_image(
    cache_dir: Path = DEFAULT_CACHE_DIR, *, name: str = IMAGE, busybox: Path = BUSYBOX
) -> Path:
    """Build (or reuse from the cache) an OCI image-layout tarball of busybox, named ``name``.

    Its default command sleeps forever, so it also serves as the sandbox image. Its stop signal is
    SIGKILL: ``sleep`` as PID 1 ignores SIGTERM, and a StopContainer would otherwise wait out its whole
    grace period.
    """
    if ":" not in name.rsplit("/", 1)[-1]:
        raise ValueError(f"image name needs a tag: {name!r}")
    binary = _busybox(busybox)[0]
    key = hashlib.sha256(f"{_IMAGE_FORMAT}\0{name}\0".encode() + binary).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    out = cache_dir / f"{slug}-{key}.oci.tar"
    if out.exists():
        return out

    image = busybox_image(busybox)
    manifest = image.manifest
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": _MT_INDEX,
            "manifests": [
                {
                    "mediaType": _MT_MANIFEST,
                    "digest": image.digest,
                    "size": len(manifest),
                    "platform": {"architecture": image.arch, "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                    },
                }
            ],
        }
    )

    cache_dir.mkdir(parents=True, exist_ok=True)
    # Write beside the target and rename: sessions running side by side may build at the same time.
    fd, tmp = tempfile.mkstemp(prefix=f".{slug}-", suffix=".tmp", dir=cache_dir)
    try:
        with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
            _tar_add(tar, "blobs")
            _tar_add(tar, "blobs/sha256")
            for blob in (image.config, image.layer, manifest):
                _tar_add(
                    tar,
                    "blobs/sha256/" + hashlib.sha256(blob).hexdigest(),
                    data=blob,
                    kind=tarfile.REGTYPE,
                    mode=0o644,
                )
            _tar_add(
                tar, "oci-layout", data=b'{"imageLayoutVersion":"1.0.0"}', kind=tarfile.REGTYPE, mode=0o644
            )
            _tar_add(tar, "index.json", data=index, kind=tarfile.REGTYPE, mode=0o644)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return out


# ---------------------------------------------------------------------------------------------------
# Mounts and cgroups
# ---------------------------------------------------------------------------------------------------


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mountinfo() -> Iterator[tuple[str, str, list[str]]]:
    """Yield (mount point, fs type, super options) for this process's mount namespace."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) >= 5 and len(rfields) >= 3:
                yield _unescape(fields[4]), rfields[0], rfields[2].split(",")


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path``, deepest first (the order to unmount them in)."""
    root = str(path)
    found = {Path(mp) for mp, _, _ in _mountinfo() if mp == root or mp.startswith(root + "/")}
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def cgroup_mounts() -> list[Path]:
    """Every cgroup (v1 and v2) hierarchy mounted on this machine."""
    return sorted({Path(mp) for mp, fstype, _ in _mountinfo() if fstype in ("cgroup", "cgroup2")})


def cgroup_controller_root(controller: str) -> Path:
    """Where a controller's hierarchy is mounted: the v1 mount carrying it, else the v2 root.

    On cgroup v1 the cpuset controller is usually at /sys/fs/cgroup/cpuset, but mounts may combine
    controllers (``cpu,cpuacct``) or live elsewhere, so read it from mountinfo.
    """
    v2: Path | None = None
    for mp, fstype, opts in _mountinfo():
        if fstype == "cgroup" and controller in opts:
            return Path(mp)
        if fstype == "cgroup2" and v2 is None:
            v2 = Path(mp)
    controllers = v2 / "cgroup.controllers" if v2 is not None else None
    if (
        v2 is not None
        and controllers is not None
        and controllers.exists()
        and controller in controllers.read_text().split()
    ):
        return v2
    fallback = Path("/sys/fs/cgroup") / controller
    if fallback.is_dir():
        return fallback
    raise E2EError(f"no cgroup hierarchy with the {controller} controller is mounted")


def container_cgroup_file(
    cgroup_parent: str, container_id: str, filename: str, controller: str = "cpuset"
) -> Path:
    """The cgroupfs-driver file runc wrote for a container, e.g. its ``cpuset.cpus``."""
    root = cgroup_controller_root(controller)
    return root / cgroup_parent.strip("/") / container_id / filename


def read_container_cpuset(cgroup_parent: str, container_id: str) -> str:
    """The CPUs a container may run on, as applied in its cgroup (e.g. ``"0"`` or ``"0-1"``)."""
    return container_cgroup_file(cgroup_parent, container_id, "cpuset.cpus").read_text().strip()


def _kubepods_dirs() -> set[Path]:
    dirs: set[Path] = set()
    for mount in cgroup_mounts():
        top = mount / "kubepods"
        if top.is_dir():
            dirs.add(top)
            for dirpath, dirnames, _ in os.walk(top):
                dirs.update(Path(dirpath) / d for d in dirnames)
    return dirs


def remove_new_empty_cgroups(preexisting: set[Path]) -> list[Path]:
    """rmdir the empty ``kubepods/...`` cgroups that appeared since ``preexisting``, deepest first.

    runc leaves the pod-level folders behind (kubelet would remove them). rmdir on a cgroup fails when
    it still has children or tasks, so only empty ones go.
    """
    removed: list[Path] = []
    for d in sorted(_kubepods_dirs() - preexisting, key=lambda p: len(p.parts), reverse=True):
        try:
            d.rmdir()
        except OSError:
            continue
        removed.append(d)
    return removed


# ---------------------------------------------------------------------------------------------------
# Raw CRI calls (no generated stubs needed: the harness must work before cri_api exists)
# ---------------------------------------------------------------------------------------------------


def _raw_call(address: str, method: str, request: bytes, timeout: float) -> bytes:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        response: bytes = call(request, timeout=timeout)
        return response


# ---------------------------------------------------------------------------------------------------
# CRI clients on the generated stubs
# ---------------------------------------------------------------------------------------------------

API_VERSIONS = ("v1", "v1alpha2")


def load_api(version: str = "v1") -> tuple[ModuleType, ModuleType]:
    """The generated ``api_pb2`` and ``api_pb2_grpc`` modules of a CRI version (v1 or v1alpha2)."""
    if version not in API_VERSIONS:
        raise ValueError(f"unknown CRI API version {version!r}; expected one of {API_VERSIONS}")
    pb = importlib.import_module(f"cri_api.{version}.api_pb2")
    pb_grpc = importlib.import_module(f"cri_api.{version}.api_pb2_grpc")
    return pb, pb_grpc


@dataclass
class CriClient:
    """A plain sync gRPC client for one CRI version: ``api`` builds messages, the stubs call."""

    version: str
    api: ModuleType
    channel: grpc.Channel
    runtime: Any  # api_pb2_grpc.RuntimeServiceStub
    image: Any  # api_pb2_grpc.ImageServiceStub

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> CriClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(address: str, version: str = "v1") -> CriClient:
    """Open a CRI client on ``address`` (``unix:///path``): containerd's socket or the proxy's."""
    pb, pb_grpc = load_api(version)
    channel = grpc.insecure_channel(address)
    return CriClient(
        version, pb, channel, pb_grpc.RuntimeServiceStub(channel), pb_grpc.ImageServiceStub(channel)
    )


def remove_all_pods(cri: CriClient, timeout: float = 30.0) -> list[str]:
    """Stop and remove every pod sandbox (and so its containers), as kubelet does; return their ids."""
    pb = cri.api
    ids = [item.id for item in cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=timeout).items]
    for pod_id in ids:
        cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=timeout)
        cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=timeout)
    return ids


# ---------------------------------------------------------------------------------------------------
# The private containerd
# ---------------------------------------------------------------------------------------------------


def _config_toml(work: Path, socket_path: Path, registry_hosts: Path | None = None) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    registry = f'\n[{cri}.registry]\n  config_path = "{registry_hosts}"\n' if registry_hosts else ""
    return f"""\
# Written by cri-proxy tests/e2e/containerd.py: a private containerd for the end-to-end tests.
version = 2
root = "{work}/root"
state = "{work}/state"
oom_score = 0

[grpc]
  address = "{socket_path}"

[ttrpc]
  address = "{socket_path}.ttrpc"

[debug]
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{work}/opt"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_tls_streaming = false

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{work}/runc"

[{cri}.cni]
  bin_dir = "{work}/cni/bin"
  conf_dir = "{work}/cni/conf"
{registry}"""


def _dead_port() -> int:
    """A local TCP port nobody listens on: a mistaken image pull through it fails at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class PrivateContainerd:
    """A containerd of our own, every path under ``workdir``, serving CRI on ``address``.

    ``start()`` builds/imports the images and waits until CRI answers; ``stop()`` ends exactly the
    process it started and removes what it left (mounts, work dir, empty kubepods cgroups).
    ``restart()`` (or ``terminate()`` + ``start_daemon()``) keeps the dirs, like a containerd restart on
    a node: running containers survive in their shims.
    """

    def __init__(
        self,
        *,
        cache_dir: Path = DEFAULT_CACHE_DIR,
        tmp_root: str | None = None,
        ready_timeout: float = 20.0,
        stop_timeout: float = 10.0,
        images: Iterable[str] = (IMAGE,),
        registry_hosts: Callable[[Path], object] | None = None,
    ) -> None:
        # Short base path: unix socket paths must stay under 108 bytes.
        self.workdir = Path(tempfile.mkdtemp(prefix="cri-e2e-", dir=tmp_root or "/tmp"))
        self.socket_path = self.workdir / "containerd.sock"
        #: gRPC target for the CRI services, e.g. ``unix:///tmp/cri-e2e-xxxx/containerd.sock``.
        self.address = f"unix://{self.socket_path}"
        self.config_path = self.workdir / "config.toml"
        self.log_path = self.workdir / "containerd.log"
        #: Parent for pods' ``log_directory`` (kubelet uses /var/log/pods; we keep it private).
        self.pod_log_dir = self.workdir / "pod-logs"
        self.cache_dir = cache_dir
        self.images = tuple(images)
        self.image = self.images[0]
        self.pause_image = PAUSE_IMAGE
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        #: Seconds the last ``start_daemon()`` took until CRI answered.
        self.start_seconds = 0.0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: io.BufferedWriter | None = None
        self._cgroups_before: set[Path] | None = None
        #: Writes containerd's registry hosts folder (`config_path`) at the path it is given (e.g.
        #: `registry.Registry.hosts_dir`): pulls go where it says, straight, past the dead proxy below
        self.registry_hosts = registry_hosts
        self._env = {
            **os.environ,
            "HTTP_PROXY": f"http://127.0.0.1:{_dead_port()}",
            "HTTPS_PROXY": f"http://127.0.0.1:{_dead_port()}",
            "NO_PROXY": "127.0.0.1" if registry_hosts else "",
        }
        self._env["no_proxy"] = self._env["NO_PROXY"]
        self._env["http_proxy"], self._env["https_proxy"] = self._env["HTTP_PROXY"], self._env["HTTPS_PROXY"]

    # -- life cycle ---------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """PID of the running containerd, None when it is not running."""
        return self._proc.pid if self.running and self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> PrivateContainerd:
        """Write the config, start containerd, import the images, wait until CRI sees them."""
        if os.geteuid() != 0:
            raise E2EError("a private containerd needs root")
        missing = missing_tools()
        if missing:
            raise E2EError(f"missing: {', '.join(missing)} (run {SETUP_SCRIPT} as root)")
        tarballs = [build_busybox_image(self.cache_dir, name=name) for name in self.images]
        for sub in ("root", "state", "runc", "opt", "cni/bin", "cni/conf"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        self.pod_log_dir.mkdir(exist_ok=True)
        hosts = None
        if self.registry_hosts is not None:
            hosts = self.workdir / "registry-hosts"
            self.registry_hosts(hosts)
        self.config_path.write_text(_config_toml(self.workdir, self.socket_path, hosts))
        if self._cgroups_before is None:
            self._cgroups_before = _kubepods_dirs()
        self.start_daemon()
        for tarball in tarballs:
            self.ctr("images", "import", "--snapshotter", "overlayfs", str(tarball))
        for name in self.images:
            self._wait_for_image(name)
        return self

    def start_daemon(self) -> None:
        """Start containerd on the existing dirs and wait until its CRI service answers."""
        if self.running:
            raise E2EError(f"containerd already running (pid {self.pid})")
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()  # stale after a SIGKILL
        self._close_log()
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in _close_log
        # SIGTERM to containerd when the test process dies, so none is left running. setpriv sets it
        # after the fork, not a preexec_fn: a Python-level fork in a process with gRPC's threads can
        # abort the child before it execs (seen: gRPC's poller in the child, SIGABRT). The death
        # signal fires when the *thread* that forked exits: only the main thread's lives long enough.
        in_main = threading.current_thread() is threading.main_thread()
        setpriv = shutil.which("setpriv")  # util-linux, essential on Debian
        die_with_us = [setpriv, "--pdeathsig", "TERM", "--"] if in_main and setpriv else []
        began = time.monotonic()
        self._proc = subprocess.Popen(
            [*die_with_us, shutil.which("containerd") or "containerd", "--config", str(self.config_path)],
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=self._env,
            cwd=self.workdir,
            start_new_session=True,
        )
        self._wait_ready(began)
        self.start_seconds = time.monotonic() - began

    def _wait_ready(self, began: float) -> None:
        deadline = began + self.ready_timeout
        last_error = "socket not created"
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                code = self._proc.returncode if self._proc else None
                raise E2EError(
                    f"containerd exited with code {code} while starting; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if self.socket_path.exists():
                try:
                    _raw_call(self.address, "/runtime.v1.RuntimeService/Version", b"", timeout=1.0)
                    return
                except grpc.RpcError as err:
                    if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                        raise E2EError(
                            "containerd answers but its CRI plugin is not loaded; "
                            f"log {self.log_path}:\n{self.log_tail()}"
                        ) from err
                    last_error = f"{err.code().name}: {err.details()}"
            time.sleep(0.02)
        raise E2EError(
            f"containerd (pid {self._proc.pid if self._proc else '?'}) did not answer on "
            f"{self.address} within {self.ready_timeout:.0f} s ({last_error}); "
            f"log {self.log_path}:\n{self.log_tail()}"
        )

    def _wait_for_image(self, name: str, timeout: float = 10.0) -> None:
        """CRI learns of imported images from events, asynchronously: wait until ImageStatus sees it."""
        # ImageStatusRequest{image: ImageSpec{image}}
        request = length_field(1, length_field(1, name.encode()))
        deadline = time.monotonic() + timeout
        while True:
            if _raw_call(self.address, "/runtime.v1.ImageService/ImageStatus", request, timeout=5.0):
                return
            if time.monotonic() > deadline:
                raise E2EError(f"image {name} imported but CRI does not list it; log:\n{self.log_tail()}")
            time.sleep(0.02)

    def terminate(self, sig: int = signal.SIGTERM, timeout: float | None = None) -> None:
        """Stop exactly the containerd we started (``sig``, then SIGKILL after ``timeout``); keep dirs.

        Containers keep running in their shims, as when containerd stops on a node.
        """
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(self.stop_timeout if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._close_log()

    def kill(self) -> None:
        """Crash containerd (SIGKILL), for fault tests."""
        self.terminate(signal.SIGKILL)

    def restart(self) -> None:
        """Stop and start containerd on the same dirs; returns once CRI answers again."""
        self.terminate()
        self.start_daemon()

    def stop(self) -> None:
        """Remove all pods, stop containerd, unmount and delete everything under ``workdir``.

        A containerd that a test left stopped is started once more first: only it can end the
        containers still running in their shims.
        """
        try:
            if self._proc is not None and not self.running:
                with contextlib.suppress(E2EError):
                    self.start_daemon()
            if self.running:
                self._remove_workloads()
        finally:
            self.terminate()
            self._cleanup()

    def __enter__(self) -> PrivateContainerd:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- helpers ------------------------------------------------------------------------------------

    def ctr(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``ctr`` against this containerd in the CRI namespace; return its stdout."""
        cmd = ["ctr", "-a", str(self.socket_path), "-n", CRI_NAMESPACE, *args]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, check=False, env=self._env
        )
        if proc.returncode != 0:
            raise E2EError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of containerd's log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as err:
            return f"<no log: {err}>"
        return "\n".join(text.splitlines()[-lines:])

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _remove_workloads(self) -> None:
        """Remove pods through CRI (as kubelet would), then kill any task CRI did not know about."""
        with contextlib.suppress(ImportError, grpc.RpcError), connect(self.address) as cri:
            remove_all_pods(cri)
        with contextlib.suppress(E2EError, subprocess.TimeoutExpired):
            for task in self.ctr("tasks", "ls", "-q").split():
                with contextlib.suppress(E2EError):
                    self.ctr("tasks", "kill", "-s", "SIGKILL", task)
                with contextlib.suppress(E2EError):
                    self.ctr("tasks", "delete", "-f", task)

    def _end_shims(self) -> None:
        """SIGKILL what is left of this containerd's shims, and the processes under them: a shim
        containerd lost track of outlives every removal through it. A warning says how many."""
        procs = {}  # pid -> (parent pid, argv)
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                procs[int(entry.name)] = (parent, argv)
        address = str(self.socket_path).encode()
        shims = [
            pid
            for pid, (_, argv) in procs.items()
            if argv[0].endswith(b"containerd-shim-runc-v2") and address in argv
        ]
        under, found = set(shims), True
        while found:
            more = {pid for pid, (parent, _) in procs.items() if parent in under} - under
            found = bool(more)
            under |= more
        for pid in under:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if shims:
            warnings.warn(f"containerd {self.workdir} left {len(shims)} shims; ended", stacklevel=2)

    def _cleanup(self) -> None:
        self._end_shims()
        for mount in mounts_under(self.workdir):
            subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)
        left = mounts_under(self.workdir)
        if left:
            # Never rm -r through a live mount: it could reach into a container's or the host's files.
            raise E2EError(f"could not unmount {', '.join(map(str, left))}; left {self.workdir} in place")
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self._cgroups_before is not None:
            remove_new_empty_cgroups(self._cgroups_before)
