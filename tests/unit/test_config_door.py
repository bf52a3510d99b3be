"""Every setting checked at the door: refused with its key named, at start and on SIGHUP.

The start-up cases run the real `cri-proxy serve` (exit status 2, one line naming the key); the
reload cases send SIGHUP to a running one and read the live plan to see that nothing changed.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cri_proxy import config as config_mod
from cri_proxy.config import NUMBERS, Config, check_cpus
from cri_proxy.cpu import CPUSet
from cri_proxy.errors import ConfigError
from tests.processes import serve_command, start_fake_runtime, stop
from tests.processes import wait_until as _wait
from tests.unit.enforce_support import fake_sysfs
from tests.unit.test_daemon import Daemon

BAD_NUMBERS = [
    (key, text)
    for key in NUMBERS
    for text in ("nan", "inf", "-inf", "-1")
    if not (text == "-1" and key.endswith("_bytes"))  # covered by the 1024 minimum below
] + [
    ("max_recv_message_bytes", "1023"),
    ("max_send_message_bytes", "4294967296"),
    ("reconcile_concurrency", "0"),
    ("reconcile_concurrency", "100000"),
    ("kubelet_poll_seconds", "0"),
    ("exclusive_wait_seconds", "1e300"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as err:
        return err.code
    except urllib.error.URLError:  # not listening yet
        return 0


def _load(tmp_path: Path, text: str) -> Config:
    file = tmp_path / "config.toml"
    file.write_text(text)
    return config_mod.load(file)


@pytest.mark.parametrize(("key", "text"), BAD_NUMBERS, ids=[f"{k}={t}" for k, t in BAD_NUMBERS])
def test_bad_numbers_are_refused_naming_the_key(tmp_path: Path, key: str, text: str) -> None:
    if key in NUMBERS and isinstance(getattr(Config(), key), int) and text in ("nan", "inf", "-inf"):
        expected = "expected int"  # TOML's nan/inf are floats: the type check names the key first
    else:
        expected = "must be"
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, f"{key} = {text}\n")
    assert str(err.value).startswith(f"{key}:") and expected in str(err.value)


def test_the_bounds_are_written_as_in_a_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, "max_send_message_bytes = 4294967296\n")
    assert str(err.value) == "max_send_message_bytes: must be between 1024 and 2147483647, not 4294967296"
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, "shutdown_grace_seconds = -0.5\n")
    assert str(err.value) == "shutdown_grace_seconds: must be between 0 and 86400, not -0.5"


def test_nan_from_a_flag_is_refused_too(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="exclusive_wait_seconds: must be a finite number"):
        config_mod.load(Path("/dev/null"), {"exclusive_wait_seconds": float("nan")})


def test_zero_reconcile_period_still_means_only_on_changes(tmp_path: Path) -> None:
    assert _load(tmp_path, "reconcile_period_seconds = 0\n").reconcile_period_seconds == 0.0


@pytest.mark.parametrize(
    ("reserved", "system", "message"),
    [
        ("0-16", "", "reserved_cpus: CPUs 16 are not online"),
        ("", "14-17", "system_cpus: CPUs 16-17 are not online"),
        ("0-15", "", "reserved_cpus: 0-15 covers every online CPU"),
        ("0-1,3-15,2", "", "covers every online CPU"),
    ],
)
def test_cpus_are_checked_against_the_online_cpus(reserved: str, system: str, message: str) -> None:
    config = Config(reserved_cpus=reserved, system_cpus=system).validate()
    with pytest.raises(ConfigError, match=message):
        check_cpus(config, CPUSet.parse("0-15"))


def test_cpus_within_the_online_ones_pass() -> None:
    check_cpus(Config(reserved_cpus="0-1", system_cpus="2-3"), CPUSet.parse("0-15"))


@pytest.mark.parametrize("address", ["0.0.0.0:9464", "[::]:9464", "10.1.2.3:9464", "node.example:9464"])
def test_non_loopback_metrics_address_needs_allow_remote_metrics(tmp_path: Path, address: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, f'metrics_address = "{address}"\n')
    assert str(err.value).startswith("metrics_address:") and "allow_remote_metrics" in str(err.value)
    allowed = _load(tmp_path, f'metrics_address = "{address}"\nallow_remote_metrics = true\n')
    assert allowed.metrics_address == address


@pytest.mark.parametrize("address", ["127.0.0.1:9464", "127.3.4.5:1", "[::1]:9464", "localhost:9464"])
def test_loopback_metrics_address_is_fine(tmp_path: Path, address: str) -> None:
    assert _load(tmp_path, f'metrics_address = "{address}"\n').metrics_address == address


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("exclusive_wait_seconds = nan\n", "exclusive_wait_seconds"),
        ("reconcile_period_seconds = nan\n", "reconcile_period_seconds"),
        ('reserved_cpus = "0-15"\n', "reserved_cpus"),
        ('reserved_cpus = "0-63"\n', "reserved_cpus"),
        ('metrics_address = "0.0.0.0:9464"\n', "metrics_address"),
    ],
)
def test_the_real_serve_refuses_to_start_naming_the_key(tmp_path: Path, text: str, key: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text)
    sysfs = fake_sysfs(tmp_path / "sys", {0: "0-7", 1: "8-15"})
    fake, runtime = start_fake_runtime(tmp_path)
    try:
        argv = serve_command(tmp_path, runtime, "--sysfs-root", str(sysfs), config=config)
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    finally:
        stop(fake)
    assert out.returncode == 2, out.stderr
    assert f"cri-proxy serve: {key}:" in out.stderr
    assert not (tmp_path / "proxy.sock").exists()


def test_allowed_remote_metrics_listener_is_warned_about(tmp_path: Path) -> None:
    port = _free_port()
    daemon = Daemon(tmp_path, f'metrics_address = "0.0.0.0:{port}"\nallow_remote_metrics = true\n')
    try:
        _wait(lambda: _status(f"http://127.0.0.1:{port}/healthz") == 200, what="/healthz")
        assert "is not loopback (allow_remote_metrics = true)" in daemon.logs()
    finally:
        assert daemon.stop() == 0


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('reserved_cpus = "0-3"\nexclusive_wait_seconds = nan\n', "exclusive_wait_seconds"),
        ('reserved_cpus = "0-3"\nreconcile_period_seconds = inf\n', "reconcile_period_seconds"),
        ('reserved_cpus = "0-15"\n', "reserved_cpus"),
        ('reserved_cpus = "2-3,40"\n', "reserved_cpus"),
        ('reserved_cpus = "0-3"\nmetrics_address = "0.0.0.0:9"\n', "metrics_address"),
        ('reserved_cpus = "0-3"\nreconcile_concurrency = -2\n', "reconcile_concurrency"),
    ],
)
def test_a_failed_sighup_reload_keeps_every_running_setting(tmp_path: Path, text: str, key: str) -> None:
    daemon = Daemon(tmp_path, 'reserved_cpus = "0-1"\n')
    try:
        assert daemon.plan()["pools"] == {"ls": "2-15", "be": "2-15"}
        daemon.config.write_text(text)
        daemon.proc.send_signal(signal.SIGHUP)
        _wait(lambda: "reload refused" in daemon.logs(), what="the refusal in the log")
        refusal = daemon.logs().split("reload refused")[1].splitlines()[0]
        assert f"{key}:" in refusal
        assert "configuration reloaded" not in daemon.logs()
        assert daemon.plan()["pools"] == {"ls": "2-15", "be": "2-15"}  # reserved_cpus 0-3 not taken
        daemon.config.write_text('reserved_cpus = "0-2"\n')  # and a good reload still works after it
        daemon.proc.send_signal(signal.SIGHUP)
        _wait(lambda: daemon.plan()["pools"] == {"ls": "3-15", "be": "3-15"}, what="the good reload")
        assert daemon.proc.poll() is None
    finally:
        assert daemon.stop() == 0
