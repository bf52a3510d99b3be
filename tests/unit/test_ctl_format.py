"""`cri-proxy ctl`'s pure parts: crictl's ages, sizes, short ids and tables; durations; log lines;
method names for `call`; the crictl config file."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from cri_proxy.ctl import call, logs, options, output
from cri_proxy.ctl.errors import CtlError

MINUTE, HOUR, DAY = 60, 3600, 86400


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.45, "Less than a second"),
        (1, "1 second"),
        (47, "47 seconds"),
        (60, "About a minute"),
        (3 * MINUTE, "3 minutes"),
        (35 * MINUTE + 40, "35 minutes"),
        (HOUR + 29 * MINUTE, "About an hour"),
        (HOUR + 31 * MINUTE, "2 hours"),
        (DAY + 12 * HOUR, "36 hours"),
        (2 * DAY, "2 days"),
        (13 * DAY + 5 * HOUR, "13 days"),
        (2 * 7 * DAY + 4 * DAY, "2 weeks"),
        (30 * DAY + 14 * DAY, "6 weeks"),
        (2 * 30 * DAY, "2 months"),
        (24 * 30 * DAY, "24 months"),
        (24 * 30 * DAY + 14 * DAY, "2 years"),
        (3 * 365 * DAY + 60 * DAY, "3 years"),
    ],
)
def test_human_duration_is_go_units(seconds: float, text: str) -> None:
    assert output.human_duration(seconds) == text


def test_ago_and_sizes_and_short_ids() -> None:
    now = 1_000_000 * 10**9
    assert output.ago(now - 5 * MINUTE * 10**9, now) == "5 minutes ago"
    assert output.ago(now - 70 * 10**9, now) == "About a minute ago"
    assert output.human_size(1_200_000) == "1.2MB"
    assert output.human_size(700_000) == "700kB"
    assert output.human_size(999) == "999B"
    assert output.human_size(4096, 4) == "4.096kB"
    assert output.truncate("0123456789abcdef") == "0123456789abc"
    assert output.truncate("sha256:0123456789abcdef", "sha256:") == "0123456789abc"
    digest = "sha256:" + "ab" * 32
    assert output.short_image(digest) == "ab" * 6 + "a"
    assert output.short_image("localhost/busybox:latest") == "localhost/busybox:latest"


def test_table_is_tabwriter_with_min_width_20_and_padding_3() -> None:
    text = output.table([["POD ID", "NAME", "LAST"], ["x" * 25, "web", "anything goes"]])
    head, row = text.splitlines()
    assert head == "POD ID".ljust(28) + "NAME".ljust(20) + "LAST"
    assert row == "x" * 25 + "   " + "web".ljust(20) + "anything goes"


def test_rfc3339nano_trims_trailing_zeros(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    import time

    time.tzset()
    try:
        assert output.rfc3339nano(1_700_000_000_120_000_000) == "2023-11-14T22:13:20.12Z"
        assert output.rfc3339nano(1_700_000_000_000_000_000) == "2023-11-14T22:13:20Z"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


@pytest.mark.parametrize(
    ("text", "seconds"), [("10", 10), ("2s", 2), ("500ms", 0.5), ("1m30s", 90), ("1.5s", 1.5)]
)
def test_durations(text: str, seconds: float) -> None:
    assert options.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "ten", "5x", "-1s", "1s2"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        options.parse_duration(text)


def test_cri_log_lines() -> None:
    full = logs.parse_line(b"2024-01-02T03:04:05.123456789Z stdout F hello world")
    assert full is not None and (full.stream, full.partial, full.text) == ("stdout", False, b"hello world")
    assert full.time_ns == 1704164645_123456789
    part = logs.parse_line(b"2024-01-02T03:04:05Z stderr P:extra par")
    assert part is not None and (part.stream, part.partial, part.text) == ("stderr", True, b"par")
    empty = logs.parse_line(b"2024-01-02T03:04:05Z stdout F")
    assert empty is not None and empty.text == b""
    assert logs.parse_line(b"not a cri log line") is None
    assert logs.parse_line(b'{"log": "docker json"}') is None
    assert logs.parse_since("10s", now_ns=100 * 10**9) == 90 * 10**9
    assert logs.parse_since("2024-01-02T03:04:05Z") == 1704164645 * 10**9
    with pytest.raises(CtlError):
        logs.parse_since("yesterday")


@pytest.mark.parametrize(
    ("name", "api", "path"),
    [
        ("RuntimeService/Version", None, "/runtime.v1.RuntimeService/Version"),
        ("runtime.v1.ImageService/ListImages", None, "/runtime.v1.ImageService/ListImages"),
        ("/runtime.v1alpha2.RuntimeService/Status", None, "/runtime.v1alpha2.RuntimeService/Status"),
        ("ImageService/ImageFsInfo", "v1alpha2", "/runtime.v1alpha2.ImageService/ImageFsInfo"),
        ("ListPodSandbox", None, "/runtime.v1.RuntimeService/ListPodSandbox"),
    ],
)
def test_call_finds_methods(name: str, api: str | None, path: str) -> None:
    assert call.find(name, api).path == path


@pytest.mark.parametrize(
    "name", ["RuntimeService/Nope", "Foo/Version", "runtime.v9.RuntimeService/Version", "Nope"]
)
def test_call_refuses_unknown_methods(name: str) -> None:
    with pytest.raises(CtlError):
        call.find(name, None)


def test_crictl_config_file(tmp_path: Path) -> None:
    good = tmp_path / "crictl.yaml"
    good.write_text("runtime-endpoint: unix:///a.sock\ntimeout: 3\ndebug: true\nother-key: ignored\n")
    assert options.read_crictl_config(good, explicit=True)["timeout"] == 3
    assert options.read_crictl_config(tmp_path / "absent.yaml", explicit=False) == {}
    with pytest.raises(CtlError, match="does not exist"):
        options.read_crictl_config(tmp_path / "absent.yaml", explicit=True)
    bad = tmp_path / "bad.yaml"
    bad.write_text("timeout: soon\n")
    with pytest.raises(CtlError, match="timeout"):
        options.read_crictl_config(bad, explicit=True)
