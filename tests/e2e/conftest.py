"""Fixtures for the end-to-end tests against a real containerd.

- ``containerd`` (session): one private containerd for the whole session (:class:`PrivateContainerd`;
  ``.address`` is its CRI endpoint, ``.pod_log_dir`` the root for pods' log dirs, ``.restart()``).
  Installs the packages with scripts/setup-e2e when missing, so a fresh clone works.
- ``registry`` (session): the local image registry that containerd pulls from (``registry.py``;
  ``.pulls`` lists the requests it answered).
- ``containerd_cri``: a sync CRI client straight to that containerd, once per API version.
- After each test that used ``containerd``, every pod left behind is stopped and removed, and a
  containerd that the test left stopped is started again, so tests stay independent.

Not root or no way to install containerd: the tests fail in CI (CI=true) and are skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from containerd import (
    API_VERSIONS,
    CriClient,
    E2EError,
    PrivateContainerd,
    connect,
    missing_tools,
    remove_all_pods,
    run_setup_script,
)
from registry import Registry, pull_images

_HERE = Path(__file__).resolve().parent
_timings: dict[str, float] = {}


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _unavailable(reason: str) -> NoReturn:
    """CI must not pass quietly without the end-to-end tests; a developer's machine may lack them."""
    if _in_ci():
        pytest.fail(f"e2e test bed unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"e2e test bed unavailable: {reason}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test under tests/e2e carries the ``e2e`` marker (``-m 'not e2e'`` leaves them out).

    They also share one xdist group: under ``pytest -n N --dist loadgroup`` (scripts/test) they run
    in one worker, in order, against one private containerd, while the other workers take the unit
    tests. Two containerds side by side would share the node's cgroup tree and its CPU.
    """
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.xdist_group("e2e"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _timings:
        parts = ", ".join(f"{key} {value:.2f} s" for key, value in _timings.items())
        terminalreporter.write_line(f"e2e test bed: {parts}")


@pytest.fixture(scope="session")
def e2e_tools() -> None:
    """containerd, runc and a static busybox on the machine (installed when missing), as root."""
    if os.geteuid() != 0:
        _unavailable("needs root (runs containerd and runc)")
    if missing_tools():
        began = time.monotonic()
        try:
            run_setup_script()
        except (E2EError, OSError) as err:
            _unavailable(f"could not install containerd/runc/busybox-static: {err}")
        _timings["setup-e2e"] = time.monotonic() - began
        still = missing_tools()
        if still:
            _unavailable(f"still missing after scripts/setup-e2e: {', '.join(still)}")


@pytest.fixture(scope="session")
def registry(e2e_tools: None) -> Iterator[Registry]:
    """A local image registry (`registry.py`) serving `pull_images()`: the session's containerd pulls
    those names from it, and nothing else from anywhere."""
    served = Registry(pull_images()).start()
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="session")
def containerd(registry: Registry) -> Iterator[PrivateContainerd]:
    """One private containerd for the session, with localhost/busybox:latest imported and pulls
    going to the session's `registry`."""
    began = time.monotonic()
    bed = PrivateContainerd(registry_hosts=registry.hosts_dir)
    try:
        bed.start()
    except BaseException:
        bed.stop()
        raise
    _timings["containerd start (incl. image import)"] = time.monotonic() - began
    try:
        yield bed
    finally:
        began = time.monotonic()
        bed.stop()
        _timings["containerd stop + cleanup"] = time.monotonic() - began


@pytest.fixture(autouse=True)
def _remove_leftover_pods(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used the containerd: remove the pods it left (failed tests leave some)."""
    if "containerd" not in request.fixturenames:
        yield
        return
    bed: PrivateContainerd = request.getfixturevalue("containerd")
    yield
    if not bed.running:  # a fault test stopped or killed it
        bed.start_daemon()
    with connect(bed.address) as cri:
        remove_all_pods(cri)


@pytest.fixture(params=API_VERSIONS)
def containerd_cri(request: pytest.FixtureRequest, containerd: PrivateContainerd) -> Iterator[CriClient]:
    """A CRI client straight to the private containerd; the test runs once per API version."""
    with connect(containerd.address, request.param) as cri:
        yield cri


class ProxyProcess:
    """`cri-proxy serve` as a real process in front of the private containerd."""

    def __init__(self, containerd: PrivateContainerd, *extra: str, name: str = "proxy") -> None:
        self.socket = containerd.workdir / name / "cri-proxy.sock"
        self.address = f"unix://{self.socket}"
        self.log_path = containerd.workdir / f"{name}.log"
        self.args = [
            str(Path(sys.executable).parent / "cri-proxy"),
            "serve",
            "--config",
            "/dev/null",
            "--listen",
            self.address,
            "--runtime-endpoint",
            containerd.address,
            "--state-dir",
            str(containerd.workdir / f"{name}-state"),
            "--kubelet-state-file",
            str(containerd.workdir / "cpu_manager_state"),
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ProxyProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise E2EError(f"cri-proxy exited at start: {self.log_path.read_text()[-2000:]}")
            if self.socket.exists():
                try:
                    with socket.socket(socket.AF_UNIX) as s:
                        s.connect(str(self.socket))
                    return self
                except OSError:
                    pass
            time.sleep(0.05)
        raise E2EError(f"cri-proxy did not listen on {self.socket}: {self.log_path.read_text()[-2000:]}")

    def ctl_json(self, *args: str) -> Any:
        """`cri-proxy ctl -r <this proxy> ARGS`, which must succeed; its output read as JSON."""
        argv = [self.args[0], "ctl", "-r", self.address, *args]
        return json.loads(subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout)

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a node's crash ends it: no stop of its own."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGUSR1)  # what it waits on: every stack to its log
                time.sleep(1)
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


@pytest.fixture(scope="session")
def proxy(containerd: PrivateContainerd) -> Iterator[ProxyProcess]:
    """One `cri-proxy serve --dry-run` in front of the session's containerd: the pure relay.

    Dry-run decides and reports but changes no request, so these tests see exactly what the
    runtime does; the enforcement tests start proxies of their own.
    """
    process = ProxyProcess(containerd, "--dry-run").start()
    try:
        yield process
    finally:
        code = process.stop()
        assert code == 0, f"cri-proxy exited {code}: {process.log_path.read_text()[-2000:]}"


@pytest.fixture(params=API_VERSIONS)
def proxy_cri(request: pytest.FixtureRequest, proxy: ProxyProcess) -> Iterator[CriClient]:
    """A CRI client to the proxy; the test runs once per API version."""
    assert proxy.proc is not None and proxy.proc.poll() is None, "the session's proxy died"
    with connect(proxy.address, request.param) as cri:
        yield cri


@pytest.fixture(params=API_VERSIONS)
def via_proxy_and_direct(
    request: pytest.FixtureRequest, proxy: ProxyProcess, containerd: PrivateContainerd
) -> Iterator[tuple[CriClient, CriClient]]:
    """(client to the proxy, client straight to containerd), same API version; once per version."""
    with (
        connect(proxy.address, request.param) as through,
        connect(containerd.address, request.param) as direct,
    ):
        yield through, direct


@pytest.fixture
def enforcer(request: pytest.FixtureRequest, containerd: PrivateContainerd) -> Iterator[ProxyProcess]:
    """A `cri-proxy serve` that enforces (no --dry-run) in front of the session's containerd, one per test.

    Named after the test module (test_faults_containerd.py: "faults"), so each module has a state dir
    of its own. Afterwards the kubelet state file a test may have written is removed.
    """
    name = request.path.stem.removeprefix("test_").removesuffix("_containerd")
    process = ProxyProcess(containerd, name=name).start()
    try:
        yield process
    finally:
        process.stop()
        (containerd.workdir / "cpu_manager_state").unlink(missing_ok=True)
