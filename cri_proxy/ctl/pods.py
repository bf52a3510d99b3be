"""Pod sandboxes: `pods`, `inspectp`, `runp`, `stopp`, `rmp`, `statsp`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cri_proxy.ctl import output, resolve, sampling
from cri_proxy.ctl.configs import load_pod_config
from cri_proxy.ctl.conn import Conn
from cri_proxy.ctl.errors import CtlError
from cri_proxy.ctl.flags import matches, newest, parse_labels, regex

STATES = {"ready": "SANDBOX_READY", "notready": "SANDBOX_NOTREADY"}
STATE_NAMES = {"SANDBOX_READY": "Ready", "SANDBOX_NOTREADY": "NotReady"}


def state_name(pb: Any, state: int) -> str:
    return STATE_NAMES.get(pb.PodSandboxState.Name(state), "Unknown")


def list_pods(conn: Conn, args: argparse.Namespace, id_prefix: str = "") -> list[Any]:
    pb = conn.pb
    flt = pb.PodSandboxFilter(label_selector=parse_labels(args.label))
    if args.state:
        key = args.state.lower()
        if key not in STATES:
            raise CtlError("--state should be ready or notready")
        flt.state.state = getattr(pb, STATES[key])
    name, namespace = regex("--name", args.name), regex("--namespace", args.namespace)
    items = conn.runtime("ListPodSandbox", pb.ListPodSandboxRequest(filter=flt)).items
    found = [
        p
        for p in items
        if p.id.startswith(id_prefix)
        and matches(name, p.metadata.name)
        and matches(namespace, p.metadata.namespace)
    ]
    return newest(found, args)


def _handler(pod: Any) -> str:
    return pod.runtime_handler or "(default)"


def pods(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    found = list_pods(conn, args, args.id)
    if output.brief_listing(args, pb.ListPodSandboxResponse(items=found), (p.id for p in found)):
        return 0
    if args.verbose:
        for p in found:
            lines = [f"ID: {p.id}"]
            meta = p.metadata
            lines += [
                f"{k}: {v}"
                for k, v in (("Name", meta.name), ("UID", meta.uid), ("Namespace", meta.namespace))
                if v
            ]
            if meta.attempt:
                lines.append(f"Attempt: {meta.attempt}")
            lines.append(f"Status: {state_name(pb, p.state)}")
            lines.append(f"Created: {output.go_time(p.created_at)}")
            lines += output.labels_block("Labels", p.labels) + output.labels_block(
                "Annotations", p.annotations
            )
            lines.append(f"Runtime: {_handler(p)}")
            print("\n".join(lines) + "\n")
        return 0
    rows = [["POD ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT", "RUNTIME"]]
    for p in found:
        rows.append(
            [
                p.id if args.no_trunc else output.truncate(p.id),
                output.ago(p.created_at),
                state_name(pb, p.state),
                p.metadata.name,
                p.metadata.namespace,
                str(p.metadata.attempt),
                _handler(p),
            ]
        )
    print(output.table(rows))
    return 0


def inspectp(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    named = [resolve.pod(conn, text).id for text in args.ids]
    ids = resolve.named_or_listed(named, lambda: list_pods(conn, args))
    if not ids:
        return resolve.nothing_found(args)
    docs = []
    for pod_id in ids:
        r = conn.runtime(
            "PodSandboxStatus", pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=not args.quiet)
        )
        if args.output == "table":
            _status_table(pb, r, not args.quiet)
            continue
        status = output.with_null_fields(output.message_dict(r.status), r.status)
        status["createdAt"] = output.rfc3339nano(r.status.created_at)
        docs.append(output.status_document(status, r.info))
    if docs:
        print(output.documents_output(docs, args.output, args.template))
    return 0


def _status_table(pb: Any, r: Any, verbose: bool) -> None:
    s = r.status
    lines = [f"ID: {s.id}"]
    lines += [
        f"{k}: {v}"
        for k, v in (("Name", s.metadata.name), ("UID", s.metadata.uid), ("Namespace", s.metadata.namespace))
        if v
    ]
    lines.append(f"Attempt: {s.metadata.attempt}")
    lines.append(f"Status: {pb.PodSandboxState.Name(s.state)}")
    lines.append(f"Created: {output.go_time(s.created_at)}")
    if s.HasField("network"):
        lines.append(f"IP Addresses: {s.network.ip}")
        lines += [f"Additional IP: {ip.ip}" for ip in s.network.additional_ips]
    lines += output.labels_block("Labels", s.labels) + output.labels_block("Annotations", s.annotations)
    if verbose:
        lines.append(f"Info: {output.go_map(r.info)}")
    print("\n".join(lines))


def runp(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    config = load_pod_config(pb, args.pod_config)
    timeout = args.cancel_timeout if args.cancel_timeout else -1.0
    r = conn.runtime(
        "RunPodSandbox", pb.RunPodSandboxRequest(config=config, runtime_handler=args.runtime), timeout
    )
    print(r.pod_sandbox_id)
    return 0


def stopp(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    for text in args.ids:
        pod = resolve.pod(conn, text)
        try:
            conn.runtime("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=pod.id))
        except CtlError as exc:
            raise CtlError(f"stopping the pod sandbox {text!r}: {exc}") from None
        print(f"Stopped sandbox {text}")
    return 0


def rmp(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    if args.all:
        if args.ids:
            raise CtlError("cannot specify POD-ID(s) when using --all")
        targets = [(p.id, p) for p in resolve.pods(conn)]
        if not targets:
            print("No pods to remove", file=sys.stderr)
            return 0
    elif not args.ids:
        raise CtlError("give at least one POD-ID, or --all")
    else:
        targets = [(text, resolve.pod(conn, text)) for text in args.ids]
    failed = 0
    for text, pod in targets:
        try:
            if pod.state == pb.SANDBOX_READY:
                if not args.force:
                    raise CtlError(f"pod sandbox {text!r} is running, please stop it first")
                conn.runtime("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=pod.id))
                print(f"Stopped sandbox {text}")
            conn.runtime("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=pod.id))
            print(f"Removed sandbox {text}")
        except CtlError as exc:
            print(f"cri-proxy ctl: removing the pod sandbox {text!r}: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def statsp(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    prefix = args.id_flag or args.id
    request = pb.ListPodSandboxStatsRequest(
        filter=pb.PodSandboxStatsFilter(id=prefix, label_selector=parse_labels(args.label))
    )  # the id is sent as crictl sends it: the runtime then skips every other sandbox

    def fetch() -> list[Any]:
        stats = conn.runtime("ListPodSandboxStats", request).stats
        return sorted((s for s in stats if s.attributes.id.startswith(prefix)), key=lambda s: s.attributes.id)

    def row(s: Any, before: Any) -> list[str] | None:
        cpu, mem = s.linux.cpu.usage_core_nano_seconds.value, s.linux.memory.working_set_bytes.value
        if cpu == 0 and mem == 0:
            return None
        return [
            s.attributes.metadata.name,
            output.truncate(s.attributes.id),
            f"{sampling.cpu_percent(s.linux.cpu, before.linux.cpu):.2f}",
            output.human_size(mem, 4),
        ]

    head = ["POD", "POD ID", "CPU %", "MEM"]
    return sampling.watch(args, fetch, lambda found: pb.ListPodSandboxStatsResponse(stats=found), head, row)
