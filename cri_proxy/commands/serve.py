"""`cri-proxy serve`: run the proxy in front of a CRI runtime."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from cri_proxy.config import DEFAULT_CONFIG_FILE, DEFAULT_LISTEN, DEFAULT_RUNTIME_ENDPOINT
from cri_proxy.errors import ConfigError, CriProxyError


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="run the proxy", description="Relay every CRI call to the runtime, placing CPUs."
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"TOML config file (default {DEFAULT_CONFIG_FILE}; absent is fine)",
    )
    p.add_argument("--listen", help=f"endpoint to serve on (default {DEFAULT_LISTEN})")
    p.add_argument(
        "--admin-listen",
        help="the admin socket for `ctl` and health checks (default: admin.sock beside --listen, "
        "i.e. unix:///run/cri-proxy/admin.sock)",
    )
    p.add_argument("--runtime-endpoint", help=f"the runtime's endpoint (default {DEFAULT_RUNTIME_ENDPOINT})")
    p.add_argument(
        "--max-message-bytes", type=int, help="gRPC message size limit, both directions (default 16 MiB)"
    )
    p.add_argument("--shutdown-grace", type=float, help="seconds in-flight calls get on SIGTERM (default 10)")
    p.add_argument(
        "--fail-policy",
        choices=("ignore", "fail"),
        help="when a hook fails: forward unchanged (ignore, default) or refuse the call",
    )
    p.add_argument(
        "--relay-mode",
        choices=("grpc", "frames"),
        help="relay HTTP/2 frames per connection (frames, default, faster; unix sockets only) "
        "or gRPC calls through grpc.aio (grpc)",
    )
    p.add_argument("--log-level", help="TRACE, DEBUG, INFO (default), WARNING, ERROR")
    p.add_argument(
        "--log-format",
        choices=("auto", "text", "json"),
        help="auto (default: colour on a terminal, plain lines under journald), text, or json",
    )
    p.add_argument("--metrics-address", help="HOST:PORT for /metrics, /healthz, /readyz (default: off)")
    p.add_argument("--state-dir", help="where the checkpoint lives (default /var/lib/cri-proxy)")
    p.add_argument(
        "--kubelet-state-file",
        help="kubelet's CPU manager state (default /var/lib/kubelet/cpu_manager_state)",
    )
    p.add_argument("--sysfs-root", help="sysfs to read the CPU topology from (default /sys)")
    p.add_argument(
        "--cgroup-root",
        help="the cgroup file system, to read containers' and pods' cpusets (default /sys/fs/cgroup)",
    )
    p.add_argument("--reserved-cpus", help="CPUs never handed to a share pool (cpulist, default none)")
    p.add_argument("--system-cpus", help="CPUs for SYSTEM-class pods (cpulist, default: the LS pool)")
    p.add_argument(
        "--dry-run", action="store_const", const=True, default=None, help="decide and report, change nothing"
    )
    p.add_argument(
        "--exclusive-wait",
        type=float,
        help="seconds a new LSE/LSR container waits for others to leave its CPUs (default 5)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # until the proxy's handlers are in (the start's first step), these would end the process;
    # a SIGHUP before the configuration is read loses nothing
    for signum in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_IGN)
    from cri_proxy import config as config_mod
    from cri_proxy.logs import drain_log, setup_logging

    overrides: dict[str, Any] = {
        "listen": args.listen,
        "admin_listen": args.admin_listen,
        "runtime_endpoint": args.runtime_endpoint,
        "max_recv_message_bytes": args.max_message_bytes,
        "max_send_message_bytes": args.max_message_bytes,
        "shutdown_grace_seconds": args.shutdown_grace,
        "fail_policy": args.fail_policy,
        "relay_mode": args.relay_mode,
        "log_level": args.log_level,
        "state_dir": args.state_dir,
        "log_format": args.log_format,
        "metrics_address": args.metrics_address,
        "kubelet_state_file": args.kubelet_state_file,
        "sysfs_root": args.sysfs_root,
        "cgroup_root": args.cgroup_root,
        "reserved_cpus": args.reserved_cpus,
        "system_cpus": args.system_cpus,
        "dry_run": args.dry_run,
        "exclusive_wait_seconds": args.exclusive_wait,
    }
    try:
        config = config_mod.load(args.config, overrides)
    except CriProxyError as exc:
        print(f"cri-proxy serve: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_level, config.log_format)
    from cri_proxy.serve import serve

    def reload() -> config_mod.Config:
        """SIGHUP: the same file and the same flags, read again."""
        return config_mod.load(args.config, overrides)

    try:
        try:
            asyncio_run(serve(config, reload))
        finally:
            drain_log()  # the lines held, before any of ours
    except ConfigError as exc:  # a value only the node can judge (CPUs not online): as a bad file
        print(f"cri-proxy serve: {exc}", file=sys.stderr)
        return 2
    except CriProxyError as exc:
        print(f"cri-proxy serve: {exc}", file=sys.stderr)
        return 1
    return 0


def asyncio_run(coro: Any) -> Any:
    """Run on uvloop where it is installed: it trims the relay's per-call overhead."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)
    return uvloop.run(coro)
