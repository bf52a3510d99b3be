"""Prometheus metrics: calls and latency from the relay, the rest read from the live objects.

Counters on the hot path only where a call happens (calls, latency); everything that is state
(pods, containers, problems, reconcile totals, injections) is read at scrape time. No `*_created`
series: they double the series count and say nothing a restart time would not.
"""

from __future__ import annotations

import platform
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cri_proxy import __version__
from cri_proxy.relay.methods import KNOWN

disable_created_metrics()  # type: ignore[no-untyped-call]  # process-wide in prometheus_client; this module owns the proxy's metrics

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
OVERHEAD_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1, 5)


def method_label(path: str) -> str:
    """Known methods by name (`RuntimeService/Version`); anything else `other`, to bound cardinality."""
    info = KNOWN.get(path)
    return f"{info.service}/{info.name}" if info is not None else "other"


class CallMetrics:
    """What the relay records per call: count by method and code, total and runtime time."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "cri_proxy_calls",
            "CRI calls relayed, by method and status code",
            ["method", "code"],
            registry=registry,
        )
        self.duration = Histogram(
            "cri_proxy_call_duration_seconds",
            "CRI call time as the caller sees it",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.runtime = Histogram(
            "cri_proxy_runtime_duration_seconds",
            "of which the runtime's own time",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.overhead = Histogram(
            "cri_proxy_overhead_seconds",
            "of which the proxy's own time (hooks included)",
            ["method"],
            buckets=OVERHEAD_BUCKETS,
            registry=registry,
        )
        self._children: dict[tuple[str, grpc.StatusCode], tuple[Any, Any, Any, Any]] = {}

    def observe(self, path: str, code: grpc.StatusCode, total: float, upstream: float) -> None:
        children = self._children.get((path, code))
        if children is None:
            children = self._label(path, code)
        calls, duration, runtime, overhead = children
        calls.inc()
        duration.observe(total)
        runtime.observe(upstream)
        overhead.observe(max(0.0, total - upstream))

    def _label(self, path: str, code: grpc.StatusCode) -> tuple[Any, Any, Any, Any]:
        """The series of one (method, code), found once: `labels()` costs ~2 µs a call on the hot
        path. Only known methods are kept (any other path is `other`: the cache stays bounded)."""
        method = method_label(path)
        children = (
            self.calls.labels(method, code.name),
            self.duration.labels(method),
            self.runtime.labels(method),
            self.overhead.labels(method),
        )
        if path in KNOWN:
            self._children[(path, code)] = children
        return children


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
