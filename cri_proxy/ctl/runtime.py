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
