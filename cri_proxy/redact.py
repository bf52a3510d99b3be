"""Debug dumps of CRI messages without secrets, at every log level.

Never logged: environment variable values (`envs`), a container's `command` and `args` and an
exec's `cmd` (they carry tokens and passwords as often as env does), and the
`kubectl.kubernetes.io/last-applied-configuration` annotation (the whole object as applied,
secrets' literal values included). Their shape stays: how many there were, and env keys.
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

REDACTED = "<redacted>"
SECRET_LISTS = frozenset({"args", "command", "cmd"})
"""Repeated string fields whose every item is replaced."""
SECRET_ANNOTATIONS = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})
"""Map keys (annotations, labels) whose value is replaced."""


def _scrub(value: Any) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key == "envs" and isinstance(item, list):
                out[key] = [{**env, "value": REDACTED} if isinstance(env, dict) else REDACTED for env in item]
            elif key in SECRET_LISTS and isinstance(item, list):
                out[key] = [REDACTED] * len(item)
            elif key in SECRET_ANNOTATIONS:
                out[key] = REDACTED
            else:
                out[key] = _scrub(item)
        return out
    if isinstance(value, list):
        return [_scrub(item) for item in value]
    return value


MAX_DUMP_CHARS = 8192  # a 1 MiB annotation must not become a 1 MiB log line


def dump(message: Message, limit: int = MAX_DUMP_CHARS) -> str:
    """The message as one line of JSON, secrets replaced by <redacted> (see above), cut at `limit`."""
    text = json.dumps(_scrub(MessageToDict(message, preserving_proto_field_name=True)), sort_keys=True)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
