#!/usr/bin/env python3
"""Where a hooked create's added time goes, seen from the kernel: scheduler events and the proxy's
socket calls, recorded with ftrace while creates go direct and through the proxy in turns.

bench/relay.py says how much a create through the proxy adds; this says in which span of the call
it is added. Each create is cut at the moments the kernel records: the client's write of the
request waking the proxy, the proxy's read and its write to the runtime, the runtime waking the
proxy with the answer, the proxy's write waking the client, the client's return. The direct call
has the same spans without the proxy's. Per span it prints the median over the run, direct and
proxied, and how often the thread a write woke had to wait for the proxy's CPU (a Unix socket's
write wakes its reader on the writer's CPU, as if the writer were about to sleep).

    .venv/bin/python bench/create_trace.py --runtime-root /dev/shm            # ~1 min, root
    .venv/bin/python bench/create_trace.py --runtime-root /dev/shm --start    # each container started
    .venv/bin/python bench/create_trace.py --keep trace.txt                   # the raw trace kept

It needs root and tracefs (mounted at /sys/kernel/tracing when it is not). ftrace itself adds a
few µs per event, to both paths alike; figures are comparable within a run, not with bench/relay.py's.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from common import free_port, runtime, start_proxy, stop_all
from relay import Target, remove_pods

from cri_api.v1 import api_pb2 as pb

TRACEFS = Path("/sys/kernel/tracing")
SCHED = ("sched_switch", "sched_waking", "sched_wakeup")
READ, WRITE, WRITEV = 0, 1, 20  # x86-64 syscall numbers
WARM = 10  # rounds not counted
LINE = re.compile(r"^\s*(.+?)-(\d+)\s+\[(\d+)\]\s+\S+\s+([\d.]+): (\w+): (.*)$")


@dataclass(frozen=True, slots=True)
class Event:
    at: float  # µs
    comm: str
    tid: int
    cpu: int
    kind: str
    rest: str

    def fields(self) -> dict[str, str]:
        return dict(part.split("=", 1) for part in self.rest.split() if "=" in part)


@dataclass
class Window:
    """One create: its path, its events between the client's marks, its wall time (µs)."""

    path: str
    start: float
    end: float = 0.0
    events: list[Event] = field(default_factory=list)


class Tracer:
    """ftrace on: scheduler events for everything, read/write/writev of the proxy's loop thread,
    and the bench's marks; off and read back at the end."""

    def __init__(self, proxy_tid: int) -> None:
        if not (TRACEFS / "trace_marker").exists():
            subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], check=True)
        self.proxy_tid = proxy_tid
        self.marker = (TRACEFS / "trace_marker").open("w")
        self.buffer_kb = (TRACEFS / "buffer_size_kb").read_text().split()[0]  # given back at the end

    def _set(self, name: str, value: str) -> None:
        (TRACEFS / name).write_text(value)

    def start(self) -> None:
        self._set("tracing_on", "0")
        self._set("buffer_size_kb", "131072")
        self._set("trace", "")
        for event in SCHED:
            self._set(f"events/sched/{event}/enable", "1")
        calls = f"common_pid == {self.proxy_tid} && (id == {READ} || id == {WRITE} || id == {WRITEV})"
        for event in ("sys_enter", "sys_exit"):
            self._set(f"events/raw_syscalls/{event}/filter", calls)
            self._set(f"events/raw_syscalls/{event}/enable", "1")
        self._set("tracing_on", "1")

    def mark(self, text: str) -> None:
        self.marker.write(text + "\n")
        self.marker.flush()

    def stop(self) -> str:
        self._set("tracing_on", "0")
        self._set("events/enable", "0")
        for event in ("sys_enter", "sys_exit"):
            self._set(f"events/raw_syscalls/{event}/filter", "0")
        text = (TRACEFS / "trace").read_text()
        self._set("trace", "")
        self._set("buffer_size_kb", self.buffer_kb)
        self.marker.close()
        return text


def windows(text: str) -> list[Window]:
    """The creates marked in the trace ("CS path i" ... "CE path i"), each with its events."""
    found: list[Window] = []
    current: Window | None = None
    for line in text.splitlines():
        m = LINE.match(line)
        if m is None:
            continue
        comm, tid, cpu, at, kind, rest = m.groups()
        event = Event(float(at) * 1e6, comm, int(tid), int(cpu), kind, rest)
        if kind == "tracing_mark_write":
            words = rest.split()
            if words[0] == "CS":
                current = Window(words[1], event.at)
            elif words[0] == "CE" and current is not None:
                current.end = event.at
                found.append(current)
                current = None
        elif current is not None:
            current.events.append(event)
    return found


def _syscall(event: Event, kind: str, numbers: tuple[int, ...]) -> bool:
    return event.kind == kind and event.rest.startswith("NR ") and int(event.rest.split()[1]) in numbers


def _read_bytes(event: Event) -> int:
    return int(event.rest.rsplit("=", 1)[1]) if _syscall(event, "sys_exit", (READ,)) else -1


def _wakes(event: Event, waker: set[int] | None, woken: set[int] | str) -> bool:
    """A sched_waking by a thread of `waker` (None: any) of a thread in `woken` (or of that comm)."""
    if event.kind != "sched_waking" or (waker is not None and event.tid not in waker):
        return False
    f = event.fields()
    return f.get("comm") == woken if isinstance(woken, str) else int(f.get("pid", -1)) in woken


def _during(events: list[Event], i: int) -> list[Event]:
    """The events from the syscall entered at `i` to its exit (what the call itself did)."""
    out = []
    for event in events[i + 1 :]:
        if event.kind == "sys_exit":
            break
        out.append(event)
    return out


def _woken_wait(events: list[Event], i: int) -> tuple[float, bool] | None:
    """For the sched_waking at `i`: how long its thread waited to run, and whether it was put on
    the waker's CPU."""
    waking = events[i]
    pid = waking.fields()["pid"]
    same = None
    for event in events[i + 1 :]:
        f = event.fields()
        if event.kind == "sched_wakeup" and f.get("pid") == pid and same is None:
            same = int(f["target_cpu"]) == waking.cpu
        if event.kind == "sched_switch" and f.get("next_pid") == pid:
            return event.at - waking.at, bool(same)
    return None


def _off_cpu(events: list[Event], i: int, tid: int) -> float | None:
    """When thread `tid` next leaves its CPU after event `i`."""
    for event in events[i:]:
        if event.kind == "sched_switch" and event.fields().get("prev_pid") == str(tid):
            return event.at
    return None


def proxied(w: Window, proxy: int, client: set[int]) -> dict[str, float] | None:
    """The spans of a create through the proxy (µs), or None when one of its moments is missing."""
    ev = w.events
    woke = next((i for i, e in enumerate(ev) if _wakes(e, client, {proxy})), None)
    if woke is None:
        return None
    read = next((i for i in range(woke, len(ev)) if _read_bytes(ev[i]) >= 200), None)
    if read is None:
        return None
    sent = next((i for i in range(read, len(ev)) if _syscall(ev[i], "sys_enter", (WRITE, WRITEV))), None)
    if sent is None:
        return None
    # the answer's write: the proxy's last write that wakes a client thread
    answer = None
    for i in range(len(ev) - 1, sent, -1):
        if _syscall(ev[i], "sys_enter", (WRITE, WRITEV)) and any(
            _wakes(e, {proxy}, client) for e in _during(ev, i)
        ):
            answer = i
            break
    if answer is None:
        return None
    got = next((i for i in range(answer, sent, -1) if _read_bytes(ev[i]) > 0), None)
    back = next(
        (i for i in range(got or sent, sent, -1) if _wakes(ev[i], None, {proxy}) and ev[i].tid != proxy), None
    )
    if got is None or back is None:
        return None
    spans = {
        "client_write": ev[woke].at - w.start,
        "proxy_wake": ev[read].at - ev[woke].at,
        "proxy_request": ev[sent].at - ev[read].at,
        "runtime": ev[back].at - ev[sent].at,
        "proxy_wake_answer": ev[got].at - ev[back].at,
        "proxy_answer": ev[answer].at - ev[got].at,
        "client_return": w.end - ev[answer].at,
        "total": w.end - w.start,
    }
    for start, name in ((sent, "request"), (answer, "answer")):
        off = _off_cpu(ev, start, proxy)
        if off is not None:
            spans[f"proxy_on_after_{name}"] = off - ev[start].at
        # the thread the write woke (its reader): the first the proxy wakes during the write
        woken = [e for e in _during(ev, start) if e.kind == "sched_waking" and e.tid == proxy]
        if woken:
            waited = _woken_wait(ev, ev.index(woken[0]))
            if waited is not None:
                spans[f"woken_wait_{name}"], same = waited
                spans[f"woken_same_cpu_{name}"] = float(same)
    return spans


def direct(w: Window, client: set[int]) -> dict[str, float] | None:
    ev = w.events
    sent = next((i for i, e in enumerate(ev) if _wakes(e, client, "containerd")), None)
    back = next(
        (i for i in range(len(ev) - 1, -1, -1) if ev[i].comm == "containerd" and _wakes(ev[i], None, client)),
        None,
    )
    if sent is None or back is None or back < sent:
        return None
    return {
        "client_write": ev[sent].at - w.start,
        "runtime": ev[back].at - ev[sent].at,
        "client_return": w.end - ev[back].at,
        "total": w.end - w.start,
    }


def report(found: list[Window], proxy: int, client: set[int]) -> None:
    rows: dict[str, list[dict[str, float]]] = {"d": [], "p": []}
    for w in found:
        spans = proxied(w, proxy, client) if w.path == "p" else direct(w, client)
        if spans is not None:
            rows[w.path].append(spans)

    def med(path: str, key: str) -> float | None:
        values = [r[key] for r in rows[path] if key in r]
        return statistics.median(values) if values else None

    print(f"creates read: {len(rows['d'])} direct, {len(rows['p'])} through the proxy (medians, µs)")
    names = (
        ("client_write", "client: the call to its request's write"),
        ("proxy_wake", "proxy: woken to the request read"),
        ("proxy_request", "proxy: request read to its write"),
        ("runtime", "runtime: the request's write to the answer's"),
        ("proxy_wake_answer", "proxy: woken to the answer read"),
        ("proxy_answer", "proxy: answer read to its write"),
        ("client_return", "client: the answer's write to the return"),
        ("total", "the call"),
    )
    print(f"{'span':48s} {'direct':>9s} {'proxy':>9s} {'added':>9s}")
    for key, text in names:
        d, p = med("d", key), med("p", key)
        added = "" if d is None or p is None else f"{p - d:+9.1f}"
        shown = ["" if v is None else f"{v:9.1f}" for v in (d, p)]
        print(f"{text:48s} {shown[0]:>9s} {shown[1]:>9s} {added}")
    for name, who in (("request", "the runtime's thread"), ("answer", "the client's thread")):
        waits = [r for r in rows["p"] if f"woken_wait_{name}" in r]
        same = [r[f"woken_wait_{name}"] for r in waits if r[f"woken_same_cpu_{name}"]]
        other = [r[f"woken_wait_{name}"] for r in waits if not r[f"woken_same_cpu_{name}"]]
        on = med("p", f"proxy_on_after_{name}")
        print(
            f"after the {name}'s write: the proxy runs on {on or 0:.1f}; {who} it woke was put on"
            f" the proxy's CPU in {len(same)} of {len(waits)} creates and waited"
            f" {statistics.median(same) if same else 0:.1f} to run there,"
            f" {statistics.median(other) if other else 0:.1f} elsewhere"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--creates", type=int, default=120, help="creates per path (default 120)")
    parser.add_argument("--start", action="store_true", help="start each container after its create")
    parser.add_argument("--runtime-root", help="where containerd keeps its root and state (/dev/shm: tmpfs)")
    parser.add_argument("--keep", type=Path, help="write the raw trace to this file")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("create_trace needs root (ftrace)")
    work = Path(tempfile.mkdtemp(prefix="cri-trace-"))
    with runtime("containerd", work, args.runtime_root) as address:
        procs: list[subprocess.Popen[bytes]] = []
        try:
            config = work / "proxy.toml"
            config.write_text("reconcile_period_seconds = 0\n")
            proc, proxy_address = start_proxy(
                work,
                address,
                "--config",
                str(config),
                "--metrics-address",
                f"127.0.0.1:{free_port()}",
                log=work / "proxy.log",
            )
            procs.append(proc)
            text, client = run(args, Target(address), Target(proxy_address), proc.pid)
        finally:
            stop_all(procs)
    if args.keep:
        args.keep.write_text(text)
    report(windows(text)[2 * WARM :], proc.pid, client)


def run(args: argparse.Namespace, d: Target, p: Target, proxy_pid: int) -> tuple[str, set[int]]:
    """The creates, traced: (the trace, the bench's own thread ids)."""
    from kube import container_config, pod_sandbox_config  # tests/e2e, on the path once relay is imported

    targets = {"d": d, "p": p}
    run_pod = {k: t.call("/runtime.v1.RuntimeService/RunPodSandbox") for k, t in targets.items()}
    create = {k: t.call("/runtime.v1.RuntimeService/CreateContainer") for k, t in targets.items()}
    start = {k: t.call("/runtime.v1.RuntimeService/StartContainer") for k, t in targets.items()}
    cpus = Path("/sys/devices/system/cpu/online").read_text().strip()
    pods = {}
    for k in targets:
        config = pod_sandbox_config(pb, f"trace-{k}", qos="besteffort", labels={"bench": "hooked"})
        request = pb.RunPodSandboxRequest(config=config).SerializeToString()
        pods[k] = (
            pb.RunPodSandboxResponse.FromString(run_pod[k](request, timeout=60)).pod_sandbox_id,
            config,
        )
    tracer = Tracer(proxy_pid)
    tracer.start()
    try:
        for i in range(args.creates + WARM):
            for k in ("d", "p") if i % 2 == 0 else ("p", "d"):
                pod_id, pod_config = pods[k]
                config = container_config(pb, pod_config, f"t{k}{i}")
                if k == "d":  # the cpuset the proxy would set, so that both create the same
                    config.linux.resources.cpuset_cpus = cpus
                request = pb.CreateContainerRequest(
                    pod_sandbox_id=pod_id, config=config, sandbox_config=pod_config
                ).SerializeToString()
                tracer.mark(f"CS {k} {i}")
                reply = create[k](request, timeout=60)
                tracer.mark(f"CE {k} {i}")
                if args.start:
                    cid = pb.CreateContainerResponse.FromString(reply).container_id
                    start[k](pb.StartContainerRequest(container_id=cid).SerializeToString(), timeout=60)
        threads = {int(t) for t in os.listdir("/proc/self/task")}
    finally:
        text = tracer.stop()
    remove_pods([(targets[k], pods[k][0]) for k in targets])
    return text, threads


if __name__ == "__main__":
    main()
