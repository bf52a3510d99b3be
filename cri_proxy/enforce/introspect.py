"""`cri_proxy.v1.Introspect` on the proxy's own socket: read-only views for `cri-proxy ctl`.

Replies are JSON documents (UTF-8 bytes) rather than protobuf: the views are for people and
scripts, and the snapshot is the `plan` input format itself, so `plan` can replay it.
Methods: `Cpusets`, `Snapshot`, `Plan` (the decisions in `plan` output format), `Status`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc

from cri_proxy.cpu import inputs_to_snapshot, plan_to_json
from cri_proxy.enforce.policy import Policy
from cri_proxy.enforce.reconciler import Reconciler
from cri_proxy.relay.forward import GenericHandler, Handler
from cri_proxy.state.model import NodeState

SERVICE = "cri_proxy.v1.Introspect"


def cpusets_view(state: NodeState, policy: Policy) -> list[dict[str, Any]]:
    """One row per container the proxy knows: decided vs applied, and why."""
    plan = policy.plan()
    pods = {p.sandbox_id: p for p in state.pods()}
    rows = []
    for c in sorted(
        state.containers(), key=lambda c: (pods[c.sandbox_id].key if c.sandbox_id in pods else "", c.name)
    ):
        pod = pods.get(c.sandbox_id)
        d = plan.containers.get(c.id)
        rows.append(
            {
                "pod": pod.key if pod else None,
                "container": c.name,
                "id": c.id,
                "state": str(c.state),
                "qos": str(d.qos) if d is not None and d.qos is not None else None,
                "decided": str(d.cpuset) if d is not None and d.cpuset is not None else None,
                "applied": c.applied,
                "why": d.why if d is not None else "sandbox not ready",
            }
        )
    return rows


class Introspection(GenericHandler):
    def __init__(self, state: NodeState, policy: Policy, reconciler: Reconciler | None = None) -> None:
        self.reconciler = reconciler
        views: dict[str, Callable[[], Any]] = {
            "Cpusets": lambda: cpusets_view(state, policy),
            "Snapshot": lambda: inputs_to_snapshot(policy.inputs()),
            "Plan": lambda: plan_to_json(policy.plan()),
            "Status": lambda: {
                "pods": len(state.pods()),
                "containers": len(state.containers()),
                "reconcile": vars(self.reconciler.totals) if self.reconciler is not None else None,
            },
        }
        self._handlers: dict[str, Handler] = {
            f"/{SERVICE}/{name}": grpc.unary_unary_rpc_method_handler(self._behaviour(view))
            for name, view in views.items()
        }

    @staticmethod
    def _behaviour(view: Callable[[], Any]) -> Any:
        async def behaviour(request: bytes, context: Any) -> bytes:
            return json.dumps(view(), indent=1, sort_keys=False).encode()

        return behaviour

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Handler | None:
        return self._handlers.get(handler_call_details.method)
