"""`cri_proxy.v1.Introspect` on the proxy's admin socket: the views for `cri-proxy ctl`.

Replies are JSON documents (UTF-8 bytes) rather than protobuf: the views are for people and
scripts, and the snapshot is the `plan` input format itself, so `plan` can replay it.
Methods: `Cpusets`, `Cpus`, `Pools`, `Problems`, `Status` (live: the runtime is listed and each
container's real cpuset read at the time of the call), `Snapshot`, `Plan` (the decisions in `plan`
output format), `Pin` (JSON request: `ctl update --cpuset-cpus`'s check, `--force` pins) and
`Unpin` (`ctl update --unpin`: back to the rules' cpuset).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc
import grpc.aio

from cri_proxy.cpu import CPUSet, QoS, inputs_to_snapshot, plan_to_json
from cri_proxy.enforce import views
from cri_proxy.enforce.naming import about
from cri_proxy.enforce.observe import Observe, Seen
from cri_proxy.enforce.policy import Policy
from cri_proxy.enforce.reconciler import Reconciler
from cri_proxy.errors import CpuError
from cri_proxy.relay.forward import GenericHandler, Handler
from cri_proxy.state.model import NodeState

SERVICE = "cri_proxy.v1.Introspect"

View = Callable[[bytes], Awaitable[Any]]


class Introspection(GenericHandler):
    """The views; `observe` lists the runtime (None: the proxy's records alone), `extra` adds
    figures to `Status` (dry-run, runtime up, replaced updates) and `dry_run` says whether the
    proxy changes nothing."""

    def __init__(self, state: NodeState, policy: Policy, reconciler: Reconciler | None = None) -> None:
        self.state = state
        self.policy = policy
        self.reconciler = reconciler
        self.observe: Observe | None = None
        self.dry_run: Callable[[], bool] = lambda: False
        self.extra: Callable[[], Mapping[str, Any]] = dict
        views_: dict[str, View] = {
            "Cpusets": self._cpusets,
            "Cpus": self._cpus,
            "Pools": self._pools,
            "Problems": self._problems,
            "Status": self._status,
            "Snapshot": self._snapshot,
            "Plan": self._plan,
            "Pin": self._pin,
            "Unpin": self._unpin,
        }
        self._handlers: dict[str, Handler] = {
            f"/{SERVICE}/{name}": grpc.unary_unary_rpc_method_handler(self._behaviour(view))
            for name, view in views_.items()
        }

    async def inputs(self) -> tuple[views.Inputs, str | None]:
        """The views' inputs, the runtime listed now; and why it could not be, if so."""
        seen: Mapping[str, Seen] | None = None
        trouble = None
        if self.observe is not None:
            try:
                seen = await self.observe()
            except Exception as exc:  # the runtime is down: the views say so and show the records
                detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                trouble = f"runtime not listed, real cpusets unknown: {detail}"
        generation_plan = self.policy.plan()
        return (
            views.Inputs(
                pods=self.state.pods(),
                containers=self.state.containers(),
                plan=generation_plan,
                seen=seen,
                dry_run=self.dry_run(),
                online=self.policy.topology.online,
                reserved=self.policy.reserved,
            ),
            trouble,
        )

    async def _cpusets(self, body: bytes) -> Any:
        i, _ = await self.inputs()
        return views.container_rows(i)

    async def _cpus(self, body: bytes) -> Any:
        i, trouble = await self.inputs()
        return {"dry_run": i.dry_run, "runtime": trouble, "cpus": views.cpu_rows(i, views.container_rows(i))}

    async def _pools(self, body: bytes) -> Any:
        i, trouble = await self.inputs()
        return {
            "dry_run": i.dry_run,
            "runtime": trouble,
            "pools": views.pool_rows(i, views.container_rows(i)),
        }

    async def _problems(self, body: bytes) -> Any:
        i, trouble = await self.inputs()
        rows = views.container_rows(i)
        return {"dry_run": i.dry_run, "runtime": trouble, "problems": views.problem_rows(i, rows)}

    async def live_problems(self) -> list[dict[str, Any]]:
        """The problems view's rows (for Kubernetes Events)."""
        i, _ = await self.inputs()
        return views.problem_rows(i, views.container_rows(i))

    async def _status(self, body: bytes) -> Any:
        i, trouble = await self.inputs()
        rows = views.container_rows(i)
        return {
            "dry_run": i.dry_run,
            "runtime": trouble or "listed",
            "pods": len(i.pods),
            "containers": len(i.containers),
            "runtime_containers": None if i.seen is None else len(i.seen),
            "marks": views.counts(rows),
            "problems": len(views.problem_rows(i, rows)),
            "pins": len(self.policy.pins),
            **self.extra(),
            "reconcile": vars(self.reconciler.totals) if self.reconciler is not None else None,
        }

    async def _snapshot(self, body: bytes) -> Any:
        return inputs_to_snapshot(self.policy.inputs())

    async def _plan(self, body: bytes) -> Any:
        return plan_to_json(self.policy.plan())

    async def _pin(self, body: bytes) -> Any:
        """`{"id", "cpuset", "force"}`: may an operator set this cpuset? With force, pin it."""
        try:
            req = json.loads(body or b"{}")
            cid, text, force = str(req["id"]), str(req["cpuset"]), bool(req.get("force", False))
        except (ValueError, KeyError, TypeError) as exc:
            return {"refused": f"bad Pin request: {exc}", "code": "INVALID_ARGUMENT"}
        try:
            cpus = CPUSet.parse(text)
        except CpuError as exc:
            return {"refused": f"--cpuset-cpus {text!r}: {exc}", "code": "INVALID_ARGUMENT"}
        online = self.policy.topology.online
        if cpus - online:
            return {
                "refused": f"--cpuset-cpus {text!r} names CPUs {cpus - online} that are not online "
                f"(online: {online})",
                "code": "INVALID_ARGUMENT",
            }
        if self.dry_run():  # the proxy forwards the update unchanged: the runtime has the word
            return {"managed": False, "dry_run": True}
        c = self.state.container(cid)
        d = self.policy.plan().containers.get(cid)
        rules = self.policy.rules_cpuset(cid)
        if c is None or d is None or d.qos in (None, QoS.KUBELET) or (d.cpuset is None and rules is None):
            return {"managed": False}
        log, who = about(self.state, c)
        if cpus == d.cpuset:
            return {"managed": True, "same": True}
        rules_text = str(rules) if rules is not None else "none (left unchanged)"
        if not force:
            return {
                "managed": True,
                "refused": f"{who} is {d.qos}: the proxy manages its cpuset and the rules give it "
                f"{rules_text} ({d.why}); the proxy would replace {cpus} with "
                f"{d.cpuset}. Use --force to pin {cpus} (kept until the container is removed or "
                "`ctl update --unpin` removes the pin)",
                "code": "FAILED_PRECONDITION",
            }
        if rules is not None and cpus == rules:
            self.policy.unpin(cid)
            log.warning("{}: operator pin removed; back to the rules' cpuset {}", who, cpus)
        else:
            self.policy.pin(cid, cpus)
            log.warning("{}: pinned by an operator to cpuset {} (rules: {})", who, cpus, rules_text)
        if self.reconciler is not None:
            self.reconciler.request()
        return {"managed": True, "pinned": str(cpus)}

    async def _unpin(self, body: bytes) -> Any:
        """`{"id"}`: remove an operator's pin; the reconciler then applies the rules' cpuset."""
        try:
            cid = str(json.loads(body or b"{}")["id"])
        except (ValueError, KeyError, TypeError) as exc:
            return {"refused": f"bad Unpin request: {exc}", "code": "INVALID_ARGUMENT"}
        c = self.state.container(cid)
        if c is None:
            return {"refused": f"container {cid[:13]} is not tracked by the proxy", "code": "NOT_FOUND"}
        log, who = about(self.state, c)
        if not self.policy.unpin(cid):
            return {
                "refused": f"{who} has no operator pin (`ctl update --cpuset-cpus X --force` sets one)",
                "code": "FAILED_PRECONDITION",
            }
        rules = self.policy.rules_cpuset(cid)
        rules_text = str(rules) if rules is not None else "none (left unchanged)"
        log.warning("{}: operator pin {} removed; back to the rules' cpuset {}", who, c.pin, rules_text)
        if self.reconciler is not None:
            self.reconciler.request()
        return {"unpinned": c.pin, "cpuset": rules_text}

    @staticmethod
    def _behaviour(view: View) -> Any:
        async def behaviour(request: bytes, context: Any) -> bytes:
            return json.dumps(await view(request), indent=1, sort_keys=False).encode()

        return behaviour

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Handler | None:
        return self._handlers.get(handler_call_details.method)
