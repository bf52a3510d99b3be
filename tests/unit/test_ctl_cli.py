"""`cri-proxy ctl` as operators run it: a subprocess against `cri-proxy serve --dry-run` in front of
the fake runtime (both real processes, state in tmp dirs), and with `--bypass` straight to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.processes import wait_for_socket as _wait_for_socket

CLI = str(Path(sys.executable).parent / "cri-proxy")
DEFAULT_PROXY = "unix:///run/cri-proxy/cri-proxy.sock"


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([CLI, *args], stdout=out, stderr=out)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@dataclass
class Bed:
    dir: Path
    runtime: str  # the fake runtime's endpoint
    proxy: str  # the proxy's endpoint
    proxy_config: Path  # a proxy TOML naming the fake runtime (for --bypass)

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("CONTAINER_RUNTIME_ENDPOINT", "IMAGE_SERVICE_ENDPOINT", "CRI_CONFIG_FILE")
        }
        env["CRI_CONFIG_FILE"] = "/dev/null"  # never the machine's /etc/crictl.yaml
        env.update(extra)
        return env

    def run(
        self, *args: str, env: dict[str, str] | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """`cri-proxy ctl -r <proxy> ARGS` (no -r when `env` is given: the test sets the sources)."""
        argv = [CLI, "ctl", *args] if env is not None else [CLI, "ctl", "-r", self.proxy, *args]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env or self.env())
        if check:
            assert out.returncode == 0, f"{args}: {out.returncode}: {out.stderr}"
        return out

    def json(self, *args: str) -> object:
        return json.loads(self.run(*args).stdout)


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    d = tmp_path_factory.mktemp("ctl")
    runtime_sock, proxy_sock = d / "runtime.sock", d / "run" / "proxy.sock"
    fake = _start(["fake-runtime", "--listen", f"unix://{runtime_sock}"], d / "fake.log")
    proxy = None
    try:
        _wait_for_socket(runtime_sock, fake)
        proxy = _start(
            [
                "serve",
                "--config",
                "/dev/null",
                "--listen",
                f"unix://{proxy_sock}",
                "--runtime-endpoint",
                f"unix://{runtime_sock}",
                "--state-dir",
                str(d / "state"),
                "--kubelet-state-file",
                str(d / "cpu_manager_state"),
                "--dry-run",
            ],
            d / "proxy.log",
        )
        _wait_for_socket(proxy_sock, proxy)
        config = d / "proxy.toml"
        config.write_text(f'runtime_endpoint = "unix://{runtime_sock}"\n')
        yield Bed(d, f"unix://{runtime_sock}", f"unix://{proxy_sock}", config)
    finally:
        if proxy is not None:
            _stop(proxy)
        _stop(fake)


def _pod_config(
    bed: Bed, name: str, fmt: str = "json", annotations: dict[str, str] | None = None, **labels: str
) -> Path:
    uid = str(uuid.uuid4())
    config = {
        "metadata": {"name": name, "namespace": "ctl-test", "uid": uid, "attempt": 0},
        "annotations": annotations or {},
        "log_directory": str(bed.dir / "pods" / f"ctl-test_{name}_{uid}"),
        "labels": {"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": "ctl-test", **labels},
        "linux": {
            "cgroup_parent": f"/kubepods/besteffort/pod{uid}",
            "security_context": {"namespace_options": {"network": 2, "pid": 1, "ipc": 0}},
        },
    }
    path = bed.dir / f"pod-{name}.{fmt}"
    path.write_text(json.dumps(config) if fmt == "json" else _yaml(config))
    return path


def _container_config(bed: Bed, name: str, fmt: str = "yaml") -> Path:
    config = {
        "metadata": {"name": name},
        "image": {"image": "localhost/busybox:latest"},
        "command": ["sleep", "3600"],
        "log_path": f"{name}/0.log",
        "labels": {  # as kubelet sets them: crictl's POD and NAMESPACE columns come from these
            "io.kubernetes.container.name": name,
            "io.kubernetes.pod.name": name,
            "io.kubernetes.pod.namespace": "ctl-test",
        },
        "linux": {"resources": {"cpu_shares": 2, "oom_score_adj": 1000}},
    }
    path = bed.dir / f"ctr-{name}.{fmt}"
    path.write_text(json.dumps(config) if fmt == "json" else _yaml(config))
    return path


def _yaml(data: object) -> str:
    import yaml

    text: str = yaml.safe_dump(data)
    return text


def _pod_and_container(
    bed: Bed, name: str, start: bool = True, fmt: str = "yaml", via_cli: bool = False
) -> tuple[str, str, Path]:
    """A pod and its container from config files: with the CLI (`runp`, `create`, `start`), or
    in-process with the same files when the test is about something else (fewer processes)."""
    pod_file = _pod_config(bed, name, "json" if fmt == "yaml" else "yaml", test=name)
    container_file = _container_config(bed, name, fmt)
    if via_cli:
        pod = bed.run("runp", str(pod_file)).stdout.strip()
        cid = bed.run("create", pod, str(container_file), str(pod_file)).stdout.strip()
        if start:
            assert bed.run("start", cid).stdout.strip() == cid
        return pod, cid, pod_file
    from cri_proxy.client import CriClient
    from cri_proxy.ctl.configs import load_container_config, load_pod_config

    with CriClient(bed.proxy) as client:
        pb, rt = client.pb, client.runtime
        pod_config = load_pod_config(pb, str(pod_file))
        pod = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=pod_config)).pod_sandbox_id
        config = load_container_config(pb, str(container_file))
        request = pb.CreateContainerRequest(pod_sandbox_id=pod, config=config, sandbox_config=pod_config)
        cid = rt.CreateContainer(request).container_id
        if start:
            rt.StartContainer(pb.StartContainerRequest(container_id=cid))
    return pod, cid, pod_file


def _one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


# -- options -----------------------------------------------------------------------------------------


def test_version_through_the_proxy(bed: Bed) -> None:
    out = bed.run("version").stdout.splitlines()
    assert out == [
        "Version:  0.1.0",
        "RuntimeName:  cri-proxy-fake-runtime",
        "RuntimeVersion:  0.1.0",
        "RuntimeApiVersion:  v1",
    ]


def test_endpoint_precedence_flag_then_env_then_config_file(bed: Bed) -> None:
    dead = {k: f"unix://{bed.dir}/{k}.sock" for k in ("flag", "env", "file")}
    crictl = bed.dir / "crictl.yaml"
    crictl.write_text(f"runtime-endpoint: {dead['file']}\n")
    both = bed.env(CONTAINER_RUNTIME_ENDPOINT=dead["env"], CRI_CONFIG_FILE=str(crictl))
    assert dead["flag"] in _one_line_error(bed.run("-r", dead["flag"], "version", env=both, check=False))
    assert dead["env"] in _one_line_error(bed.run("version", env=both, check=False))
    file_only = bed.env(CRI_CONFIG_FILE=str(crictl))
    assert dead["file"] in _one_line_error(bed.run("version", env=file_only, check=False))
    assert dead["flag"] in _one_line_error(
        bed.run("-c", str(crictl), "-r", dead["flag"], "version", env=bed.env(), check=False)
    )
    # the default: the proxy's socket (reached or not, it is the one named)
    out = bed.run("version", env=bed.env(), check=False)
    assert out.returncode == 0 or DEFAULT_PROXY in out.stderr
    # a working endpoint from each source
    assert (
        "cri-proxy-fake-runtime"
        in bed.run("version", env=bed.env(CONTAINER_RUNTIME_ENDPOINT=bed.proxy)).stdout
    )
    crictl.write_text(f"runtime-endpoint: {bed.proxy}\ntimeout: 5\ndebug: true\n")
    out = bed.run("version", env=bed.env(CRI_CONFIG_FILE=str(crictl)))
    assert "cri-proxy-fake-runtime" in out.stdout
    assert "DEBU VersionRequest" in out.stderr  # debug: true from the file
    out = bed.run("-c", str(crictl), "version", env=bed.env())
    assert "DEBU VersionRequest" in out.stderr


def test_image_endpoint_defaults_to_the_runtime_endpoint_and_can_differ(bed: Bed) -> None:
    assert "localhost/busybox" in bed.run("images").stdout
    dead = f"unix://{bed.dir}/images.sock"
    line = _one_line_error(bed.run("-i", dead, "images", check=False))
    assert dead in line and "cannot reach the proxy" in line
    assert "localhost/busybox" in bed.run("images", env=bed.env(CONTAINER_RUNTIME_ENDPOINT=bed.proxy)).stdout
    line = _one_line_error(
        bed.run(
            "images",
            env=bed.env(CONTAINER_RUNTIME_ENDPOINT=bed.proxy, IMAGE_SERVICE_ENDPOINT=dead),
            check=False,
        )
    )
    assert dead in line


def test_missing_explicit_config_file_is_an_error(bed: Bed) -> None:
    line = _one_line_error(bed.run("-c", str(bed.dir / "nope.yaml"), "version", check=False))
    assert "nope.yaml" in line and "does not exist" in line


# -- pods and containers -----------------------------------------------------------------------------


def test_runp_create_start_from_json_and_yaml_then_list(bed: Bed) -> None:
    pod_a, cid_a, _ = _pod_and_container(bed, "alpha", fmt="yaml", via_cli=True)  # pod JSON, container YAML
    pod_b, cid_b, _ = _pod_and_container(bed, "beta", start=False, fmt="json", via_cli=True)  # YAML, JSON
    pods = bed.run("pods", "-q", "--label", "test=alpha").stdout.split()
    assert pods == [pod_a]
    assert set(bed.run("pods", "-q", "--namespace", "^ctl-test$").stdout.split()) >= {pod_a, pod_b}
    assert bed.run("pods", "-q", "--name", "^bet").stdout.split() == [pod_b]
    running = bed.run("ps", "-q").stdout.split()
    assert cid_a in running and cid_b not in running  # beta is only created
    everything = bed.run("ps", "-a", "-q").stdout.split()
    assert {cid_a, cid_b} <= set(everything)
    assert bed.run("ps", "-q", "--state", "created", "--name", "^beta$").stdout.split() == [cid_b]
    assert bed.run("ps", "-a", "-q", "--pod", pod_b[:10]).stdout.split() == [cid_b]
    assert bed.run("ps", "-q", "--latest").stdout.split()[0] == cid_b  # newest, any state
    assert bed.run("ps", "-q", "--last", "2").stdout.split() == [cid_b, cid_a]

    table = bed.run("ps", "-a", "--name", "^alpha$").stdout.splitlines()
    assert table[0].split() == [
        "CONTAINER",
        "IMAGE",
        "CREATED",
        "STATE",
        "NAME",
        "ATTEMPT",
        "POD",
        "ID",
        "POD",
        "NAMESPACE",
    ]
    row = table[1].split()
    assert row[0] == cid_a[:13] and row[1] == "localhost/busybox:latest"
    assert "Running" in row and "alpha" in row and pod_a[:13] in row and "ctl-test" in row
    assert "ago" in table[1]
    pods_table = bed.run("pods", "--label", "test=beta").stdout.splitlines()
    assert pods_table[0].split() == [
        "POD",
        "ID",
        "CREATED",
        "STATE",
        "NAME",
        "NAMESPACE",
        "ATTEMPT",
        "RUNTIME",
    ]
    assert (
        pods_table[1].startswith(pod_b[:13] + " ")
        and "Ready" in pods_table[1]
        and "(default)" in pods_table[1]
    )

    listed = bed.json("ps", "-a", "--name", "^alpha$", "-o", "json")
    assert isinstance(listed, dict)
    (container,) = listed["containers"]
    assert container["id"] == cid_a and container["podSandboxId"] == pod_a  # protobuf's JSON mapping
    assert container["state"] == "CONTAINER_RUNNING" and "createdAt" in container
    listed = bed.json("pods", "--id", pod_b[:8], "-o", "json")
    assert isinstance(listed, dict) and [p["id"] for p in listed["items"]] == [pod_b]
    yaml_text = bed.run("pods", "--id", pod_b, "-o", "yaml").stdout
    assert "podSandboxId" not in yaml_text and f"id: {pod_b}" in yaml_text


def test_inspect_has_camel_case_keys_and_update_shows(bed: Bed) -> None:
    pod, cid, _ = _pod_and_container(bed, "gamma")
    doc = bed.json("inspect", cid)
    assert isinstance(doc, dict)
    status = doc["status"]
    assert status["id"] == cid and status["state"] == "CONTAINER_RUNNING"
    assert "logPath" in status and "createdAt" in status and "T" in status["createdAt"]
    assert status["resources"]["linux"]["oomScoreAdj"] == "1000"
    assert "info" in doc  # verbose: the runtime's info map, parsed
    offline = bed.run("update", "--cpuset-cpus", "0,99", cid[:12], check=False)
    assert offline.returncode == 1 and "CPUs 99 that are not online" in offline.stderr
    # dry-run: the proxy forwards updates unchanged, so ctl does not refuse (see test_enforce for that)
    assert bed.run("update", "--cpuset-cpus", "0", "--cpu-share", "256", cid[:12]).stdout.strip() == cid[:12]
    linux = bed.json("inspect", cid)["status"]["resources"]["linux"]  # type: ignore[index]
    assert linux["cpusetCpus"] == "0" and linux["cpuShares"] == "256"
    (row,) = [r for r in bed.json("cpusets", "-o", "json") if r["id"] == cid]  # type: ignore[union-attr]
    assert row["decided"] == "0-1" and row["actual"] == "0" and row["mark"] == "DRY-RUN" and row["dry_run"]
    assert linux["oomScoreAdj"] == "1000"  # what was not given stays
    pod_doc = bed.json("inspectp", pod[:9])
    assert isinstance(pod_doc, dict) and pod_doc["status"]["id"] == pod
    assert pod_doc["status"]["metadata"]["name"] == "gamma" and "createdAt" in pod_doc["status"]
    both = bed.json("inspect", cid, cid)
    assert isinstance(both, list) and len(both) == 2
    assert "status:" in bed.run("inspect", "-o", "yaml", cid).stdout
    # --unpin: a usage error with the flags that pin; without a pin the proxy says there is none
    both = bed.run("update", "--unpin", "--cpuset-cpus", "0", cid[:12], check=False)
    assert both.returncode == 1 and "--unpin cannot be used with --cpuset-cpus or --force" in both.stderr
    none = bed.run("update", "--unpin", cid[:12], check=False)
    assert none.returncode == 1 and "ctl-test/gamma gamma" in none.stderr and "no operator pin" in none.stderr


def test_id_prefixes_unique_ambiguous_unknown(bed: Bed) -> None:
    from cri_proxy.client import CriClient

    pods: dict[str, str] = {}
    with CriClient(bed.proxy) as client:  # set-up in-process: only the lookups go through the CLI
        pb = client.pb
        for i in range(17):  # 16 hex digits: by the 17th pod two share a first character
            meta = pb.PodSandboxMetadata(name=f"prefix-{i}", namespace="ctl-test", uid=str(uuid.uuid4()))
            request = pb.RunPodSandboxRequest(config=pb.PodSandboxConfig(metadata=meta))
            pod = client.runtime.RunPodSandbox(request).pod_sandbox_id
            if pod[0] in pods:
                break
            pods[pod[0]] = pod
    first = pod[0]
    line = _one_line_error(bed.run("inspectp", first, check=False))
    assert "ambiguous" in line and pod[:13] in line and pods[first][:13] in line
    assert bed.json("inspectp", pod[:20])["status"]["id"] == pod  # type: ignore[index]
    line = _one_line_error(bed.run("inspect", "nosuchid", check=False))
    assert "'nosuchid' not found" in line
    line = _one_line_error(bed.run("stopp", "zzzz", check=False))
    assert "not found" in line


def test_exec_sync_as_crictl(bed: Bed) -> None:
    """crictl's -s: stdout then stderr, both on stdout, each with a newline after; a failing
    command is an error (exit 1) naming its exit code."""
    _, cid, _ = _pod_and_container(bed, "delta")
    out = bed.run("exec", "--sync", cid[:8], "echo", "x")
    assert out.stdout == "x\n\n\n"
    out = bed.run("exec", "-s", cid, "false", check=False)
    assert out.returncode == 1 and out.stdout == ""
    assert f"execing command in container {cid} synchronously: command 'false' exited with 1" in out.stderr
    out = bed.run("exec", "-s", cid, check=False)  # no command: the usage, as crictl
    assert out.returncode == 0 and "usage:" in out.stdout


def test_logs_read_the_log_file(bed: Bed) -> None:
    _, cid, pod_file = _pod_and_container(bed, "epsilon")
    log_dir = Path(json.loads(pod_file.read_text())["log_directory"]) if pod_file.suffix == ".json" else None
    if log_dir is None:
        import yaml

        log_dir = Path(yaml.safe_load(pod_file.read_text())["log_directory"])
    (log_dir / "epsilon").mkdir(parents=True)
    (log_dir / "epsilon" / "0.log").write_text(
        "2024-01-02T03:04:05.000000001Z stdout F first line\n"
        "2024-01-02T03:04:06Z stderr P half \n"
        "2024-01-02T03:04:06Z stderr F and half\n"
        "2024-01-02T03:04:07Z stdout F last line\n"
    )
    out = bed.run("logs", cid)
    assert out.stdout == "first line\nlast line\n" and out.stderr == "half and half\n"
    # crictl pads the fraction to nine digits (Go's RFC3339NanoFixed)
    assert bed.run("logs", "--tail", "1", "-t", cid).stdout == "2024-01-02T03:04:07.000000000Z last line\n"
    assert bed.run("logs", "--stream", "stderr", cid).stdout == ""


def test_stop_rm_stopp_rmp(bed: Bed) -> None:
    pod, cid, _ = _pod_and_container(bed, "zeta")
    line = _one_line_error(bed.run("rm", cid, check=False))
    assert "running, please stop it first" in line
    assert bed.run("stop", cid[:10]).stdout.strip() == cid[:10]
    assert bed.json("inspect", cid)["status"]["state"] == "CONTAINER_EXITED"  # type: ignore[index]
    assert bed.run("rm", cid).stdout.strip() == cid
    assert cid not in bed.run("ps", "-a", "-q").stdout
    line = _one_line_error(bed.run("rmp", pod, check=False))
    assert "running, please stop it first" in line
    assert bed.run("stopp", pod).stdout.strip() == f"Stopped sandbox {pod}"
    assert bed.run("rmp", pod).stdout.strip() == f"Removed sandbox {pod}"
    assert pod not in bed.run("pods", "-q").stdout
    pod2, cid2, _ = _pod_and_container(bed, "eta")
    assert bed.run("rmp", "-f", pod2).stdout.splitlines() == [
        f"Stopped sandbox {pod2}",
        f"Removed sandbox {pod2}",
    ]
    assert cid2 not in bed.run("ps", "-a", "-q").stdout


def test_images_info_stats(bed: Bed) -> None:
    lines = bed.run("images").stdout.splitlines()
    assert lines[0].split() == ["IMAGE", "TAG", "IMAGE", "ID", "SIZE"]
    assert any(
        line.split()[:2] == ["localhost/busybox", "latest"] and line.endswith("1.2MB") for line in lines
    )
    ids = bed.run("images", "-q").stdout.split()
    assert all(i.startswith("sha256:") for i in ids)
    doc = bed.json("inspecti", "localhost/busybox:latest")
    assert isinstance(doc, dict) and doc["status"]["repoTags"] == ["localhost/busybox:latest"]
    assert "imageFilesystems" in bed.json("imagefsinfo")["status"]  # type: ignore[index]
    info = bed.json("info")
    assert isinstance(info, dict) and info["status"]["conditions"][0]["type"] == "RuntimeReady"
    pod, cid, _ = _pod_and_container(bed, "theta")
    stats = bed.json("stats", "-o", "json", cid[:7])
    assert isinstance(stats, dict) and [s["attributes"]["id"] for s in stats["stats"]] == [cid]
    stats = bed.json("stats", "-o", "json", "--pod", pod[:9])
    assert isinstance(stats, dict) and [s["attributes"]["id"] for s in stats["stats"]] == [cid]
    out = bed.run("stats", "-s", "0", "--id", cid).stdout
    assert out.startswith("\033[2J\033[H")  # crictl clears the screen before each table
    table = out.removeprefix("\033[2J\033[H").splitlines()
    assert table[0].split() == ["CONTAINER", "NAME", "CPU", "%", "MEM", "DISK", "INODES", "SWAP"]
    assert table[1].startswith(cid[:13])
    assert "Image is up to date for localhost/extra:1" in bed.run("pull", "localhost/extra:1").stdout
    assert bed.run("rmi", "localhost/extra:1").stdout.strip() == "Deleted: localhost/extra:1"
    line = _one_line_error(bed.run("rmi", "localhost/extra:1", check=False))
    assert "no such image" in line


# -- call ----------------------------------------------------------------------------------------------


def test_call_a_method_of_each_service_and_versions(bed: Bed) -> None:
    version = bed.json("call", "RuntimeService/Version", "{}")
    assert isinstance(version, dict) and version["runtimeName"] == "cri-proxy-fake-runtime"
    images = bed.json("call", "runtime.v1.ImageService/ListImages")
    assert isinstance(images, dict) and any(
        "localhost/busybox:latest" in i["repoTags"] for i in images["images"]
    )
    old = bed.json("call", "--api", "v1alpha2", "RuntimeService/Version", '{"version": "v1alpha2"}')
    assert isinstance(old, dict) and old["runtimeApiVersion"] == "v1alpha2"
    status = bed.json("call", "ImageStatus", '{"image": {"image": "localhost/pause:latest"}}')
    assert isinstance(status, dict) and status["image"]["repoTags"] == ["localhost/pause:latest"]
    request = bed.dir / "request.json"
    request.write_text('{"filter": {"labelSelector": {"test": "nobody"}}}')
    assert bed.json("call", "ListPodSandbox", f"@{request}") == {}
    assert "runtime.v1alpha2.ImageService/PullImage" in bed.run("call", "--list").stdout


def test_call_errors(bed: Bed) -> None:
    line = _one_line_error(bed.run("call", "RuntimeService/NoSuchMethod", check=False))
    assert "unknown method" in line and "NoSuchMethod" in line
    line = _one_line_error(bed.run("call", "RuntimeService/Version", "{not json", check=False))
    assert "request for runtime.v1.RuntimeService/Version" in line
    line = _one_line_error(
        bed.run("call", "RuntimeService/ContainerStatus", '{"containerId": "nope"}', check=False)
    )
    assert "answered NOT_FOUND" in line


# -- bypass and errors ---------------------------------------------------------------------------------


def test_bypass_reaches_the_runtime_with_the_proxy_down(bed: Bed) -> None:
    dead_proxy = bed.env(CONTAINER_RUNTIME_ENDPOINT=f"unix://{bed.dir}/dead-proxy.sock")
    line = _one_line_error(bed.run("version", env=dead_proxy, check=False))
    assert "cannot reach the proxy at" in line and "dead-proxy.sock" in line
    out = bed.run("--bypass", "--proxy-config", str(bed.proxy_config), "version", env=dead_proxy)
    assert "RuntimeName:  cri-proxy-fake-runtime" in out.stdout
    out = bed.run(
        "--bypass",
        "--proxy-config",
        str(bed.proxy_config),
        "call",
        "ImageService/ImageFsInfo",
        env=dead_proxy,
    )
    assert "imageFilesystems" in out.stdout
    gone = bed.dir / "gone.toml"
    gone.write_text(f'runtime_endpoint = "unix://{bed.dir}/gone.sock"\n')
    line = _one_line_error(
        bed.run("--bypass", "--proxy-config", str(gone), "ps", env=dead_proxy, check=False)
    )
    assert "cannot reach the runtime at" in line and "gone.sock" in line
    line = _one_line_error(
        bed.run("--bypass", "--proxy-config", str(bed.proxy_config), "cpusets", env=dead_proxy, check=False)
    )
    assert "--bypass" in line
    line = _one_line_error(bed.run("--bypass", "-r", bed.proxy, "version", env=bed.env(), check=False))
    assert "contradict" in line


def test_usage_errors_exit_as_crictl(bed: Bed) -> None:
    """crictl: 1 for a bad flag or value (urfave/cli's "Incorrect Usage"), 3 for an unknown command."""
    for args in (
        ("ps", "-o", "xml"),
        ("ps", "--label", "novalue"),
        ("pods", "--state", "sleepy"),
        ("ps", "--no-such-flag"),
        ("--no-such-flag", "version"),
        ("ps", "-n", "abc"),
    ):
        out = bed.run(*args, check=False)
        assert out.returncode == 1, (args, out.returncode, out.stderr)
        assert "Traceback" not in out.stderr and out.stderr.strip()
    out = bed.run("no-such-command", check=False)
    assert (out.returncode, out.stderr.strip()) == (3, "No help topic for 'no-such-command'")
    assert bed.run("help", "no-such-command", check=False).returncode == 3


# -- what only the proxy knows -----------------------------------------------------------------------


def test_cpusets_pools_problems(bed: Bed) -> None:
    _, cid, _ = _pod_and_container(bed, "iota")
    broken = _pod_config(bed, "kappa", annotations={"scheduling.koordinator.sh/resource-status": "nope"})
    bad_pod = bed.run("runp", str(broken)).stdout.strip()
    bed.run("create", bad_pod, str(_container_config(bed, "kappa")), str(broken))
    rows = bed.json("cpusets", "-o", "json")
    assert isinstance(rows, list)
    (row,) = [r for r in rows if r["id"] == cid]
    assert row["pod"] == "ctl-test/iota" and row["qos"] == "BE"
    table = bed.run("cpusets").stdout.splitlines()
    assert table[0].split() == ["POD", "CONTAINER", "ID", "STATE", "QOS", "DECIDED", "ACTUAL", "MARK", "WHY"]
    assert any(line.startswith("ctl-test/iota") and cid[:13] in line for line in table)
    pools = bed.json("pools", "-o", "json")
    assert isinstance(pools, dict) and pools["dry_run"] is True
    assert "dry-run: the proxy decides and reports, changes nothing" in bed.run("pools").stdout
    by_pool = {p["pool"]: p for p in pools["pools"]}
    assert cid in [c["id"] for c in by_pool["BE"]["containers"]]
    lines = bed.run("pools").stdout.splitlines()
    assert lines[0].split() == ["POOL", "CPUS", "CONTAINERS"]
    assert [line.split()[0] for line in lines[1:]][:6] == ["reserved", "LSE", "LSR", "kubelet", "LS", "BE"]
    found = bed.json("problems", "-o", "json")
    assert isinstance(found, dict) and any(p["pod"] == "ctl-test/kappa" for p in found["problems"])
    cpus = bed.json("cpus", "-o", "json")
    assert isinstance(cpus, dict) and [r["cpu"] for r in cpus["cpus"]] == list(range(len(cpus["cpus"])))
    assert cpus["dry_run"] is True and all(r["pools"] for r in cpus["cpus"])
    lines = bed.run("cpus").stdout.splitlines()
    assert lines[0].split() == ["CPU", "POOL", "HOLDER", "CONTAINERS", "CONFLICTS"]
    assert "\x1b[" not in "\n".join(lines)  # no colour into a pipe
    lines = bed.run("problems").stdout.splitlines()
    assert lines[0].split() == ["POD", "KIND", "MESSAGE"]
    assert any(line.startswith("ctl-test/kappa ") for line in lines[1:])
    plan = bed.json("plan")
    assert isinstance(plan, dict) and cid in plan["containers"]
    status = bed.json("status", "-o", "json")
    assert isinstance(status, dict) and "topology" in bed.json("snapshot")  # type: ignore[operator]
    assert yaml.safe_load(bed.run("status", "-o", "yaml").stdout) == status
    table = bed.run("status").stdout.splitlines()  # a table by default, one row per figure
    assert table[0].split() == ["KEY", "VALUE"] and ["pods", str(status["pods"])] in [
        r.split() for r in table
    ]


def test_a_proxy_whose_runtime_is_down_says_so(tmp_path: Path) -> None:
    sock = tmp_path / "p.sock"
    proxy = _start(
        [
            "serve",
            "--config",
            "/dev/null",
            "--listen",
            f"unix://{sock}",
            "--runtime-endpoint",
            f"unix://{tmp_path}/no-runtime.sock",
            "--state-dir",
            str(tmp_path / "state"),
            "--kubelet-state-file",
            str(tmp_path / "cpu_manager_state"),
            "--dry-run",
        ],
        tmp_path / "proxy.log",
    )
    try:
        _wait_for_socket(sock, proxy)
        env = {k: v for k, v in os.environ.items() if k != "CONTAINER_RUNTIME_ENDPOINT"}
        out = subprocess.run(
            [CLI, "ctl", "-c", "/dev/null", "-r", f"unix://{sock}", "ps"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        line = _one_line_error(out)
        assert f"the proxy at unix://{sock} answered UNAVAILABLE" in line and "no-runtime.sock" in line
    finally:
        _stop(proxy)


# -- start-up and the light HTTP/2 client --------------------------------------------------------


def test_version_imports_neither_grpc_nor_protobuf(bed: Bed) -> None:
    """`ctl version` is the start-up path kept light (docs/performance.md): no grpcio, no protobuf,
    no CRI messages, and only the version command's parser."""
    heavy = ("grpc", "google.protobuf", "cri_api.v1.api_pb2", "yaml", "cri_proxy.config")
    probe = (
        "import sys; from cri_proxy.cli import main; code = main(['ctl', '-r', sys.argv[1], 'version']); "
        f"heavy = sorted(m for m in {heavy!r} if m in sys.modules); print('HEAVY', heavy); sys.exit(code)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, bed.proxy], capture_output=True, text=True, timeout=60, env=bed.env()
    )
    assert out.returncode == 0, out.stderr
    assert "RuntimeName:  fake-runtime" in out.stdout or "RuntimeName:" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "HEAVY []"


def test_light_client_answers_and_failures(bed: Bed, tmp_path: Path) -> None:
    import socket as sockets

    from cri_api.v1 import api_pb2 as pb
    from cri_proxy.ctl.h2unary import Connection, RpcFailure, address_of

    address = address_of(bed.runtime)
    assert address is not None and address_of("tcp://127.0.0.1:80") == ("127.0.0.1", 80)
    wire = Connection(address, bed.runtime)
    try:
        answer = pb.VersionResponse.FromString(
            wire.unary("/runtime.v1.RuntimeService/Version", pb.VersionRequest().SerializeToString(), 10)
        )
        assert answer.runtime_api_version == "v1"
        with pytest.raises(RpcFailure) as failed:  # the same connection, the next stream
            request = pb.ContainerStatusRequest(container_id="no-such-container")
            wire.unary("/runtime.v1.RuntimeService/ContainerStatus", request.SerializeToString(), 10)
        assert failed.value.code().name == "NOT_FOUND" and "no-such-container" in failed.value.details()
        with pytest.raises(RpcFailure) as failed:
            wire.unary("/runtime.v1.RuntimeService/NoSuchMethod", b"", 10)
        assert failed.value.code().name == "UNIMPLEMENTED"
    finally:
        wire.close()

    with pytest.raises(RpcFailure) as failed:
        Connection(str(tmp_path / "nobody.sock"), "unix:///nobody.sock").unary("/x/Y", b"", 5)
    assert failed.value.code().name == "UNAVAILABLE" and "No such file" in failed.value.details()

    silent = sockets.socket(sockets.AF_UNIX)  # accepts, never answers: the deadline ends the call
    silent.bind(str(tmp_path / "silent.sock"))
    silent.listen()
    try:
        with pytest.raises(RpcFailure) as failed:
            Connection(str(tmp_path / "silent.sock"), "silent").unary("/x/Y", b"", 0.5)
        assert failed.value.code().name == "DEADLINE_EXCEEDED"
    finally:
        silent.close()


def test_help_version_config_completion(bed: Bed, tmp_path: Path) -> None:
    out = bed.run("--version")
    assert out.stdout.startswith("cri-proxy ctl version ")
    assert "usage: cri-proxy ctl ps" in bed.run("help", "ps").stdout
    assert "attach" in bed.run("help").stdout and "port-forward" in bed.run("--help").stdout
    config = tmp_path / "crictl.yaml"
    assert bed.run("-c", str(config), "config", "--set", "timeout=5,debug=true").returncode == 0
    assert bed.run("-c", str(config), "config", "runtime-endpoint", "unix:///x.sock").returncode == 0
    assert bed.run("-c", str(config), "config", "--get", "timeout").stdout == "5\n"
    assert yaml.safe_load(config.read_text()) == {
        "runtime-endpoint": "unix:///x.sock",
        "image-endpoint": "",
        "timeout": 5,
        "debug": True,
        "pull-image-on-create": False,
        "disable-pull-on-run": False,
    }
    out = bed.run("-c", str(config), "config", "--set", "timeout=soon", check=False)
    assert out.returncode == 1 and "timeout" in out.stderr
    for shell in ("bash", "zsh", "fish"):
        script = bed.run("completion", shell).stdout
        assert "cri-proxy" in script and "port-forward" in script
    if os.path.exists("/bin/bash"):
        check = subprocess.run(["/bin/bash", "-n"], input=bed.run("completion", "bash").stdout, text=True)
        assert check.returncode == 0


def test_streaming_is_refused_clearly_by_a_runtime_without_it(bed: Bed) -> None:
    """The fake runtime has no streaming server: exec/attach/port-forward say so and exit 1."""
    _, cid, _ = _pod_and_container(bed, "lambda")
    for args in (("exec", "-it", cid, "sh"), ("attach", cid), ("exec", cid, "true")):
        out = bed.run(*args, check=False)
        assert out.returncode == 1 and "Traceback" not in out.stderr and out.stderr.strip(), args


def test_events_stream_as_crictl_prints_them(bed: Bed) -> None:
    """`events`: one document per container event (the fake runtime streams them), and a
    template refused with a format that is not go-template."""
    import queue
    import threading

    argv = [
        CLI,
        "ctl",
        "-r",
        bed.proxy,
        "events",
        "-o",
        "go-template",
        "--template",
        "{{.containerEventType}}",
    ]
    watcher = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=bed.env())
    lines: queue.Queue[str] = queue.Queue()
    assert watcher.stdout is not None
    threading.Thread(target=lambda: [lines.put(line) for line in watcher.stdout or ()], daemon=True).start()
    try:
        first = None
        for attempt in range(10):  # until the watcher is subscribed: each try makes a container
            _pod_and_container(bed, f"mu{attempt}")
            try:
                first = lines.get(timeout=3).strip()
                break
            except queue.Empty:
                assert watcher.poll() is None, watcher.stderr.read() if watcher.stderr else ""
        assert first is not None and first.startswith("CONTAINER_") and first.endswith("_EVENT"), first
    finally:
        watcher.terminate()
        watcher.wait(10)
    out = bed.run("events", "--template", "{{.x}}", check=False)
    assert out.returncode == 1 and "template can't be used" in out.stderr


def test_the_proxy_views_ask_without_grpcio(bed: Bed) -> None:
    """`ctl status` (and every view) asks the admin socket over the light HTTP/2 client: grpcio is
    not imported for it."""
    probe = (
        "import sys; from cri_proxy.cli import main; "
        "code = main(['ctl', '-r', sys.argv[1], 'status', '-o', 'json']); "
        "print('GRPC', 'grpc' in sys.modules); sys.exit(code)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, bed.proxy], capture_output=True, text=True, timeout=60, env=bed.env()
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "GRPC False" and json.loads("\n".join(lines[:-1]))["dry_run"] is True
