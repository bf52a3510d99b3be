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
    if not ids:
        return resolve.nothing_found(args)
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
        print(output.documents_output(docs, args.output, args.template))
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
        lines.append(f"Info: {output.go_map(r.info)}")
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


def _resource_flags(args: argparse.Namespace) -> bool:
    """Whether `update` was given any resource to change (besides the proxy's --unpin)."""
    values = (args.cpu_count, args.cpu_maximum, args.cpu_period, args.cpu_quota, args.cpu_share)
    return any(values) or any((args.cpuset_cpus, args.cpuset_mems, args.memory, args.oom_score_adj))


def update(args: argparse.Namespace, conn: Conn) -> int:
    if args.unpin:
        if args.cpuset_cpus or args.force:
            raise CtlError("--unpin cannot be used with --cpuset-cpus or --force")
        if not _resource_flags(args):  # the proxy's reconciler applies the rules' cpuset itself
            return _each(args.ids, conn, "unpinning", lambda text, c: _unpin(conn, text, c.id))
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

    request = pb.UpdateContainerResourcesRequest(linux=linux)
    if args.cpu_count or args.cpu_maximum:  # crictl sends these (Windows only) as given
        request.windows.cpu_count, request.windows.cpu_maximum = args.cpu_count, args.cpu_maximum

    def act(text: str, c: Any) -> None:
        from cri_proxy.ctl.proxy import check_update, unpin

        if args.unpin:
            unpin(conn, c.id)
        check_update(conn, c.id, args.cpuset_cpus, args.force)  # the proxy's word first, unless --bypass
        request.container_id = c.id
        conn.runtime("UpdateContainerResources", request)
        print(text)

    return _each(args.ids, conn, "updating resources of", act)


def _unpin(conn: Conn, text: str, container_id: str) -> None:
    from cri_proxy.ctl.proxy import unpin

    unpin(conn, container_id)
    print(text)


def _exec_targets(args: argparse.Namespace, conn: Conn) -> tuple[list[str], list[str], bool]:
    """(container ids as given, the command, print each id first): crictl takes the first word as
    the container unless a filter flag (--name, --pod, --image, --state, --label, --latest,
    --last) selects the containers."""
    words = list(args.cmd)
    if words[:1] == ["--"]:
        words = words[1:]
    filtered = any((args.name, args.pod, args.image, args.state, args.label, args.latest, args.last))
    if not filtered:
        return words[:1], words[1:], False
    args.all, args.namespace = False, None
    found = list_containers(conn, args)
    return [c.id for c in found], words, not args.quiet and not args.parallel


def exec_(args: argparse.Namespace, conn: Conn) -> int:
    ids, cmd, show_id = _exec_targets(args, conn)
    if not ids or not cmd:
        if ids == [] and cmd:
            print("cri-proxy ctl: no containers found per filter flags", file=sys.stderr)
        args.ctl_parser.print_help()
        return 0
    failed = 0
    for text in ids:
        if show_id:
            print(text + ":", flush=True)
        try:
            if args.sync:
                _exec_sync(conn, text, cmd, args.exec_timeout)
            else:
                _exec_stream(conn, args, text, cmd)
        except CtlError as exc:
            if not args.ignore_errors:
                print(f"cri-proxy ctl: {exc}", file=sys.stderr)
                failed += 1
    return 1 if failed else 0


def _exec_sync(conn: Conn, text: str, cmd: list[str], timeout: int) -> None:
    """ExecSync as crictl runs it: the output and then the error output, both on stdout, each
    followed by a newline; a command that fails is an error naming its exit code and stderr."""
    pb = conn.pb
    c = resolve.container(conn, text)
    deadline = conn.settings.timeout + timeout if timeout > 0 else None
    try:
        r = conn.runtime(
            "ExecSync", pb.ExecSyncRequest(container_id=c.id, cmd=cmd, timeout=timeout), deadline
        )
    except CtlError as exc:
        raise CtlError(f"execing command in container {text} synchronously: {exc}") from None
    if r.exit_code != 0:
        raise CtlError(
            f"execing command in container {text} synchronously: command {' '.join(cmd)!r} "
            f"exited with {r.exit_code}: {r.stderr.decode(errors='replace')}"
        )
    sys.stdout.buffer.write(r.stdout + b"\n" + r.stderr + b"\n")
    sys.stdout.flush()


def _exec_stream(conn: Conn, args: argparse.Namespace, text: str, cmd: list[str]) -> None:
    from cri_proxy.ctl import stream

    pb = conn.pb
    c = resolve.container(conn, text)
    request = pb.ExecRequest(
        container_id=c.id, cmd=cmd, tty=args.tty, stdin=args.interactive, stdout=True, stderr=not args.tty
    )
    try:
        url = conn.runtime("Exec", request).url
        status = stream.session(url, stream.tls_of(args), conn.settings.timeout, args.interactive, args.tty)
    except CtlError as exc:
        raise CtlError(f"execing command in container {text}: {exc}") from None
    code = stream.exit_code(status)
    if code is None:
        message = status.get("message", "failed") if status else "failed"
        raise CtlError(f"execing command in container {text}: {message}")
    if code:
        raise CtlError(f"execing command in container {text}: command terminated with exit code {code}")


def attach(args: argparse.Namespace, conn: Conn) -> int:
    from cri_proxy.ctl import stream

    pb = conn.pb
    c = resolve.container(conn, args.container)
    request = pb.AttachRequest(
        container_id=c.id, stdin=args.stdin, tty=args.tty, stdout=True, stderr=not args.tty
    )
    try:
        url = conn.runtime("Attach", request).url
        status = stream.session(url, stream.tls_of(args), conn.settings.timeout, args.stdin, args.tty)
    except CtlError as exc:
        raise CtlError(f"attaching running container failed: {exc}") from None
    if stream.exit_code(status) is None and status is not None:
        raise CtlError(f"attaching running container failed: {status.get('message', 'failed')}")
    return 0


def stats(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    prefix = args.id_flag or args.id
    pod_id = resolve.pod(conn, args.pod).id if args.pod else ""
    flt = pb.ContainerStatsFilter(id=prefix, pod_sandbox_id=pod_id, label_selector=parse_labels(args.label))
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


def _auth(pb: Any, args: argparse.Namespace) -> Any:
    """crictl's --creds USER[:PASS], --auth BASE64 or --username (password asked on the terminal)."""
    if args.username:
        import getpass

        return pb.AuthConfig(username=args.username, password=getpass.getpass("Enter Password:"))
    if args.creds and args.auth:
        raise CtlError("both `--creds` and `--auth` are specified")
    if args.creds:
        user, _, password = args.creds.partition(":")
        if not user:
            raise CtlError("username cannot be empty")
        return pb.AuthConfig(username=user, password=password)
    if args.auth:
        return pb.AuthConfig(auth=args.auth)
    return None


def run(args: argparse.Namespace, conn: Conn) -> int:
    """`run`: a pod, then a container in it, started; the container's id printed (crictl's `run`)."""
    pb = conn.pb
    if not args.container_config or not args.pod_config:
        args.ctl_parser.print_help()
        return 0
    if args.no_pull and args.with_pull:
        raise CtlError("conflict: no-pull and with-pull are both set")
    config = load_container_config(pb, args.container_config)
    pod_config = load_pod_config(pb, args.pod_config)
    try:
        pod_id = conn.runtime(
            "RunPodSandbox", pb.RunPodSandboxRequest(config=pod_config, runtime_handler=args.runtime)
        ).pod_sandbox_id
    except CtlError as exc:
        raise CtlError(f"running container: run pod sandbox: {exc}") from None
    if not config.image.user_specified_image:
        config.image.user_specified_image = config.image.image
    if not args.no_pull:
        request = pb.PullImageRequest(image=pb.ImageSpec(image=config.image.image), sandbox_config=pod_config)
        auth = _auth(pb, args)
        if auth is not None:
            request.auth.CopyFrom(auth)
        try:
            conn.image("PullImage", request, args.pull_timeout or None)
        except CtlError as exc:
            raise CtlError(f"running container: creating container failed: pulling image: {exc}") from None
    timeout = args.cancel_timeout if args.cancel_timeout else -1.0
    request = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod_config)
    try:
        cid = conn.runtime("CreateContainer", request, timeout).container_id
    except CtlError as exc:
        raise CtlError(f"running container: creating container failed: {exc}") from None
    try:
        conn.runtime("StartContainer", pb.StartContainerRequest(container_id=cid))
    except CtlError as exc:
        raise CtlError(f"running container: starting the container {cid!r}: {exc}") from None
    print(cid)
    return 0


def checkpoint(args: argparse.Namespace, conn: Conn) -> int:
    """CheckpointContainer to the --export archive, each container in turn, as crictl does."""
    pb = conn.pb
    if not args.ids:
        raise CtlError("ID cannot be empty")
    if not args.export:
        raise CtlError(
            "cannot checkpoint a container without specifying the checkpoint destination. "
            "Use --export=/path/to/checkpoint.tar"
        )
    for text in args.ids:
        try:
            conn.runtime(
                "CheckpointContainer", pb.CheckpointContainerRequest(container_id=text, location=args.export)
            )
        except CtlError as exc:
            raise CtlError(f"checkpointing the container {text!r} failed: {exc}") from None
        print(text)
    return 0
