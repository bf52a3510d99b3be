"""crictl side by side with `cri-proxy ctl`: the cases, the pod they run against, and how outputs
are normalised (ids, times, ages) so recorded crictl outputs compare with ctl's.

Used by tests/fixtures/crictl-<version>/record.py (runs crictl, writes cases.json) and by
tests/e2e/test_ctl_containerd.py (runs ctl, compares). Each case: the words after the global
flags, with {cid} {pod} {image} {config} {missing} filled in; optional stdin; `compare`:
  "stdout"  stdout after normalisation, and the exit code
  "table"   the same with runs of spaces collapsed (ages change column widths)
  "head"    the first line of stdout, and the exit code
  "exit"    the exit code only (help texts and wording differ by design)
Every case also checks that stderr is empty exactly when crictl's was.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERSION = "1.36.0"
FIXTURES = Path(__file__).parent / "fixtures" / f"crictl-{VERSION}"
IMAGE = "localhost/busybox:latest"
POD_UID = "00000000-0000-4000-8000-00000000c71c"
GO_TEMPLATE_STATE = (
    "{{.status.metadata.name}} {{.status.state}} {{range $k, $v := .status.labels}}{{$k}}={{$v}};{{end}}"
)


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]
    compare: str = "stdout"
    stdin: str | None = None
    fixed_times: bool = False  # times printed at a fixed width (logs -t): the width is compared


CASES = (
    Case("version", ("version",)),
    Case("timeout-zero-is-default", ("-t", "0", "version")),
    Case("ps", ("ps",), "table"),
    Case("ps-all-quiet", ("ps", "-a", "-q")),
    Case("ps-no-trunc", ("ps", "--no-trunc", "--name", "^app$"), "table"),
    Case("ps-json", ("ps", "-o", "json")),
    Case("ps-yaml", ("ps", "-o", "yaml")),
    Case("pods", ("pods",), "table"),
    Case("pods-quiet", ("pods", "-q")),
    Case("pods-json", ("pods", "-o", "json")),
    Case("inspect-template", ("inspect", "-o", "go-template", "--template", GO_TEMPLATE_STATE, "{cid}")),
    Case("inspect-json", ("inspect", "{cid}")),
    Case("inspect-nothing-found", ("inspect", "--state", "exited"), "exit"),
    Case(
        "inspectp-template",
        ("inspectp", "-o", "go-template", "--template", "{{.status.metadata.uid}}", "{pod}"),
    ),
    Case(
        "inspecti-template",
        ("inspecti", "-o", "go-template", "--template", "{{.status.repoTags}}", "{image}"),
    ),
    Case(
        "info-template",
        ("info", "-o", "go-template", "--template", "{{range .status.conditions}}{{.type}} {{end}}"),
    ),
    Case("ps-verbose", ("ps", "-v")),
    Case("pods-verbose", ("pods", "-v")),
    Case("inspect-table", ("inspect", "-o", "table", "{cid}")),
    Case("inspect-yaml", ("inspect", "-o", "yaml", "{cid}")),
    Case("inspectp-table", ("inspectp", "-o", "table", "{pod}")),
    Case("inspectp-json", ("inspectp", "{pod}")),
    Case("inspecti-table", ("inspecti", "-o", "table", "{image}")),
    Case("inspecti-json", ("inspecti", "{image}")),
    Case("info-yaml", ("info", "-o", "yaml")),
    Case("imagefsinfo-table", ("imagefsinfo", "-o", "table"), "head"),
    Case("runtime-config", ("runtime-config",)),
    Case("metricdescs-unimplemented", ("metricdescs",), "exit"),
    Case("events-unimplemented", ("events",), "exit"),
    Case("update-runtime-config", ("update-runtime-config", "-p", "10.88.0.0/16"), "exit"),
    Case("images-verbose", ("images", "-v")),
    Case("images-json", ("images", "-o", "json", "{image}")),
    Case("images-quiet", ("images", "-q")),
    Case("images", ("images", IMAGE), "table"),
    Case("exec-sync", ("exec", "-s", "{cid}", "sh", "-c", "echo out; echo err >&2")),
    Case("exec-sync-fails", ("exec", "-s", "{cid}", "sh", "-c", "echo out; exit 3")),
    Case("exec-stream", ("exec", "{cid}", "sh", "-c", "echo out; echo err >&2")),
    Case("exec-stream-fails", ("exec", "{cid}", "sh", "-c", "echo out; exit 3")),
    Case("exec-stdin", ("exec", "-i", "{cid}", "sh", "-c", "read line; echo got $line"), stdin="hello\n"),
    Case("exec-by-name", ("exec", "--name", "^app$", "echo", "hi")),
    Case("logs", ("logs", "{cid}")),
    Case("logs-timestamps", ("logs", "-t", "{cid}"), fixed_times=True),
    Case("stats-id", ("stats", "--id", "{cid}"), "head"),
    Case("statsp-id", ("statsp", "--id", "{pod}"), "head"),
    Case("config-list", ("-c", "{config}", "config", "--list")),
    Case("config-get", ("-c", "{config}", "config", "--get", "timeout")),
    Case("config-unknown-key", ("-c", "{config}", "config", "--get", "nope"), "exit"),
    Case("checkpoint-unsupported", ("checkpoint", "--export", "/tmp/cri-parity.tar", "{cid}"), "exit"),
    Case("checkpoint-no-export", ("checkpoint", "{cid}"), "exit"),
    Case("unknown-command", ("no-such-command",), "exit"),
    Case("unknown-flag", ("ps", "--no-such-flag"), "exit"),
    Case("bad-flag-value", ("ps", "-n", "many"), "exit"),
    Case("unknown-global-flag", ("--no-such-flag", "version"), "exit"),
    Case("exec-without-command", ("exec", "{cid}"), "exit"),
    # last: these stop and remove the pod the cases above use
    Case("rm-running", ("rm", "{cid}"), "exit"),
    Case("rmp-ready", ("rmp", "{pod}"), "exit"),
    Case("stop", ("stop", "{cid}")),
    Case("ps-exited", ("ps", "-a", "--state", "exited"), "table"),
    Case(
        "inspect-exited-template",
        ("inspect", "-o", "go-template", "--template", "{{.status.state}} {{.status.exitCode}}", "{cid}"),
    ),
    Case("rm", ("rm", "{cid}")),
    Case("rm-again", ("rm", "{cid}"), "exit"),
    Case("stopp", ("stopp", "{pod}")),
    Case("rmp", ("rmp", "{pod}")),
    Case("inspectp-removed", ("inspectp", "{pod}"), "exit"),
    Case("stop-nothing", ("stop",), "exit"),
)

_ID64 = re.compile(r"\b[0-9a-f]{64}\b")
_ID13 = re.compile(r"\b[0-9a-f]{13}\b")
_AGO = re.compile(r"\b(Less than a second|About an? \w+|\d+ \w+) ago\b")
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")
_NANOS = re.compile(r"\b\d{16,20}\b")
_PID = re.compile(r'(\bpid"?:\s*)\d+')
_GO_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)? [+-]\d{4} \w+")
_PROC = re.compile(r"/proc/\d+/")
_CONTAINERD_DIR = re.compile(r"/tmp/cri-e2e-[A-Za-z0-9_]+")  # a private containerd's (tests/e2e)


def _time(m: re.Match[str], fixed: bool) -> str:
    """Digits to 0. The fraction: with `fixed`, nine digits kept as such (crictl pads log times)
    and a shorter one as `.<frac>`; else always `.<frac>` (RFC3339Nano drops trailing zeros, so
    its width is chance)."""
    fraction = m.group(1) or ""
    shape = "0000-00-00T00:00:00"
    if fraction:
        shape += ".000000000" if fixed and len(fraction) == 10 else ".<frac>"
    return shape + re.sub(r"\d", "0", m.group(2))


def normalise(text: str, known: dict[str, str], table: bool = False, fixed_times: bool = False) -> str:
    """Ids (named where known: <cid>, <pod>, else <id>), times (`_time`), ages,
    nanosecond counters; in a table, runs of spaces to one."""
    for value, name in sorted(known.items(), key=lambda item: -len(item[0])):
        text = text.replace(value, f"<{name}>")
    text = _ID64.sub("<id>", text)
    text = _ID13.sub("<id13>", text)
    text = _AGO.sub("<ago>", text)
    text = _RFC3339.sub(lambda m: _time(m, fixed_times), text)
    text = _GO_TIME.sub("<time>", text)
    text = _NANOS.sub("<ns>", text)
    text = _PID.sub(r"\g<1>0", text)
    text = _PROC.sub("/proc/0/", text)
    text = _CONTAINERD_DIR.sub("<containerd>", text)
    if table:
        text = "\n".join(re.sub(r" {2,}", "  ", line).rstrip() for line in text.split("\n"))
    return text


def known_ids(cid: str, pod: str, work: Path) -> dict[str, str]:
    """What to name in outputs: the ids, and the run's scratch directory."""
    return {cid: "cid", cid[:13]: "cid13", pod: "pod", pod[:13]: "pod13", str(work): "work"}


def pod_config(log_directory: Path) -> dict[str, Any]:
    namespaces = {"namespace_options": {"network": 2, "pid": 1, "ipc": 0}}
    labels = {"io.kubernetes.pod.name": "parity", "io.kubernetes.pod.namespace": "ctl-parity"}
    return {
        "metadata": {"name": "parity", "namespace": "ctl-parity", "uid": POD_UID, "attempt": 0},
        "log_directory": str(log_directory),
        "labels": {**labels, "io.kubernetes.pod.uid": POD_UID},
        "linux": {"cgroup_parent": f"/kubepods/besteffort/pod{POD_UID}", "security_context": namespaces},
    }


def container_config() -> dict[str, Any]:
    namespaces = {"namespace_options": {"network": 2, "pid": 1, "ipc": 0}}
    return {
        "metadata": {"name": "app", "attempt": 0},
        "image": {"image": IMAGE},
        "command": ["sh", "-c", "echo hello; echo oops >&2; echo world; exec sleep 3600"],
        "log_path": "app/0.log",
        "labels": {
            "io.kubernetes.pod.name": "parity",
            "io.kubernetes.pod.namespace": "ctl-parity",
            "io.kubernetes.container.name": "app",
        },
        "linux": {"resources": {"cpu_period": 100000, "cpu_shares": 2}, "security_context": namespaces},
    }


def write_configs(directory: Path, log_directory: Path) -> tuple[Path, Path, Path]:
    """(pod config, container config, a crictl client config) in `directory`."""
    pod, container, client = directory / "pod.json", directory / "container.json", directory / "crictl.yaml"
    pod.write_text(json.dumps(pod_config(log_directory), indent=2))
    container.write_text(json.dumps(container_config(), indent=2))
    client.write_text('runtime-endpoint: "unix:///run/parity.sock"\ntimeout: 7\ndebug: false\n')
    return pod, container, client


Runner = Callable[[Sequence[str], str | None], subprocess.CompletedProcess[str]]


def start_pod(run: Runner, pod_file: Path, container_file: Path) -> tuple[str, str]:
    """(container id, pod id) of the parity pod, its container started and its log written."""
    pod = run(["runp", str(pod_file)], None).stdout.strip()
    cid = run(["create", pod, str(container_file), str(pod_file)], None).stdout.strip()
    run(["start", cid], None)
    deadline = time.monotonic() + 20
    while "world" not in run(["logs", cid], None).stdout:
        if time.monotonic() > deadline:
            raise AssertionError("the parity container wrote no log")
        time.sleep(0.1)
    return cid, pod


def fill(args: Sequence[str], values: dict[str, str]) -> list[str]:
    return [arg if "{{" in arg else arg.format(**values) for arg in args]


def difference(name: str, got: dict[str, Any], want: dict[str, Any]) -> str:
    """One case's difference, short: the exit codes, stderr presence, the first lines that differ."""
    import difflib

    head = f"{name}: exit {got['exit']} (crictl {want['exit']})"
    lines = [f"{head}, stderr {got['stderr']} (crictl {want['stderr']})"]
    diff = difflib.unified_diff(
        want["stdout"].splitlines(), got["stdout"].splitlines(), "crictl", "ctl", lineterm=""
    )
    lines += ["  " + line for line in list(diff)[:12]]
    return "\n".join(lines)


def outcome(case: Case, out: subprocess.CompletedProcess[str], known: dict[str, str]) -> dict[str, Any]:
    """What a case compares, from one run."""
    stdout = normalise(out.stdout, known, table=case.compare == "table", fixed_times=case.fixed_times)
    if case.compare == "head":
        stdout = stdout.split("\n", 1)[0]
    elif case.compare == "exit":
        stdout = ""
    return {"exit": out.returncode, "stdout": stdout, "stderr": bool(out.stderr.strip())}
