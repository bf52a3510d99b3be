"""Debug dumps of CRI messages without secrets: environment variable values are never logged."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

REDACTED = "<redacted>"


def _scrub(value: Any) -> Any:
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "envs" and isinstance(item, list):
                out[key] = [{**env, "value": REDACTED} if isinstance(env, dict) else REDACTED for env in item]
            else:
                out[key] = _scrub(item)
        return out
    if isinstance(value, list):
        return [_scrub(item) for item in value]
    return value


MAX_DUMP_CHARS = 8192  # a 1 MiB annotation must not become a 1 MiB log line


def dump(message: Message, limit: int = MAX_DUMP_CHARS) -> str:
    """The message as one line of JSON, `envs` values replaced by <redacted>, cut at `limit`."""
    text = json.dumps(_scrub(MessageToDict(message, preserving_proto_field_name=True)), sort_keys=True)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
