"""`cri-proxy ctl` against the real containerd, through the session's `serve --dry-run` proxy.

Pods and containers are made from crictl-style config files (JSON and YAML, host network, as
kube.py builds them); then the listing, inspect, exec, logs, update (seen in the cgroup file),
the generic `call` of each service, `--bypass`, and the removal commands.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ProxyProcess
from containerd import PrivateContainerd, read_container_cpuset

from tests.crictl_parity import (
    CASES,
    FIXTURES,
    VERSION,
    difference,
    fill,
    known_ids,
    outcome,
    start_pod,
    write_configs,
)

pytestmark = pytest.mark.e2e

CLI = str(Path(sys.executable).parent / "cri-proxy")
IMAGE = "localhost/busybox:latest"
NODE, CONTAINER, POD = 2, 1, 0  # NamespaceMode numbers, as crictl's example files write them


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CONTAINER_RUNTIME_ENDPOINT", "IMAGE_SERVICE_ENDPOINT")
    }
    env["CRI_CONFIG_FILE"] = "/dev/null"  # never the machine's /etc/crictl.yaml
    return env


def ctl(proxy: ProxyProcess, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [CLI, "ctl", "-r", proxy.address, "-t", "30s", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env=_env(),
    )
    if check:
        assert out.returncode == 0, f"ctl {' '.join(args)}: exit {out.returncode}: {out.stderr}"
    return out


class Files:
    """crictl-style config files for one host-network besteffort pod and its container."""

    def __init__(self, tmp: Path, containerd: PrivateContainerd, name: str) -> None:
        self.uid = str(uuid.uuid4())
        self.name = name
        self.cgroup_parent = f"/kubepods/besteffort/pod{self.uid}"
        self.log_directory = containerd.pod_log_dir / f"ctl_{name}_{self.uid}"
        namespaces = {"namespace_options": {"network": NODE, "pid": CONTAINER, "ipc": POD}}
        self.pod: dict[str, Any] = {
            "metadata": {"name": name, "namespace": "ctl", "uid": self.uid, "attempt": 0},
            "log_directory": str(self.log_directory),
            "labels": {
                "io.kubernetes.pod.name": name,
                "io.kubernetes.pod.namespace": "ctl",
                "io.kubernetes.pod.uid": self.uid,
            },
            "linux": {"cgroup_parent": self.cgroup_parent, "security_context": namespaces},
        }
        self.container: dict[str, Any] = {
            "metadata": {"name": "app", "attempt": 0},
            "image": {"image": IMAGE},
            "command": ["sh", "-c", f"echo hello from {name}; exec sleep 3600"],
            "log_path": "app/0.log",
            "labels": {
                "io.kubernetes.pod.name": name,
                "io.kubernetes.pod.namespace": "ctl",
                "io.kubernetes.pod.uid": self.uid,
                "io.kubernetes.container.name": "app",
            },
            "linux": {
                "resources": {"cpu_period": 100000, "cpu_shares": 2, "oom_score_adj": 1000},
                "security_context": namespaces,
            },
        }
        self.pod_file = tmp / f"{name}-pod.json"
        self.pod_file.write_text(json.dumps(self.pod, indent=2))
        self.container_file = tmp / f"{name}-container.yaml"
        self.container_file.write_text(yaml.safe_dump(self.container))


def _run_pod(proxy: ProxyProcess, files: Files) -> tuple[str, str]:
    pod = ctl(proxy, "runp", str(files.pod_file)).stdout.strip()
    cid = ctl(proxy, "create", pod[:12], str(files.container_file), str(files.pod_file)).stdout.strip()
    assert ctl(proxy, "start", cid).stdout.strip() == cid
    return pod, cid


def test_lifecycle_from_config_files(
    containerd: PrivateContainerd, proxy: ProxyProcess, tmp_path: Path
) -> None:
    files = Files(tmp_path, containerd, "lifecycle")
    pod, cid = _run_pod(proxy, files)

    assert cid in ctl(proxy, "ps", "-q").stdout.split()
    assert pod in ctl(proxy, "pods", "-q").stdout.split()
    assert ctl(proxy, "pods", "-q", "--name", "^lifecycle$", "--namespace", "^ctl$").stdout.split() == [pod]
    assert ctl(proxy, "ps", "-q", "--pod", pod[:8]).stdout.split() == [cid]
    table = ctl(proxy, "ps", "--pod", pod).stdout.splitlines()
    assert table[1].startswith(cid[:13]) and "Running" in table[1] and "lifecycle" in table[1]

    doc = json.loads(ctl(proxy, "inspect", cid[:10]).stdout)
    status = doc["status"]
    assert status["id"] == cid and status["state"] == "CONTAINER_RUNNING"
    assert status["metadata"]["name"] == "app" and status["logPath"].startswith(str(files.log_directory))
    assert "info" in doc and doc["info"]["sandboxID"] == pod  # containerd's verbose info, parsed
    stats = json.loads(ctl(proxy, "stats", "-o", "json", cid[:12]).stdout)
    assert [st["attributes"]["id"] for st in stats["stats"]] == [cid]
    pod_doc = json.loads(ctl(proxy, "inspectp", pod).stdout)
    assert pod_doc["status"]["linux"]["namespaces"]["options"]["network"] == "NODE"

    out = ctl(proxy, "exec", "--sync", cid, "sh", "-c", "echo out; echo err >&2; exit 3", check=False)
    assert (out.returncode, out.stdout) == (1, "")  # crictl: an error naming the exit code
    assert "exited with 3: err" in out.stderr
    assert ctl(proxy, "exec", "-s", cid[:12], "cat", "/proc/self/cgroup").returncode == 0

    deadline = time.monotonic() + 15
    while (
        "hello from lifecycle" not in (logs := ctl(proxy, "logs", cid).stdout) and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert logs == "hello from lifecycle\n"
    stamped = ctl(proxy, "logs", "--timestamps", "--tail", "1", cid).stdout
    assert stamped.endswith(" hello from lifecycle\n") and stamped[:4].isdigit()
    assert len(stamped.split(" ")[0]) == len("2006-01-02T15:04:05.000000000Z")  # padded as crictl

    assert ctl(proxy, "stop", cid).stdout.strip() == cid
    assert json.loads(ctl(proxy, "inspect", cid).stdout)["status"]["state"] == "CONTAINER_EXITED"
    assert cid not in ctl(proxy, "ps", "-q").stdout and cid in ctl(proxy, "ps", "-a", "-q").stdout
    assert ctl(proxy, "rm", cid).stdout.strip() == cid
    assert cid not in ctl(proxy, "ps", "-a", "-q").stdout
    assert ctl(proxy, "stopp", pod).stdout.strip() == f"Stopped sandbox {pod}"
    assert ctl(proxy, "rmp", pod).stdout.strip() == f"Removed sandbox {pod}"
    assert pod not in ctl(proxy, "pods", "-q").stdout
    out = ctl(proxy, "inspectp", pod, check=False)
    assert out.returncode == 1 and "not found" in out.stderr and "Traceback" not in out.stderr


def test_update_cpuset_reaches_the_cgroup(
    containerd: PrivateContainerd, proxy: ProxyProcess, tmp_path: Path
) -> None:
    files = Files(tmp_path, containerd, "update")
    pod, cid = _run_pod(proxy, files)
    assert ctl(proxy, "update", "--cpuset-cpus", "0", cid[:12]).stdout.strip() == cid[:12]
    assert read_container_cpuset(files.cgroup_parent, cid) == "0"  # dry-run: the proxy left it alone
    linux = json.loads(ctl(proxy, "inspect", cid).stdout)["status"]["resources"]["linux"]
    assert linux["cpusetCpus"] == "0"
    out = ctl(proxy, "rmp", "--force", pod)
    assert out.stdout.splitlines() == [f"Stopped sandbox {pod}", f"Removed sandbox {pod}"]


def test_call_each_service_and_bypass(
    containerd: PrivateContainerd, proxy: ProxyProcess, tmp_path: Path
) -> None:
    version = json.loads(ctl(proxy, "call", "RuntimeService/Version", "{}").stdout)
    assert version["runtimeName"] == "containerd" and version["runtimeApiVersion"] == "v1"
    image = json.loads(
        ctl(
            proxy, "call", "runtime.v1.ImageService/ImageStatus", json.dumps({"image": {"image": IMAGE}})
        ).stdout
    )
    assert IMAGE in image["image"]["repoTags"]
    old = json.loads(ctl(proxy, "call", "--api", "v1alpha2", "ImageService/ListImages").stdout)
    assert any(IMAGE in i.get("repoTags", []) for i in old["images"])
    assert IMAGE.split(":")[0] in ctl(proxy, "images").stdout
    info = json.loads(ctl(proxy, "info").stdout)
    assert {c["type"] for c in info["status"]["conditions"]} >= {"RuntimeReady"} and "config" in info
    assert json.loads(ctl(proxy, "inspecti", IMAGE).stdout)["status"]["repoTags"] == [IMAGE]
    assert "imageFilesystems" in json.loads(ctl(proxy, "imagefsinfo").stdout)["status"]

    config = tmp_path / "proxy.toml"
    config.write_text(f'runtime_endpoint = "{containerd.address}"\n')
    out = subprocess.run(
        [CLI, "ctl", "--bypass", "--proxy-config", str(config), "version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**_env(), "CONTAINER_RUNTIME_ENDPOINT": f"unix://{tmp_path}/no-proxy.sock"},
        check=True,
    )
    assert "RuntimeName:  containerd" in out.stdout


# -- side by side with crictl: its recorded outputs (tests/fixtures/crictl-1.36.0) --------------


def test_same_output_and_exit_code_as_crictl(
    containerd: PrivateContainerd, proxy: ProxyProcess, tmp_path: Path
) -> None:
    """Every recorded crictl case, run with ctl against the same kind of pod through the proxy:
    the same stdout (ids, times, ages normalised), exit code, and stderr empty or not alike."""
    recorded = json.loads((FIXTURES / "cases.json").read_text())
    assert recorded["crictl"] == f"crictl version {VERSION}"
    want = {case["name"]: case for case in recorded["cases"]}
    assert set(want) == {case.name for case in CASES}, "re-record: the cases changed (README.md there)"
    pod_file, container_file, client = write_configs(tmp_path, tmp_path / "logs")

    def run(words: Sequence[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
        argv = [CLI, "ctl", "-r", proxy.address, "-t", "30s", *words]
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=90, env=_env())

    cid, pod = start_pod(run, pod_file, container_file)
    values = {"cid": cid, "pod": pod, "image": IMAGE, "config": str(client)}
    known = known_ids(cid, pod, tmp_path)
    differing = []
    for case in CASES:
        got = outcome(case, run(fill(case.args, values), case.stdin), known)
        expected = {key: want[case.name][key] for key in ("exit", "stdout", "stderr")}
        if got != expected:
            differing.append(difference(case.name, got, expected))
    assert not differing, "\n".join(differing)


def test_exec_tty_and_port_forward_through_the_streaming_server(
    containerd: PrivateContainerd, proxy: ProxyProcess, tmp_path: Path
) -> None:
    """exec -t (a terminal session: one stream, no separate stderr) and port-forward to a
    listener in the host-network pod, both over the runtime's websocket streaming."""
    files = Files(tmp_path, containerd, "stream")
    pod, cid = _run_pod(proxy, files)
    out = ctl(proxy, "exec", "-t", cid, "sh", "-c", "echo out", check=False)
    assert (
        out.returncode == 1 and "tty=true must be specified with interactive=true" in out.stderr
    )  # crictl's
    out = subprocess.run(  # a terminal session fed from a pipe: one stream, the shell's echo included
        [CLI, "ctl", "-r", proxy.address, "exec", "-it", cid, "sh"],
        input="echo out-$((6*7)); echo err >&2; exit 5\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert out.returncode == 1 and "command terminated with exit code 5" in out.stderr
    assert "out-42" in out.stdout and "err" in out.stdout  # stderr came on the terminal's one stream

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        remote = probe.getsockname()[1]
    server = subprocess.Popen(  # a one-shot server inside the pod (host network: the node's port)
        [CLI, "ctl", "-r", proxy.address, "exec", cid, "sh", "-c", f"echo pong | nc -l -p {remote}"],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    forward = subprocess.Popen(
        [CLI, "ctl", "-r", proxy.address, "port-forward", pod, f":{remote}"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()
        assert line.startswith("Forwarding from 127.0.0.1:") and line.rstrip().endswith(f"-> {remote}")
        local = int(line.split(":")[1].split()[0])
        deadline = time.monotonic() + 20
        answer = b""
        while b"pong" not in answer and time.monotonic() < deadline:
            with socket.create_connection(("127.0.0.1", local), timeout=10) as client:
                client.settimeout(10)
                try:
                    answer = client.recv(100)
                except OSError:
                    answer = b""
            if b"pong" not in answer:
                time.sleep(0.2)  # nc may not listen yet
        assert b"pong" in answer
    finally:
        forward.terminate()
        forward.wait(10)
        server.kill()
        server.wait(10)


def test_attach_streams_the_running_containers_output(
    containerd: PrivateContainerd, proxy: ProxyProcess, tmp_path: Path
) -> None:
    files = Files(tmp_path, containerd, "attach")
    files.container["command"] = ["sh", "-c", "while true; do echo tick; sleep 0.2; done"]
    files.container_file.write_text(yaml.safe_dump(files.container))
    _, cid = _run_pod(proxy, files)
    attached = subprocess.Popen(
        [CLI, "ctl", "-r", proxy.address, "attach", cid],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=lambda: lines.put(attached.stdout.readline() if attached.stdout else ""), daemon=True
    ).start()
    try:
        assert lines.get(timeout=30) == "tick\n"
    finally:
        attached.terminate()
        attached.wait(10)
    out = ctl(proxy, "attach", "-t", cid, check=False)  # crictl's rule: a terminal needs stdin
    assert out.returncode == 1 and "tty=true must be specified with interactive=true" in out.stderr


def test_run_makes_a_pod_and_starts_its_container(
    containerd: PrivateContainerd, proxy: ProxyProcess, tmp_path: Path
) -> None:
    files = Files(tmp_path, containerd, "run")
    out = ctl(proxy, "run", "--no-pull", str(files.container_file), str(files.pod_file))
    cid = out.stdout.strip()
    status = json.loads(ctl(proxy, "inspect", cid).stdout)["status"]
    assert status["state"] == "CONTAINER_RUNNING" and status["metadata"]["name"] == "app"
    sandbox = json.loads(ctl(proxy, "inspect", cid).stdout)["info"]["sandboxID"]
    assert ctl(proxy, "pods", "-q", "--name", "^run$").stdout.split() == [sandbox]
    out = ctl(
        proxy, "run", "--no-pull", "--with-pull", str(files.container_file), str(files.pod_file), check=False
    )
    assert out.returncode == 1 and "conflict: no-pull and with-pull are both set" in out.stderr
