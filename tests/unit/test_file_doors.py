"""The files the proxy and `ctl` read that someone else names: its config, its checkpoint, a sysfs
tree, crictl's config and request files. One that is a FIFO, a device, a directory, too big or not
UTF-8 ends in a clear error naming the file, or a logged problem, never a hang nor a traceback.

(The kubelet's state file has its own tests: `test_kubelet_file_door.py`.) Calls that could block
run in a thread joined with a deadline, so a regression fails the test instead of hanging it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from cri_proxy import config as config_mod
from cri_proxy.config import MAX_CONFIG_BYTES
from cri_proxy.errors import CheckpointError, ConfigError, SysfsError
from cri_proxy.files import read_small, text_of
from cri_proxy.state import checkpoint
from cri_proxy.sysfs import read_topology
from tests.processes import CLI, serve_command, start_fake_runtime, stop
from tests.processes import wait_until as _wait
from tests.unit.enforce_support import fake_sysfs
from tests.unit.test_daemon import Daemon


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()


def _dev_zero(path: Path) -> None:
    os.symlink("/dev/zero", path)


def _not_utf8(path: Path) -> None:
    path.write_bytes(b'reserved_cpus = "0"\n# caf\xe9\n')


def _too_big(path: Path) -> None:
    path.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))


NOT_A_CONFIG: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (_fifo, "is a FIFO, not a regular file"),
    "directory": (_directory, "is a directory, not a regular file"),
    "symlink-to-dev-zero": (_dev_zero, f"is more than {MAX_CONFIG_BYTES} bytes"),
    "not-utf8": (_not_utf8, "is not UTF-8 text (byte 25: 0xe9)"),
    "too-big": (_too_big, f"is {MAX_CONFIG_BYTES + 1} bytes, more than the {MAX_CONFIG_BYTES} read"),
}

NOT_A_FILE = pytest.mark.parametrize(  # for the files that have no byte-level checks of their own
    ("make", "message"),
    [(_fifo, "is a FIFO, not a regular file"), (_dev_zero, "is a character device, not a regular file")],
    ids=["fifo", "symlink-to-dev-zero"],
)


def _within(seconds: float, call: Callable[[], object]) -> object:
    """`call()`'s result or exception, or a failure when it has not returned within `seconds`."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked"
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out.get("value")


def test_the_read_takes_a_device_only_when_asked_and_never_without_bound(tmp_path: Path) -> None:
    assert read_small("/dev/null", 10, devices=True) == b""
    with pytest.raises(ValueError, match="is a character device, not a regular file"):
        read_small("/dev/null", 10)
    with pytest.raises(ValueError, match="/dev/zero is more than 10 bytes"):
        read_small("/dev/zero", 10, devices=True)
    _fifo(tmp_path / "fifo")
    with pytest.raises(ValueError, match="is a FIFO"):
        _within(10, lambda: read_small(tmp_path / "fifo", 10, devices=True))
    with pytest.raises(FileNotFoundError):
        read_small(tmp_path / "absent", 10)
    with socket.socket(socket.AF_UNIX) as listening:  # one that cannot even be opened says what it is
        listening.bind(str(tmp_path / "sock"))
        with pytest.raises(ValueError, match=r"sock is a socket, not a regular file$"):
            read_small(tmp_path / "sock", 10)
    assert text_of("café".encode(), "f") == "café"
    with pytest.raises(ValueError, match=r"^f is not UTF-8 text \(byte 3: 0xe9\)$"):
        text_of(b"caf\xe9", "f")


@pytest.mark.parametrize("kind", sorted(NOT_A_CONFIG))
def test_a_config_that_is_not_a_small_text_file_is_refused_naming_it(tmp_path: Path, kind: str) -> None:
    make, message = NOT_A_CONFIG[kind]
    path = tmp_path / "config.toml"
    make(path)
    with pytest.raises(ConfigError) as err:
        _within(10, lambda: config_mod.load(path))
    assert str(err.value) == f"config file {path} {message}"


def test_dev_null_is_still_an_empty_config() -> None:
    assert config_mod.load(Path("/dev/null")) == config_mod.Config()


@pytest.mark.parametrize("kind", ["fifo", "not-utf8"])
def test_the_real_serve_refuses_such_a_config_at_once(tmp_path: Path, kind: str) -> None:
    make, message = NOT_A_CONFIG[kind]
    config = tmp_path / "config.toml"
    make(config)
    fake, runtime = start_fake_runtime(tmp_path)
    try:
        argv = serve_command(tmp_path, runtime, config=config)
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    finally:
        stop(fake)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == f"cri-proxy serve: config file {config} {message}"
    assert not (tmp_path / "proxy.sock").exists()


def test_a_sighup_with_the_config_turned_into_a_fifo_is_refused_and_serving_goes_on(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, 'reserved_cpus = "0-1"\n')
    try:
        daemon.config.unlink()
        _fifo(daemon.config)
        daemon.proc.send_signal(signal.SIGHUP)
        _wait(lambda: "reload refused" in daemon.logs(), what="the refusal in the log")
        assert "is a FIFO, not a regular file" in daemon.logs().split("reload refused")[1].splitlines()[0]
        assert daemon.plan()["pools"] == {"ls": "2-15", "be": "2-15"}
        daemon.config.unlink()
        daemon.config.write_text('reserved_cpus = "0-2"\n')  # the next reload reads again
        daemon.proc.send_signal(signal.SIGHUP)
        _wait(lambda: daemon.plan()["pools"] == {"ls": "3-15", "be": "3-15"}, what="the good reload")
    finally:
        assert daemon.stop() == 0


@NOT_A_FILE
def test_a_checkpoint_that_is_not_a_file_is_refused_without_waiting(
    tmp_path: Path, make: Callable[[Path], None], message: str
) -> None:
    path = tmp_path / "checkpoint.json"
    make(path)
    with pytest.raises(CheckpointError) as err:
        _within(10, lambda: checkpoint.load(path))
    assert str(err.value) == f"cannot read checkpoint: {path} {message}"


def test_the_proxy_starts_over_a_checkpoint_that_is_a_fifo(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir(mode=0o700)
    _fifo(tmp_path / "state" / "checkpoint.json")
    daemon = Daemon(tmp_path)  # returns once the socket answers: the start did not block on it
    try:
        assert "checkpoint unusable, rebuilding from the runtime: cannot read checkpoint:" in daemon.logs()
        assert "is a FIFO, not a regular file" in daemon.logs()
        assert daemon.plan()["pools"] == {"ls": "0-15", "be": "0-15"}
    finally:
        assert daemon.stop() == 0
    # the stop's save put a real checkpoint in its place
    assert checkpoint.load(tmp_path / "state" / "checkpoint.json") is not None


@NOT_A_FILE
def test_a_sysfs_file_that_is_not_a_file_is_an_error_naming_it(
    tmp_path: Path, make: Callable[[Path], None], message: str
) -> None:
    root = fake_sysfs(tmp_path / "sys", {0: "0-3"})
    online = root / "devices/system/cpu/online"
    online.unlink()
    make(online)
    with pytest.raises(SysfsError) as err:
        _within(10, lambda: read_topology(root))
    assert str(err.value) == f"cannot read {online} {message}"


def _ctl(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CRI_CONFIG_FILE": "/dev/null"}
    none = f"unix://{tmp_path / 'none.sock'}"
    return subprocess.run(
        [CLI, "ctl", "-r", none, *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_ctl_names_a_file_that_is_not_utf8_and_exits_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_bytes(b"\xff{")
    for args, what in (
        (("--config", str(bad), "version"), "config file"),
        (("runp", str(bad)), "config at"),
        (("call", "Version", f"@{bad}"), "request file"),
    ):
        out = _ctl(tmp_path, *args)
        assert out.returncode == 1, (args, out.stderr)
        assert out.stderr.strip() == f"cri-proxy ctl: {what} {bad} is not UTF-8 text (byte 0: 0xff)", args


def test_ctl_still_reads_its_config_from_a_pipe_as_crictl_does(tmp_path: Path) -> None:
    piped = f"unix://{tmp_path / 'from-the-pipe.sock'}"
    read, write = os.pipe()
    os.write(write, f"runtime-endpoint: {piped}\ntimeout: 1\n".encode())
    os.close(write)
    try:
        out = subprocess.run(
            [CLI, "ctl", "--config", f"/dev/fd/{read}", "version"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "CRI_CONFIG_FILE": "/dev/null"},
            pass_fds=(read,),
        )
    finally:
        os.close(read)
    assert out.returncode == 1
    assert f"cannot reach the proxy at {piped}" in out.stderr
