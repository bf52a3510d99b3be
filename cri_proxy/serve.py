"""Wire the proxy together: relay + hooks + state + reconciler + sources. The only place that knows all.

Start: read the topology, load the checkpoint, recover from the runtime (briefly; in the
background if the runtime is not there yet), serve; then keep the kubelet state file, the
checkpoint and the reconciler going until SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from loguru import logger
from prometheus_client import CollectorRegistry
from tenacity import AsyncRetrying, stop_after_delay, stop_never, wait_exponential

from cri_proxy.config import RELOADABLE, Config
from cri_proxy.cpu import CPUSet
from cri_proxy.daemon.admin import AdminServer
from cri_proxy.daemon.health import HealthService
from cri_proxy.daemon.http import HttpEndpoint
from cri_proxy.daemon.metrics import CallMetrics, StateCollector
from cri_proxy.daemon.notify import notify, watchdog_interval
from cri_proxy.endpoints import prepare_listen_socket, socket_path
from cri_proxy.enforce.hooks import EnforceHooks
from cri_proxy.enforce.introspect import Introspection
from cri_proxy.enforce.observe import runtime_observer, status_reader
from cri_proxy.enforce.policy import Policy
from cri_proxy.enforce.reconciler import Reconciler, channel_reader, channel_sender
from cri_proxy.enforce.recovery import recover
from cri_proxy.errors import CheckpointError, CriProxyError
from cri_proxy.logs import setup_logging
from cri_proxy.relay.forward import FailPolicy
from cri_proxy.relay.hooks import HookTable
from cri_proxy.relay.server import Relay, run_until_signalled
from cri_proxy.sources.kube_api import KubeApiWatcher
from cri_proxy.sources.kube_events import Correlator, EventPoster, client_sender
from cri_proxy.sources.kubelet_file import KubeletStateFile
from cri_proxy.state import checkpoint
from cri_proxy.state.checkpoint import Records
from cri_proxy.state.lock import StateDirLock
from cri_proxy.state.model import ContainerState, NodeState
from cri_proxy.sysfs import read_topology

CHECKPOINT_NAME = "checkpoint.json"


class Proxy:
    """Everything `serve` runs, built from one Config; tests build it in-process too."""

    def __init__(self, config: Config, reload: Callable[[], Config] | None = None) -> None:
        self.config = config
        self.reload_config = reload
        self.runtime_up = False
        self._seen_down = False
        self.state = NodeState()
        self.kubelet = KubeletStateFile(config.kubelet_state_file)
        self.kubelet.poll()
        self.kube_api = (
            KubeApiWatcher(
                self.state,
                config.kubernetes_node_name,
                config.kubernetes_kubeconfig,
                on_change=self._kube_api_changed,
            )
            if config.kubernetes_enabled
            else None
        )
        self.policy = Policy(
            self.state,
            read_topology(config.sysfs_root),
            CPUSet.parse(config.reserved_cpus),
            CPUSet.parse(config.system_cpus),
            self.kubelet,
            self.kube_api,
        )
        self.table = HookTable()
        self.introspection = Introspection(self.state, self.policy)
        self.health = HealthService(lambda: self.runtime_up)
        self.relay = Relay(config, self.table)
        self.admin = AdminServer(config, (self.introspection, self.health))
        self.reconciler = Reconciler(
            self.state,
            self.policy,
            channel_sender(self.relay.channel),
            concurrency=config.reconcile_concurrency,
            period=config.reconcile_period_seconds,
            dry_run=config.dry_run,
            read_actual=channel_reader(self.relay.channel),
        )
        self.introspection.reconciler = self.reconciler
        self.hooks = EnforceHooks(
            self.state,
            self.policy,
            self.reconciler,
            fail_policy=FailPolicy(config.fail_policy),
            dry_run=config.dry_run,
            exclusive_wait=config.exclusive_wait_seconds,
        )
        self.hooks.register(self.table)
        self.introspection.observe = runtime_observer(self.relay.channel, status_reader(self.relay.channel))
        self.introspection.dry_run = lambda: self.config.dry_run
        self.events: EventPoster | None = None
        if self.kube_api is not None:
            watcher = self.kube_api
            self.events = EventPoster(
                Correlator(host=watcher.node_name),
                self.introspection.live_problems,
                lambda: {p.key: p.uid for p in self.state.pods()},
                client_sender(lambda: watcher.api_client),
            )
        self.introspection.extra = lambda: {
            "runtime_up": self.runtime_up,
            "cpuset_updates_replaced": self.hooks.replaced,
        }
        self.checkpoint_path = Path(config.state_dir) / CHECKPOINT_NAME
        self.lock = StateDirLock(config.state_dir)
        self.recovered = asyncio.Event()
        self.http: HttpEndpoint | None = None
        if config.metrics_address:
            registry = CollectorRegistry()
            self.relay.forwarder.observer = CallMetrics(registry)
            registry.register(StateCollector(self._metrics_view))
            self.http = HttpEndpoint(config.metrics_address, registry, self._healthz, self._readyz)
        self._tasks: list[asyncio.Task[None]] = []
        self._saved_generation = -1
        self._last_save_error = ""

    # -- start-up -----------------------------------------------------------------------------
    def load_checkpoint(self) -> Records | None:
        try:
            loaded = checkpoint.load(self.checkpoint_path)
        except CheckpointError as exc:
            logger.warning("checkpoint unusable, rebuilding from the runtime: {}", exc)
            return None
        if loaded is not None:
            pods, containers = loaded
            self.state.replace_all(pods, containers)
            logger.info("checkpoint: {} pods, {} containers", len(pods), len(containers))
        return loaded

    async def recover(self, saved: Records | None, give_up_after: float | None) -> bool:
        """Learn every pod and container the runtime has; True when done."""
        stop = stop_after_delay(give_up_after) if give_up_after is not None else stop_never
        try:
            async for attempt in AsyncRetrying(
                wait=wait_exponential(multiplier=0.2, max=5.0),
                reraise=True,
                stop=stop,
            ):
                with attempt:
                    found = await recover(self.relay.channel, saved)
        except Exception as exc:
            logger.warning("recovery from runtime {} not done yet: {}", self.config.runtime_endpoint, exc)
            return False
        pending = [c for c in self.state.containers() if c.state is ContainerState.PENDING]
        self.state.replace_all(found.pods, [*found.containers, *pending])
        for problem in found.problems:
            logger.warning("recovery: {}", problem)
        logger.info(
            "recovered from the runtime: {} pods, {} containers", len(found.pods), len(found.containers)
        )
        self.recovered.set()
        self.reconciler.request()
        return True

    async def start(self) -> None:
        trouble = self.lock.acquire()
        if trouble is not None:
            logger.warning("{} (working without a checkpoint lock)", trouble)
        listen = socket_path(self.config.listen)
        if listen is not None:  # refuse a live owner or a bad path now, not after recovery
            prepare_listen_socket(listen, self.config.allow_world_writable_socket_dir)
        self.admin.check()
        saved = self.load_checkpoint()
        done = await self.recover(saved, give_up_after=3.0)
        await self.admin.start()  # first: once the CRI socket answers, so does the admin socket
        try:
            await self.relay.start()
        except BaseException:
            await self.admin.stop(0)
            raise
        self._spawn(self.reconciler.run)
        self._spawn(self._watch_kubelet)
        if self.kube_api is not None:
            self._spawn(self.kube_api.run)
        if self.events is not None:
            self._spawn(self.events.run)
        self._spawn(self._keep_checkpoint)
        self._spawn(self._probe_runtime)
        if not done:
            self._spawn(lambda: self._recover_later(saved))
        if self.http is not None:
            await self.http.start()
            logger.info("metrics and health on http://{}:{}/metrics", self.http.host, self.http.port)
        interval = watchdog_interval()
        if interval is not None:
            self._spawn(lambda: self._watchdog(interval))
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, lambda: self._spawn(self.reload))
        status = "serving" if done else f"serving; waiting for runtime {self.config.runtime_endpoint}"
        notify(f"READY=1\nSTATUS={status}")

    def _spawn(self, job: Callable[[], Awaitable[None]]) -> None:
        self._tasks.append(asyncio.ensure_future(job()))

    async def _recover_later(self, saved: Records | None) -> None:
        await self.recover(saved, give_up_after=None)

    # -- running ------------------------------------------------------------------------------
    # -- daemon -------------------------------------------------------------------------------
    async def _probe_runtime(self) -> None:
        """Is the runtime answering? For /healthz, the gRPC health service and `runtime_up`."""
        version = self.relay.channel.unary_unary("/runtime.v1.RuntimeService/Version", None, None)
        while True:
            try:
                await version(b"", timeout=2.0)
                up = True
            except grpc.aio.AioRpcError as exc:
                up = exc.code() is grpc.StatusCode.UNIMPLEMENTED  # a v1alpha2-only runtime still answers
            if up != self.runtime_up:
                self.runtime_up = up
                level = "INFO" if up else "WARNING"
                logger.log(
                    level, "runtime {} is {}", self.config.runtime_endpoint, "up" if up else "not answering"
                )
                if up and self._seen_down and self.recovered.is_set():
                    # back after an outage: re-read what changed meanwhile, re-apply what could not be
                    self._spawn(self._recover_after_outage)
                self._seen_down = self._seen_down or not up
            await asyncio.sleep(2.0 if up else 0.5)

    async def _recover_after_outage(self) -> None:
        await self.recover((self.state.pods(), self.state.containers()), give_up_after=30.0)

    async def _healthz(self) -> tuple[bool, str]:
        if not self.runtime_up:
            return False, f"runtime {self.config.runtime_endpoint} not answering"
        return True, "ok (dry-run: decides and reports, changes nothing)" if self.config.dry_run else "ok"

    async def _readyz(self) -> tuple[bool, str]:
        if not self.recovered.is_set():
            return False, "state not recovered from the runtime yet"
        return await self._healthz()

    def _metrics_view(self) -> dict[str, Any]:
        return {
            "pods": len(self.state.pods()),
            "containers": len(self.state.containers()),
            "runtime_up": self.runtime_up,
            "injections": dict(self.hooks.injected),
            "problem_kinds": [str(p.kind) for p in self.policy.plan().problems],
            "reconcile": vars(self.reconciler.totals),
            "dry_run": self.config.dry_run,
            "replaced": self.hooks.replaced,
        }

    async def _watchdog(self, interval: float) -> None:
        while True:
            notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    async def reload(self) -> None:
        """SIGHUP: read the config again; apply what can change at run time, say what cannot."""
        if self.reload_config is None:
            return
        notify("RELOADING=1")
        try:
            new = self.reload_config()
        except CriProxyError as exc:
            logger.error("reload refused, the running configuration stays: {}", exc)
            notify("READY=1")
            return
        fixed = sorted(
            f.name
            for f in fields(Config)
            if f.name not in RELOADABLE and getattr(new, f.name) != getattr(self.config, f.name)
        )
        if fixed:
            logger.warning("cannot change at run time, restart to apply: {}", ", ".join(fixed))
        self.apply(replace(new, **{name: getattr(self.config, name) for name in fixed}))
        notify("READY=1")

    def apply(self, config: Config) -> None:
        """Take the run-time-changeable settings of `config`."""
        setup_logging(config.log_level, config.log_format)
        self.policy.reserved = CPUSet.parse(config.reserved_cpus)
        self.policy.system = CPUSet.parse(config.system_cpus)
        self.policy.facts_changed()
        self.hooks.fail_policy = self.relay.forwarder.fail_policy = FailPolicy(config.fail_policy)
        self.hooks.dry_run = self.reconciler.dry_run = config.dry_run
        self.hooks.exclusive_wait = config.exclusive_wait_seconds
        self.reconciler.concurrency = config.reconcile_concurrency
        self.reconciler.period = config.reconcile_period_seconds
        self.relay.config = replace(self.relay.config, shutdown_grace_seconds=config.shutdown_grace_seconds)
        self.config = config
        logger.info("configuration reloaded")
        self.reconciler.request()

    def _kube_api_changed(self) -> None:
        """The Kubernetes API's view of a pod, or its reachability, changed: decide again."""
        self.policy.facts_changed()
        self.reconciler.request()

    async def _watch_kubelet(self) -> None:
        while True:
            await asyncio.sleep(self.config.kubelet_poll_seconds)
            if self.kubelet.poll():
                if self.kubelet.problem is not None:
                    logger.warning("{}", self.kubelet.problem.message)
                else:
                    logger.info("kubelet state file {} changed", self.kubelet.path)
                self.policy.facts_changed()
                self.reconciler.request()

    async def _keep_checkpoint(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            await self.save_checkpoint()

    async def save_checkpoint(self) -> None:
        generation = self.state.generation
        if generation == self._saved_generation:
            return
        try:
            await asyncio.to_thread(checkpoint.save, self.checkpoint_path, self.state)
        except CheckpointError as exc:
            if str(exc) != self._last_save_error:  # report once, keep working in memory
                logger.error("checkpoint not written (working in memory): {}", exc)
                self._last_save_error = str(exc)
            return
        self._saved_generation = generation
        self._last_save_error = ""

    async def stop(self) -> None:
        notify("STOPPING=1")
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        if self.http is not None:
            await self.http.stop()
        await self.relay.stop()
        await self.admin.stop(0)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.lock.held:
            await self.save_checkpoint()
        self.lock.release()


async def serve(config: Config, reload: Callable[[], Config] | None = None) -> None:
    proxy = Proxy(config, reload)
    await run_until_signalled(proxy.start, proxy.stop)
