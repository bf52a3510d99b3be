"""The supervisor's view for Prometheus: restarts by task, and which tasks are up, read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cri_proxy.daemon.supervisor import Supervisor


class SupervisorCollector(Collector):
    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    def collect(self) -> Iterator[Any]:
        restarts = CounterMetricFamily(
            "cri_proxy_loop_restarts",
            "background loops and jobs restarted after a failure, by name",
            labels=["loop"],
        )
        for name, n in self.supervisor.restarts().items():
            restarts.add_metric([name], n)
        yield restarts
        statuses = self.supervisor.statuses()
        up = GaugeMetricFamily(
            "cri_proxy_loop_up",
            "1 while a background task runs, 0 while it waits to restart",
            labels=["loop"],
        )
        for status in statuses:
            up.add_metric([status.name], 1 if status.up else 0)
        yield up
        yield GaugeMetricFamily(
            "cri_proxy_loops_up",
            "background tasks running (not waiting to restart)",
            value=sum(s.up for s in statuses),
        )
