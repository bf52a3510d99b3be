"""`version` and `info`: who the runtime is and how it is doing."""

from __future__ import annotations

import argparse

from google.protobuf import json_format

from cri_proxy.ctl import output
from cri_proxy.ctl.conn import Conn


def version(args: argparse.Namespace, conn: Conn) -> int:
    r = conn.runtime("Version", conn.pb.VersionRequest(version="v1"))
    print("Version: ", r.version)
    print("RuntimeName: ", r.runtime_name)
    print("RuntimeVersion: ", r.runtime_version)
    print("RuntimeApiVersion: ", r.runtime_api_version)
    return 0


def info(args: argparse.Namespace, conn: Conn) -> int:
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
    print(output.documents_output([doc], args.output))
    return 0
