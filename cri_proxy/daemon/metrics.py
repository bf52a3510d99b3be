"""Prometheus metrics: calls and latency from the relay, the rest read from the live objects.

On a call's path only its figures are kept (`CallMetrics.observe`), counted in batches; everything
that is state (pods, containers, problems, reconcile totals, injections) is read at scrape time.
No `*_created` series: they double the series count and say nothing a restart time would not.
"""

from __future__ import annotations

import platform
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import INF, floatToGoString

from cri_proxy import __version__
from cri_proxy.relay.methods import KNOWN

disable_created_metrics()  # type: ignore[no-untyped-call]  # process-wide in prometheus_client; this module owns the proxy's metrics

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
OVERHEAD_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1, 5)


def method_label(path: str) -> str:
    """Known methods by name (`RuntimeService/Version`); anything else `other`, to bound cardinality."""
    info = KNOWN.get(path)
    return f"{info.service}/{info.name}" if info is not None else "other"


class CallMetrics(Collector):
    """What the relay records per call: count by method and code, total and runtime time.

    A call only appends its figures (`observe`); they are folded into the counts a batch at a time,
    at a scrape or once `FOLD_AT` wait. Counted per call by prometheus_client's own Counter and
    Histograms (a lock per value, a walk over the buckets, four objects, run cold between calls),
    they cost a `Version` call ~25 µs of proxy CPU on a 2-vCPU VM, a tenth of the relay's; folded a
    batch at a time the same work runs hot. The series read exactly as prometheus_client's would
    (`test_call_metrics.py` compares them)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.pending: list[tuple[str, grpc.StatusCode, float, float]] = []
        self._calls: dict[tuple[str, str], int] = {}  # (method, code name) -> calls
        self._times: dict[str, _MethodTimes] = {}  # method -> its three histograms
        self._methods: dict[str, str] = {}  # path -> method label, for known paths only (bounded)
        if registry is not None:
            registry.register(self)

    def observe(self, path: str, code: grpc.StatusCode, total: float, upstream: float) -> None:
        pending = self.pending
        pending.append((path, code, total, upstream))
        if len(pending) >= FOLD_AT:
            self.fold()

    def fold(self) -> None:
        """Count the calls observed since the last fold."""
        pending, self.pending = self.pending, []
        calls, times, methods = self._calls, self._times, self._methods
        for path, code, total, upstream in pending:
            method = methods.get(path)
            if method is None:
                method = method_label(path)
                if path in KNOWN:
                    methods[path] = method
            key = (method, code.name)
            calls[key] = calls.get(key, 0) + 1
            kept = times.get(method)
            if kept is None:
                kept = times[method] = _MethodTimes()
            kept.add(total, upstream)

    def describe(self) -> Iterator[Any]:
        return iter(())  # collected at each scrape: nothing to check at registration

    def collect(self) -> Iterator[Any]:
        self.fold()
        calls = CounterMetricFamily(
            "cri_proxy_calls", "CRI calls relayed, by method and status code", labels=["method", "code"]
        )
        for (method, code), n in self._calls.items():
            calls.add_metric([method, code], n)
        yield calls
        for index, (name, help_text, _) in enumerate(HISTOGRAMS):
            family = HistogramMetricFamily(name, help_text, labels=["method"])
            for method, kept in self._times.items():
                family.add_metric([method], kept.buckets(index), kept.sums[index])
            yield family


FOLD_AT = 512  # calls observed and not yet counted, at most (~12 KiB; a fold of them ~0.5 ms cold)

HISTOGRAMS = (
    ("cri_proxy_call_duration_seconds", "CRI call time as the caller sees it", LATENCY_BUCKETS),
    ("cri_proxy_runtime_duration_seconds", "of which the runtime's own time", LATENCY_BUCKETS),
    ("cri_proxy_overhead_seconds", "of which the proxy's own time (hooks included)", OVERHEAD_BUCKETS),
)
BOUNDS = tuple(bounds for _, _, bounds in HISTOGRAMS)
LE = tuple(
    tuple(floatToGoString(b) for b in (*bounds, INF))  # type: ignore[no-untyped-call]
    for bounds in BOUNDS
)  # each histogram's bucket bounds as the exposition writes them ("0.0005", ..., "+Inf")


class _MethodTimes:
    """One method's three histograms (`HISTOGRAMS`): per-bucket counts (the last one past every
    bound) and sums."""

    __slots__ = ("counts", "sums")

    def __init__(self) -> None:
        self.counts = tuple([0] * (len(bounds) + 1) for bounds in BOUNDS)
        self.sums = [0.0] * len(BOUNDS)

    def add(self, total: float, upstream: float) -> None:
        counts, sums = self.counts, self.sums
        for index, value in enumerate((total, upstream, max(0.0, total - upstream))):
            counts[index][bisect_left(BOUNDS[index], value)] += 1  # the first bound >= the value: "le"
            sums[index] += value

    def buckets(self, index: int) -> list[tuple[str, float]]:
        """Histogram `index`'s cumulative counts by upper bound, as the exposition format has them."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip(LE[index], self.counts[index], strict=True):
            running += n
            out.append((bound, running))
        return out


class StateCollector(Collector):
    """Gauges and counters read from the proxy's objects when Prometheus scrapes."""

    def __init__(self, read: Callable[[], dict[str, Any]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Any]:
        s = self.read()
        info = GaugeMetricFamily(
            "cri_proxy_build_info", "1, labelled with the build", labels=["version", "python"]
        )
        info.add_metric([__version__, platform.python_version()], 1)
        yield info
        yield GaugeMetricFamily(
            "cri_proxy_dry_run",
            "1 when the proxy decides and reports but changes nothing (dry_run)",
            value=1 if s["dry_run"] else 0,
        )
        yield CounterMetricFamily(
            "cri_proxy_cpuset_updates_replaced",
            "UpdateContainerResources requests whose cpuset the proxy replaced with its decision",
            value=s["replaced"],
        )
        yield CounterMetricFamily(
            "cri_proxy_log_lines_dropped",
            "log lines dropped because stderr (journald) did not take them in time",
            value=s.get("log_lines_dropped", 0),
        )
        yield GaugeMetricFamily(
            "cri_proxy_checkpoint_unsaved_seconds",
            "how long the checkpoint has lacked a change of the state (0: it holds them all); "
            "grows while the state directory's disk is full, read-only or stalled",
            value=s.get("checkpoint_unsaved_seconds", 0.0),
        )
        yield GaugeMetricFamily("cri_proxy_pods_tracked", "pod sandboxes the proxy knows", value=s["pods"])
        yield GaugeMetricFamily(
            "cri_proxy_containers_tracked", "containers the proxy knows", value=s["containers"]
        )
        yield GaugeMetricFamily(
            "cri_proxy_runtime_up",
            "1 when the runtime answered its last check",
            value=1 if s["runtime_up"] else 0,
        )
        injections = CounterMetricFamily(
            "cri_proxy_injections", "cpusets injected into CreateContainer, by QoS", labels=["qos"]
        )
        for qos, n in sorted(s["injections"].items()):
            injections.add_metric([qos], n)
        yield injections
        runs = CounterMetricFamily(
            "cri_proxy_hook_runs",
            "hook runs, by method, hook and outcome",
            labels=["method", "hook", "outcome"],
        )
        for (method, hook, outcome), n in sorted(s.get("hook_runs", {}).items()):
            runs.add_metric([method, hook, outcome], n)
        yield runs
        seconds = CounterMetricFamily(
            "cri_proxy_hook_seconds", "time spent in hooks, by method and hook", labels=["method", "hook"]
        )
        for (method, hook), total in sorted(s.get("hook_seconds", {}).items()):
            seconds.add_metric([method, hook], total)
        yield seconds
        problems = GaugeMetricFamily(
            "cri_proxy_problems", "problems in the current decision, by kind", labels=["kind"]
        )
        for kind, n in sorted(Tally(s["problem_kinds"]).items()):
            problems.add_metric([kind], n)
        yield problems
        for name, help_text in (
            ("passes", "reconcile passes"),
            ("updated", "containers re-pinned"),
            ("failed", "updates that failed after retries"),
            ("dropped", "containers found gone"),
            ("repaired", "containers whose real cpuset (their cgroup) differed from the applied one"),
            (
                "start_checks",
                "starts checked against the cgroup (an update went to the container since its create)",
            ),
        ):
            yield CounterMetricFamily(f"cri_proxy_reconcile_{name}", help_text, value=s["reconcile"][name])
        overlap = GaugeMetricFamily(
            "cri_proxy_exclusive_overlap_cpus",
            "CPUs of an LSE/LSR container that another container is still on, by both containers",
            labels=["pod", "container", "other_pod", "other_container"],
        )
        for pod, container, other_pod, other_container, cpus in s.get("overlaps", ()):
            overlap.add_metric([pod, container, other_pod, other_container], cpus)
        yield overlap
