"""The relay's call metrics read exactly as prometheus_client's own Counter and Histograms would.

`CallMetrics` keeps a call's figures and counts them in batches (a cold Counter and three
Histograms cost each call more than the rest of the metrics path). The reference here is
prometheus_client itself, fed the same calls one by one: the two expositions must be the same text,
whenever a scrape comes and however many calls wait to be counted.
"""

from __future__ import annotations

import grpc
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from cri_proxy.daemon import metrics
from cri_proxy.daemon.metrics import LATENCY_BUCKETS, OVERHEAD_BUCKETS, CallMetrics, method_label
from cri_proxy.relay.methods import KNOWN


class Reference:
    """The calls counted one at a time by prometheus_client (what `CallMetrics` used to be)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.calls = Counter(
            "cri_proxy_calls", "CRI calls relayed, by method and status code", ["method", "code"], registry=r
        )
        self.duration = Histogram(
            "cri_proxy_call_duration_seconds",
            "CRI call time as the caller sees it",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.runtime = Histogram(
            "cri_proxy_runtime_duration_seconds",
            "of which the runtime's own time",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "cri_proxy_overhead_seconds",
            "of which the proxy's own time (hooks included)",
            ["method"],
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )

    def observe(self, path: str, code: grpc.StatusCode, total: float, upstream: float) -> None:
        method = method_label(path)
        self.calls.labels(method, code.name).inc()
        self.duration.labels(method).observe(total)
        self.runtime.labels(method).observe(upstream)
        self.overhead.labels(method).observe(max(0.0, total - upstream))


PATHS = [*sorted(KNOWN)[:6], "/some.Other/Thing", "/runtime.v1.RuntimeService/NotAMethod"]
BOUNDS = sorted({*LATENCY_BUCKETS, *OVERHEAD_BUCKETS})
seconds = st.one_of(
    st.sampled_from(BOUNDS),  # exactly on a bound: counted in that bound's bucket ("le")
    st.floats(min_value=0.0, max_value=60.0, allow_nan=False),
)
calls = st.lists(
    st.tuples(
        st.sampled_from(PATHS),
        st.sampled_from([grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE]),
        seconds,
        seconds,
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(batches=st.lists(calls, min_size=1, max_size=4), fold_at=st.integers(min_value=1, max_value=20))
def test_the_metrics_read_as_prometheus_clients_own(
    batches: list[list[tuple[str, grpc.StatusCode, float, float]]], fold_at: int
) -> None:
    """Calls in batches, a scrape after each: the same text as prometheus_client's, at every scrape,
    whether the calls were counted as they came (a small `FOLD_AT`) or at the scrape."""
    reference = Reference()
    registry = CollectorRegistry()
    ours = CallMetrics(registry)
    saved = metrics.FOLD_AT
    metrics.FOLD_AT = fold_at
    try:
        for batch in batches:
            for path, code, total, upstream in batch:
                reference.observe(path, code, total, upstream)
                ours.observe(path, code, total, upstream)
                assert len(ours.pending) < fold_at  # what waits to be counted stays bounded
            assert generate_latest(registry).decode() == generate_latest(reference.registry).decode()
    finally:
        metrics.FOLD_AT = saved


def test_a_scrape_counts_the_calls_waiting() -> None:
    registry = CollectorRegistry()
    ours = CallMetrics(registry)
    ours.observe("/runtime.v1.RuntimeService/Version", grpc.StatusCode.OK, 0.002, 0.0015)
    assert ours.pending  # not counted yet
    text = generate_latest(registry).decode()
    assert 'cri_proxy_calls_total{code="OK",method="RuntimeService/Version"} 1.0' in text
    assert 'cri_proxy_call_duration_seconds_bucket{le="0.0025",method="RuntimeService/Version"} 1.0' in text
    assert 'cri_proxy_call_duration_seconds_bucket{le="0.001",method="RuntimeService/Version"} 0.0' in text
    assert 'cri_proxy_overhead_seconds_bucket{le="0.0005",method="RuntimeService/Version"} 1.0' in text
    assert not ours.pending


def test_unknown_paths_share_one_series() -> None:
    """Any path the relay does not know is `other`: a client inventing paths cannot grow the series."""
    registry = CollectorRegistry()
    ours = CallMetrics(registry)
    for i in range(2000):
        ours.observe(f"/made.Up/M{i}", grpc.StatusCode.UNIMPLEMENTED, 0.001, 0.0)
    text = generate_latest(registry).decode()
    assert 'cri_proxy_calls_total{code="UNIMPLEMENTED",method="other"} 2000.0' in text
    assert text.count("cri_proxy_calls_total{") == 1
