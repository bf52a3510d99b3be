"""Wire the proxy together: relay + hooks + state + reconciler + sources. The only place that knows all.

Start: read the topology, load the checkpoint, recover from the runtime (briefly; in the
background if the runtime is not there yet), serve; then every background loop (reconciler,
watches, checkpoint, runtime probe, watchdog) runs under one supervisor until SIGTERM. Each
part has its own module with one job; this one only builds them and connects their callbacks.
"""

from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import Callable
from typing import Any

from loguru import logger
from prometheus_client import CollectorRegistry, ProcessCollector

from cri_proxy.config import Config, check_cpus, is_loopback
from cri_proxy.cpu.topology import Topology
from cri_proxy.daemon.admin import AdminServer
from cri_proxy.daemon.checkpoints import CheckpointKeeper
from cri_proxy.daemon.fds import FdWatch, raise_limit
from cri_proxy.daemon.health import HealthService
from cri_proxy.daemon.http import HttpEndpoint
from cri_proxy.daemon.kubelet_watch import KubeletWatch
from cri_proxy.daemon.loop_metrics import SupervisorCollector
from cri_proxy.daemon.metrics import CallMetrics, StateCollector
from cri_proxy.daemon.notify import notify, watchdog_interval
from cri_proxy.daemon.recovery_runs import RecoveryRuns
from cri_proxy.daemon.reload import Reloader
from cri_proxy.daemon.runtime_probe import RuntimeProbe
from cri_proxy.daemon.socket_watch import SocketWatch
from cri_proxy.daemon.stacks import stacks_text
from cri_proxy.daemon.supervisor import Supervisor
from cri_proxy.daemon.topology_watch import Seen, TopologyWatch
from cri_proxy.endpoints import prepare_listen_socket, socket_path
from cri_proxy.enforce.actual import actual_reader, resources_reader
from cri_proxy.enforce.hooks import EnforceHooks
from cri_proxy.enforce.introspect import Introspection
from cri_proxy.enforce.observe import cgroup_first, runtime_observer, status_reader
from cri_proxy.enforce.policy import Policy
from cri_proxy.enforce.reconciler import Reconciler, channel_sender
from cri_proxy.enforce.sync import Syncer
from cri_proxy.errors import ConfigError
from cri_proxy.logs import log_lines_dropped, setup_logging, write_put_off
from cri_proxy.relay.hooks import HookTable
from cri_proxy.relay.server import Relay, run_until_signalled
from cri_proxy.settings import Settings
from cri_proxy.sources.cgroupfs import CgroupReader
from cri_proxy.sources.kube_api import KubeApiWatcher
from cri_proxy.sources.kube_events import Correlator, EventPoster, client_sender
from cri_proxy.sources.kubelet_file import KubeletStateFile
from cri_proxy.state.lock import StateDirLock
from cri_proxy.state.model import NodeState
from cri_proxy.sysfs import read_present, read_topology


class Proxy:
    """Everything `serve` runs, built from one Config; tests build it in-process too."""

    def __init__(self, config: Config, reload: Callable[[], Config] | None = None) -> None:
        self.settings = Settings(config)
        cgroups = CgroupReader(config.cgroup_root)  # what a container really has
        sysfs = read_topology(config.sysfs_root)
        seen = Seen(sysfs.online, cgroups.pod_root_cpus())  # the CPUs pods can be given
        topology = sysfs.only(seen.usable)
        if (left_out := seen.left_out()) is not None:
            logger.warning("{}", left_out)
        self.present = read_present(config.sysfs_root)  # CPUs the node has, online or not
        for warning in check_cpus(config, sysfs.online, self.present):
            logger.warning("{}", warning)
        self.state = NodeState()
        self.kubelet = KubeletStateFile(config.kubelet_state_file)
        self.kube_api = (
            KubeApiWatcher(
                self.state,
                config.kubernetes_node_name,
                config.kubernetes_kubeconfig,
                on_change=self._facts_changed,
                pods_current=lambda: self.recovered.is_set(),
            )
            if config.kubernetes_enabled
            else None
        )
        self.topology_watch = TopologyWatch(
            config.sysfs_root,
            seen,
            topology,
            cgroups.pod_root_cpus,
            self._topology_changed,
            lambda: [p.cgroup_parent for p in self.state.pods()],
        )
        self.policy = Policy(
            self.state, topology, self.settings.get, self.kubelet, self.kube_api, (self.topology_watch,)
        )
        self.kubelet_watch = KubeletWatch(self.kubelet, self.settings.get, self._facts_changed)
        self.table = HookTable()
        self.introspection = Introspection(self.state, self.policy)
        self.health = HealthService(lambda: self.probe.up, overall=lambda: self.healthy()[0])
        self.relay = Relay(config, self.table, settings=self.settings.get)
        self.admin = AdminServer(config, (self.introspection, self.health))
        self.probe = RuntimeProbe(self.relay.channel, config.runtime_endpoint, on_back=self._runtime_back)
        self.syncer = Syncer(self.state, self.relay.channel)
        self.reconciler = Reconciler(
            self.state,
            self.policy,
            channel_sender(self.relay.channel),
            self.settings.get,
            read_actual=actual_reader(self.state, cgroups, self.relay.channel),
            sync=self.syncer.periodic,
            runtime_resources=resources_reader(self.relay.channel),
        )
        self.introspection.reconciler = self.reconciler
        self.hooks = EnforceHooks(
            self.state, self.policy, self.reconciler, self.settings.get, learn=self.syncer.learn
        )
        self.hooks.register(self.table)
        self.checkpoints = CheckpointKeeper(config.state_dir, self.state)
        self.introspection.observe = runtime_observer(
            self.relay.channel, cgroup_first(self.state, cgroups, status_reader(self.relay.channel))
        )
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
            "runtime_up": self.probe.up,
            "cpuset_updates_replaced": self.hooks.replaced,
            "checkpoint": self.checkpoints.describe(),
        }
        self.lock = StateDirLock(config.state_dir)
        self.recovery = RecoveryRuns(self._recover_once, config.runtime_endpoint)
        self.recovered = self.recovery.done
        self.supervisor = Supervisor()
        frames = self.relay.frames
        self.fds = FdWatch(lambda: len(frames.links) if frames is not None else None)
        self.reloader = Reloader(self.settings, reload, self._check_cpus, self._settings_swapped)
        listen = socket_path(config.listen)
        self.sockets = SocketWatch(
            ([("CRI", listen, self.relay)] if listen is not None else [])
            + [("admin", self.admin.path, self.admin)]
        )
        self._reload_wanted = False
        self._started = False  # a SIGHUP before then is applied once started
        self._stopping = False
        self.http: HttpEndpoint | None = None
        if config.metrics_address:
            registry = CollectorRegistry()
            self.relay.forwarder.observer = CallMetrics(registry)
            registry.register(StateCollector(self._metrics_view))
            registry.register(SupervisorCollector(self.supervisor))
            ProcessCollector(registry=registry)  # process_open_fds, _max_fds, _resident_memory_bytes, ...
            self.http = HttpEndpoint(config.metrics_address, registry, self._healthz, self._readyz)

    @property
    def config(self) -> Config:
        """The running settings (swapped whole on reload)."""
        return self.settings.current

    # -- start and stop -----------------------------------------------------------------------
    async def start(self) -> None:
        config = self.config
        loop = asyncio.get_running_loop()  # each of these would end the process by default
        loop.add_signal_handler(signal.SIGHUP, self._sighup)
        loop.add_signal_handler(signal.SIGUSR1, self._dump_stacks)
        loop.add_signal_handler(signal.SIGUSR2, self._usr2)
        trouble = self.lock.acquire()
        if trouble is not None:
            logger.warning("{} (working without a checkpoint lock)", trouble)
        listen = socket_path(config.listen)
        if listen is not None:  # refuse a live owner or a bad path now, not after recovery
            prepare_listen_socket(listen, config.allow_world_writable_socket_dir)
        self.admin.check()
        if self.http is not None:  # a port taken ends the start here, before the CRI socket is ours
            await self.http.start()
            logger.info("metrics and health on http://{}:{}/metrics", self.http.host, self.http.port)
            if not is_loopback(self.http.host):
                logger.warning(
                    "metrics_address {} is not loopback (allow_remote_metrics = true):"
                    " /metrics, /healthz and /readyz answer anyone who can reach it",
                    config.metrics_address,
                )
        await self.kubelet_watch.refresh()
        self.checkpoints.load()  # the runtime's listing is merged into these records
        done = await self.recovery.first(give_up_after=3.0)
        await self.admin.start()  # first: once the CRI socket answers, so does the admin socket
        try:
            await self.relay.start()
        except BaseException:
            await self.admin.stop(0)
            raise
        run = self.supervisor.loop
        run("reconciler", self.reconciler.run)
        run("kubelet-state-file", self.kubelet_watch.run)
        if self.kube_api is not None:
            run("kubernetes-api", self.kube_api.run)
        if self.events is not None:
            run("kubernetes-events", self.events.run)
        run("checkpoint", self.checkpoints.run)
        run("runtime-probe", self.probe.run)
        run("file-descriptors", self.fds.run)
        run("cpu-topology", self.topology_watch.run)
        run("sockets", self.sockets.run)
        if not done:
            self.supervisor.job("recovery", self.recovery.until_done)
        interval = watchdog_interval()
        if interval is not None:
            run("watchdog", lambda: self._watchdog(interval))
        self._started = True
        if self._reload_wanted:  # a SIGHUP came during the start
            self.supervisor.job("reload", self._reload)
        status = "serving" if done else f"serving; waiting for runtime {config.runtime_endpoint}"
        notify(f"READY=1\nSTATUS={status}")

    async def stop(self) -> None:
        notify("STOPPING=1")
        self._stopping = True  # a SIGHUP now is ignored (removing the handler would let it end us)
        self.supervisor.stopping()  # a loop that ends from now on is no failure, nothing restarts
        if self.http is not None:
            await self.http.stop()
        await self.relay.stop_serving()  # the loops go on meanwhile: a create in its grace may wait on them
        await self.admin.stop(0)
        await self.supervisor.stop()
        await self.relay.close()  # only now: a loop's call on a closed channel was a false ERROR
        if self.lock.held:
            await self.checkpoints.flush()
        self.lock.release()
        write_put_off()  # the lines about the last calls

    # -- recovery -----------------------------------------------------------------------------
    async def _recover_once(self) -> None:
        """Merge every pod and container the runtime has into the state (raises when the runtime
        does not answer)."""
        await self.syncer.sync(full=True)
        logger.info(
            "recovered from the runtime: {} pods, {} containers",
            len(self.state.pods()),
            len(self.state.containers()),
        )
        self.reconciler.request(refresh=True)  # what each cgroup really has, now, not in a period

    def _runtime_back(self) -> None:
        """The runtime answers again after an outage: re-read what changed meanwhile."""
        if self.recovered.is_set():
            self.supervisor.job("recovery", self.recovery.until_done)

    # -- reload -------------------------------------------------------------------------------
    def _sighup(self) -> None:
        """One reload job at a time; a SIGHUP during a reload makes it read the file once more,
        one during the start is applied at its end, one during the stop is ignored."""
        if self._stopping:
            logger.info("SIGHUP while stopping: ignored")
            return
        self._reload_wanted = True
        if self._started:
            self.supervisor.job("reload", self._reload)
        else:
            logger.info("SIGHUP during the start: the configuration is read again once started")

    def _dump_stacks(self) -> None:
        """SIGUSR1, as containerd: every thread's and task's stack to the log."""
        logger.info("{}", stacks_text())

    def _usr2(self) -> None:
        logger.info("SIGUSR2: no action (SIGUSR1 writes the stacks to the log, SIGHUP reloads)")

    async def _reload(self) -> None:
        while self._reload_wanted:
            self._reload_wanted = False
            await self.reloader.reload()

    def _settings_swapped(self, old: Config, new: Config) -> None:
        if (old.log_level, old.log_format) != (new.log_level, new.log_format):
            setup_logging(new.log_level, new.log_format)
        self.reconciler.request()  # new CPUs, period or concurrency take effect on this pass

    def _check_cpus(self, config: Config) -> None:
        """A reload's CPUs against the topology in force: refused as at the start, warned of when
        offline now."""
        for warning in check_cpus(config, self.topology_watch.seen.online, self.present):
            logger.warning("{}", warning)

    def _topology_changed(self, topology: Topology) -> None:
        """The CPUs pods can be given, or those left out, changed: every decision over the topology
        (and its `cpus-left-out` problem), and the settings' CPUs named where they are offline now
        (a bad setting still, only at a start or reload)."""
        self.policy.topology = topology
        try:
            self._check_cpus(self.config)
        except ConfigError as exc:
            logger.warning("{}", exc)
        self._facts_changed()

    def _facts_changed(self) -> None:
        """The kubelet's file or the Kubernetes API's view of a pod changed: decide again."""
        self.policy.facts_changed()
        self.reconciler.request()

    # -- health and metrics -------------------------------------------------------------------
    async def _healthz(self) -> tuple[bool, str]:
        return self.healthy()

    def healthy(self) -> tuple[bool, str]:
        """/healthz and grpc.health.v1's overall service: the runtime answers and no background
        loop is down waiting for its restart (and why not)."""
        if not self.probe.up:
            return False, f"runtime {self.config.runtime_endpoint} not answering"
        if self.sockets.problem is not None:
            return False, self.sockets.problem
        healthy, why = self.supervisor.health()
        if healthy and self.config.dry_run:
            return True, f"{why} (dry-run: decides and reports, changes nothing)"
        return healthy, why

    async def _readyz(self) -> tuple[bool, str]:
        if not self.recovered.is_set():
            return False, "state not recovered from the runtime yet"
        return await self._healthz()

    def _metrics_view(self) -> dict[str, Any]:
        return {
            "pods": len(self.state.pods()),
            "containers": len(self.state.containers()),
            "runtime_up": self.probe.up,
            "injections": dict(self.hooks.injected),
            "hook_runs": dict(self.relay.forwarder.runner.runs),
            "hook_seconds": dict(self.relay.forwarder.runner.seconds),
            "problem_kinds": [str(p.kind) for p in self.policy.plan().problems],
            "reconcile": vars(self.reconciler.totals),
            "overlaps": [
                (o.pod, o.container, pod, name, len(cpus))
                for o in self.policy.overlaps()
                for pod, name, cpus in o.others
            ],
            "dry_run": self.config.dry_run,
            "replaced": self.hooks.replaced,
            "log_lines_dropped": log_lines_dropped(),
            "checkpoint_unsaved_seconds": self.checkpoints.unsaved_seconds(),
        }

    async def _watchdog(self, interval: float) -> None:
        while True:
            notify("WATCHDOG=1")
            await asyncio.sleep(interval)


def settle_heap() -> int:
    """Start-up is done: what it made (modules, protobuf descriptors, the Kubernetes client when the
    API watch is on, the loaded checkpoint: 40,000-60,000 objects) is set aside from the garbage
    collector, so that a full collection later goes over what the proxy made since; each one
    otherwise stalls every call for ~30 ms. Returns the objects set aside."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


async def serve(config: Config, reload: Callable[[], Config] | None = None) -> None:
    """`cri-proxy serve`: the proxy in this process until SIGTERM."""
    raised = raise_limit()
    if raised is not None:
        logger.debug("file descriptor limit raised from {:,} to {:,}", *raised)
    proxy = Proxy(config, reload)

    async def start() -> None:
        await proxy.start()
        logger.debug("start-up heap set aside from the garbage collector: {} objects", settle_heap())

    await run_until_signalled(start, proxy.stop)
