"""Containers: `ps`, `inspect`, `create`, `start`, `stop`, `rm`, `update`, `exec`, `stats`."""

from __future__ import annotations

import argparse
import glob
import os
import sys
from typing import Any

from cri_proxy.ctl import output, resolve, sampling
from cri_proxy.ctl.configs import load_container_config, load_pod_config
from cri_proxy.ctl.conn import Conn
from cri_proxy.ctl.errors import CtlError
from cri_proxy.ctl.flags import matches, newest, parse_labels, regex

STATES = {
    "created": "CONTAINER_CREATED",
    "running": "CONTAINER_RUNNING",
    "exited": "CONTAINER_EXITED",
    "unknown": "CONTAINER_UNKNOWN",
}
STATE_NAMES = {v: k.capitalize() for k, v in STATES.items()}
POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's zero time, as crictl prints a time not reached


def state_name(pb: Any, state: int) -> str:
    return STATE_NAMES.get(pb.ContainerState.Name(state), "Unknown")


def _image_id(conn: Conn, ref: str) -> str:
    r = conn.image("ImageStatus", conn.pb.ImageStatusRequest(image=conn.pb.ImageSpec(image=ref)))
    return str(r.image.id) if r.HasField("image") else ""


def list_containers(conn: Conn, args: argparse.Namespace, id_prefix: str = "") -> list[Any]:
    pb = conn.pb
    flt = pb.ContainerFilter(label_selector=parse_labels(args.label))
    if args.state:
        key = args.state.lower()
        if key not in STATES:
            raise CtlError("--state should be one of created, running, exited or unknown")
        flt.state.state = getattr(pb, STATES[key])
    elif not args.all:
        flt.state.state = pb.CONTAINER_RUNNING
    if args.latest or args.last > 0:
        flt.ClearField("state")
    name, namespace = regex("--name", args.name), regex("--namespace", args.namespace)
    items = conn.runtime("ListContainers", pb.ListContainersRequest(filter=flt)).containers
    found = [
        c
        for c in items
        if c.id.startswith(id_prefix)
        and c.pod_sandbox_id.startswith(args.pod)
        and matches(name, c.metadata.name)
        and matches(namespace, c.labels.get(POD_NAMESPACE, "unknown"))
    ]
    if args.image:
        want = _image_id(conn, args.image)
        found = [c for c in found if want and _image_id(conn, c.image.image) == want]
    return newest(found, args)


def ps(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    found = list_containers(conn, args, args.id)
    if output.brief_listing(args, pb.ListContainersResponse(containers=found), (c.id for c in found)):
        return 0
    if args.verbose:
        for c in found:
            lines = [
                f"ID: {c.id}",
                f"PodID: {c.pod_sandbox_id}",
                f"Namespace: {c.labels.get(POD_NAMESPACE, 'unknown')}",
            ]
            if c.metadata.name:
                lines.append(f"Name: {c.metadata.name}")
            lines.append(f"Attempt: {c.metadata.attempt}")
            lines.append(f"State: {state_name(pb, c.state)}")
            lines.append(f"Image: {c.image.image}")
            lines.append(f"Created: {output.ago(c.created_at)}")
            lines += output.labels_block("Labels", c.labels) + output.labels_block(
                "Annotations", c.annotations
            )
            print("\n".join(lines) + "\n")
        return 0
    rows = [["CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID", "POD", "NAMESPACE"]]
    for c in found:
        image = c.image.image
        if not args.no_trunc:
            image = output.short_image(image)
        if args.resolve_image_path:
            r = conn.image("ImageStatus", pb.ImageStatusRequest(image=pb.ImageSpec(image=c.image.image)))
            image = r.image.repo_tags[0] if r.image.repo_tags else image
        rows.append(
            [
                c.id if args.no_trunc else output.truncate(c.id),
                image,
                output.ago(c.created_at),
                state_name(pb, c.state),
                c.metadata.name,
                str(c.metadata.attempt),
                c.pod_sandbox_id if args.no_trunc else output.truncate(c.pod_sandbox_id),
                c.labels.get(POD_NAME, "unknown"),
                c.labels.get(POD_NAMESPACE, "unknown"),
            ]
        )
    print(output.table(rows))
    return 0


def inspect(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    named = [resolve.container(conn, text).id for text in args.ids]
    ids = resolve.named_or_listed(named, lambda: list_containers(conn, args))
    docs = []
    for cid in ids:
        r = conn.runtime(
            "ContainerStatus", pb.ContainerStatusRequest(container_id=cid, verbose=not args.quiet)
        )
        s = r.status
        if args.output == "table":
            _status_table(pb, r, not args.quiet)
            continue
        status = output.with_null_fields(output.message_dict(s), s)
        status["createdAt"] = output.rfc3339nano(s.created_at)
        started = s.state != pb.CONTAINER_CREATED
        exited = s.state == pb.CONTAINER_EXITED or (s.state == pb.CONTAINER_UNKNOWN and s.finished_at > 0)
        status["startedAt"] = output.rfc3339nano(s.started_at) if started else ZERO_TIME
        status["finishedAt"] = output.rfc3339nano(s.finished_at) if exited else ZERO_TIME
        docs.append(output.status_document(status, r.info))
    if docs:
        print(output.documents_output(docs, args.output))
    return 0


def _status_table(pb: Any, r: Any, verbose: bool) -> None:
    s = r.status
    lines = [f"ID: {s.id}"]
    if s.metadata.name:
        lines.append(f"Name: {s.metadata.name}")
    if s.metadata.attempt:
        lines.append(f"Attempt: {s.metadata.attempt}")
    lines.append(f"State: {pb.ContainerState.Name(s.state)}")
    lines.append(f"Created: {output.ago(s.created_at)}")
    if s.state != pb.CONTAINER_CREATED:
        lines.append(f"Started: {output.ago(s.started_at)}")
    if s.state == pb.CONTAINER_EXITED:
        if s.finished_at > 0:
            lines.append(f"Finished: {output.ago(s.finished_at)}")
        lines.append(f"Exit Code: {s.exit_code}")
    lines += output.labels_block("Labels", s.labels) + output.labels_block("Annotations", s.annotations)
    if verbose:
        lines.append(f"Info: {dict(r.info)}")
    print("\n".join(lines))


def create(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    if args.no_pull and args.with_pull:
        raise CtlError("conflict: no-pull and with-pull are both set")
    config = load_container_config(pb, args.container_config)
    pod_config = load_pod_config(pb, args.pod_config)
    pod = resolve.pod(conn, args.pod)
    if not config.image.user_specified_image:
        config.image.user_specified_image = config.image.image
    if args.with_pull or (conn.settings.pull_image_on_create and not args.no_pull):
        request = pb.PullImageRequest(image=pb.ImageSpec(image=config.image.image), sandbox_config=pod_config)
        conn.image("PullImage", request, None)
    timeout = args.cancel_timeout if args.cancel_timeout else -1.0
    request = pb.CreateContainerRequest(pod_sandbox_id=pod.id, config=config, sandbox_config=pod_config)
    try:
        r = conn.runtime("CreateContainer", request, timeout)
    except CtlError as exc:
        raise CtlError(f"creating container: {exc}") from None
    print(r.container_id)
    return 0


def _each(texts: list[str], conn: Conn, verb: str, action: Any) -> int:
    """Run `action(text, container)` for every id; report each failure, go on with the rest."""
    failed = 0
    for text in texts:
        try:
            action(text, resolve.container(conn, text))
        except CtlError as exc:
            print(f"cri-proxy ctl: {verb} the container {text!r}: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def start(args: argparse.Namespace, conn: Conn) -> int:
    def act(text: str, c: Any) -> None:
        conn.runtime("StartContainer", conn.pb.StartContainerRequest(container_id=c.id))
        print(text)

    return _each(args.ids, conn, "starting", act)


def stop(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    if args.all and args.ids:
        raise CtlError("cannot specify CONTAINER-ID(s) when using --all")
    texts = list(args.ids)
    if args.all:
        running = [c.id for c in resolve.containers(conn) if c.state == pb.CONTAINER_RUNNING]
        if not running:
            print("No running containers found.")
            return 0
        texts = running
    elif not texts:
        raise CtlError("you must specify at least one CONTAINER-ID or use --all")

    def act(text: str, c: Any) -> None:
        request = pb.StopContainerRequest(container_id=c.id, timeout=args.stop_timeout)
        conn.runtime("StopContainer", request, conn.settings.timeout + max(0, args.stop_timeout))
        print(text)

    return _each(texts, conn, "stopping", act)


def _remove_logs(path: str, text: str) -> None:
    if not os.path.isabs(path):  # never relative to wherever ctl happens to run
        return
    for file in [*glob.glob(glob.escape(path) + ".*"), path]:
        try:
            os.remove(file)
        except FileNotFoundError:
            pass
        except OSError as exc:
            print(
                f"cri-proxy ctl: removing log file {file} of container {text!r}: {exc.strerror}",
                file=sys.stderr,
            )


def rm(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    texts = list(args.ids)
    if args.all:
        if texts:
            raise CtlError("cannot specify CONTAINER-ID(s) when using --all")
        texts = [c.id for c in resolve.containers(conn)]
        if not texts:
            print("No containers to remove", file=sys.stderr)
            return 0
    elif not texts:
        raise CtlError("give at least one CONTAINER-ID, or --all")

    def act(text: str, c: Any) -> None:
        status = conn.runtime("ContainerStatus", pb.ContainerStatusRequest(container_id=c.id)).status
        if status.state == pb.CONTAINER_RUNNING:
            if not args.force:
                raise CtlError(f"container {text!r} is running, please stop it first")
            conn.runtime("StopContainer", pb.StopContainerRequest(container_id=c.id))
        conn.runtime("RemoveContainer", pb.RemoveContainerRequest(container_id=c.id))
        if not args.keep_logs and status.log_path:
            _remove_logs(status.log_path, text)
        print(text)

    return _each(texts, conn, "removing", act)


def update(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    linux = pb.LinuxContainerResources(
        cpu_period=args.cpu_period,
        cpu_quota=args.cpu_quota,
        cpu_shares=args.cpu_share,
        cpuset_cpus=args.cpuset_cpus,
        cpuset_mems=args.cpuset_mems,
        memory_limit_in_bytes=args.memory,
        oom_score_adj=args.oom_score_adj,
    )

    def act(text: str, c: Any) -> None:
        conn.runtime(
            "UpdateContainerResources", pb.UpdateContainerResourcesRequest(container_id=c.id, linux=linux)
        )
        print(text)

    return _each(args.ids, conn, "updating resources of", act)


def exec_(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    if args.interactive or args.tty:
        raise CtlError(
            "exec -i/-t needs the streaming server: use crictl; here commands run with ExecSync"
        )
    cmd = list(args.cmd)
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    if not cmd:
        raise CtlError("exec: give a COMMAND after the CONTAINER-ID")
    c = resolve.container(conn, args.container)
    deadline = conn.settings.timeout + args.exec_timeout if args.exec_timeout > 0 else None
    try:
        r = conn.runtime(
            "ExecSync", pb.ExecSyncRequest(container_id=c.id, cmd=cmd, timeout=args.exec_timeout), deadline
        )
    except CtlError as exc:
        raise CtlError(f"execing command in container {args.container}: {exc}") from None
    sys.stdout.buffer.write(r.stdout)
    sys.stdout.flush()
    sys.stderr.buffer.write(r.stderr)
    sys.stderr.flush()
    return int(r.exit_code)


def stats(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    prefix = args.id_flag or args.id
    flt = pb.ContainerStatsFilter(label_selector=parse_labels(args.label))
    request = pb.ListContainerStatsRequest(filter=flt)

    pods_of = {c.id: c.pod_sandbox_id for c in resolve.containers(conn)} if args.pod else {}

    def fetch() -> list[Any]:
        found = conn.runtime("ListContainerStats", request).stats
        kept = [
            s
            for s in found
            if s.attributes.id.startswith(prefix) and pods_of.get(s.attributes.id, "").startswith(args.pod)
        ]
        return sorted(kept, key=lambda s: s.attributes.id)

    def row(s: Any, before: Any) -> list[str] | None:
        cpu, mem = s.cpu.usage_core_nano_seconds.value, s.memory.working_set_bytes.value
        if not args.all and cpu == 0 and mem == 0:
            return None
        return [
            output.truncate(s.attributes.id),
            s.attributes.metadata.name,
            f"{sampling.cpu_percent(s.cpu, before.cpu):.2f}",
            output.human_size(mem, 4),
            output.human_size(s.writable_layer.used_bytes.value, 4),
            str(s.writable_layer.inodes_used.value),
            output.human_size(s.swap.swap_usage_bytes.value, 4),
        ]

    head = ["CONTAINER", "NAME", "CPU %", "MEM", "DISK", "INODES", "SWAP"]
    return sampling.watch(args, fetch, lambda found: pb.ListContainerStatsResponse(stats=found), head, row)
