"""`version` and `info`: who the runtime is and how it is doing."""

from __future__ import annotations

import argparse

from cri_proxy.ctl.conn import Conn


def version(args: argparse.Namespace, conn: Conn) -> int:
    if conn.settings.debug:
        r = conn.runtime("Version", conn.pb.VersionRequest(version="v1"))
        answer = [r.version, r.runtime_name, r.runtime_version, r.runtime_api_version]
    else:  # the common case, kept light: no CRI messages imported (docs/performance.md)
        from cri_proxy.ctl import protowire

        found = protowire.fields(conn.call_raw("RuntimeService", "Version", protowire.string_field(1, "v1")))
        answer = [protowire.text(found, n) for n in (1, 2, 3, 4)]
    labels = ("Version", "RuntimeName", "RuntimeVersion", "RuntimeApiVersion")
    for label, value in zip(labels, answer, strict=True):
        print(f"{label}:  {value}")
    return 0


def info(args: argparse.Namespace, conn: Conn) -> int:
    from google.protobuf import json_format

    from cri_proxy.ctl import output

    r = conn.runtime("Status", conn.pb.StatusRequest(verbose=not args.quiet))
    # crictl marshals these two with Go's encoding/json: proto field names, zero values left out
    extra = {
        "runtimeHandlers": [
            json_format.MessageToDict(h, preserving_proto_field_name=True) for h in r.runtime_handlers
        ],
        "features": json_format.MessageToDict(r.features, preserving_proto_field_name=True)
        if r.HasField("features")
        else None,
    }
    doc = output.status_document(output.message_dict(r.status), r.info, extra)
    print(output.documents_output([doc], args.output, args.template))
    return 0


def runtime_config(args: argparse.Namespace, conn: Conn) -> int:
    """RuntimeConfig: the runtime's cgroup driver, as crictl prints it."""
    from cri_proxy.ctl.errors import CtlError
    from cri_proxy.ctl.output import table

    try:
        r = conn.runtime("RuntimeConfig", conn.pb.RuntimeConfigRequest())
    except CtlError as exc:
        raise CtlError(f"get runtime config: call RuntimeConfig RPC: {exc}") from None
    if r.HasField("linux"):
        driver = conn.pb.CgroupDriver.Name(r.linux.cgroup_driver)
        print(table([["cgroup driver:", driver]], minwidth=10, padding=3))
    return 0


def update_runtime_config(args: argparse.Namespace, conn: Conn) -> int:
    """UpdateRuntimeConfig with --pod-cidr; the usage when nothing is given, as crictl."""
    import sys

    from cri_proxy.ctl.errors import CtlError

    if args.pod_cidr is None:
        args.ctl_parser.print_help()
        return 0
    pb = conn.pb
    config = pb.RuntimeConfig(network_config=pb.NetworkConfig(pod_cidr=args.pod_cidr))
    try:
        conn.runtime("UpdateRuntimeConfig", pb.UpdateRuntimeConfigRequest(runtime_config=config))
    except CtlError as exc:
        raise CtlError(f"update runtime config: {exc}") from None
    print("cri-proxy ctl: runtime config successfully updated", file=sys.stderr)
    return 0


def metricdescs(args: argparse.Namespace, conn: Conn) -> int:
    from cri_proxy.ctl import output
    from cri_proxy.ctl.errors import CtlError

    try:
        r = conn.runtime("ListMetricDescriptors", conn.pb.ListMetricDescriptorsRequest())
    except CtlError as exc:
        raise CtlError(f"get metric descriptors: list metric descriptors: {exc}") from None
    print(output.message_output(r, args.output))
    return 0


def metricsp(args: argparse.Namespace, conn: Conn) -> int:
    import time

    from cri_proxy.ctl import output
    from cri_proxy.ctl.errors import CtlError

    while True:
        try:
            r = conn.runtime("ListPodSandboxMetrics", conn.pb.ListPodSandboxMetricsRequest())
        except CtlError as exc:
            raise CtlError(f"get pod metrics: list pod sandbox metrics: {exc}") from None
        print(output.message_output(r, args.output), flush=True)
        if not args.watch:
            return 0
        time.sleep(1)


def events(args: argparse.Namespace, conn: Conn) -> int:
    """GetContainerEvents, one document per event until the stream ends or Ctrl-C (grpcio: a
    server stream)."""
    import grpc

    from cri_proxy.ctl import output
    from cri_proxy.ctl.errors import CtlError

    if args.template and args.output != "go-template":
        raise CtlError(f"template can't be used with {args.output!r} format")
    if args.output == "go-template":
        from cri_proxy.ctl.gotemplate import parse

        parse(args.template)  # a bad template is refused before anything is asked
    stub = conn.client(conn.settings.runtime_endpoint).runtime
    try:
        for event in stub.GetContainerEvents(conn.pb.GetEventsRequest(), timeout=None):
            if args.output == "go-template":
                from cri_proxy.ctl.gotemplate import render

                print(render(args.template, output.message_dict(event)), flush=True)
            else:
                print(output.message_output(event, args.output), flush=True)
    except grpc.RpcError as exc:
        raise CtlError(f"getting container events: {conn.fail(exc, 'RuntimeService', None)}") from None
    return 0
