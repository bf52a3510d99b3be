"""crictl's pod and container config files (JSON or YAML) as CRI messages.

Keys may be the proto names (`log_directory`, as crictl's examples write them) or the JSON
mapping's (`logDirectory`); enums by name or number. Keys this CRI version does not know are
left out with a warning, as crictl ignores them.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from cri_proxy.ctl.errors import CtlError
from cri_proxy.files import text_of


def read_document(path: str) -> Any:
    try:
        text = text_of(Path(path).read_bytes(), path)
    except FileNotFoundError:
        raise CtlError(f"config at {path} not found") from None
    except OSError as exc:
        raise CtlError(f"config at {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise CtlError(f"config at {exc}") from None
    try:
        return json.loads(text)
    except ValueError:
        pass
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CtlError(f"config at {path}: neither JSON nor YAML: {str(exc).splitlines()[0]}") from None


def parse_into(data: Any, message: Message, path: str) -> Message:
    if not isinstance(data, dict):
        raise CtlError(f"config at {path}: expected a mapping, got {type(data).__name__}")
    try:
        json_format.ParseDict(data, message)
    except json_format.ParseError as exc:
        first = str(exc).splitlines()[0]
        if "has no field named" not in first:
            raise CtlError(f"config at {path}: {first}") from None
        print(f"cri-proxy ctl: warning: config at {path}: {first} (ignored)", file=sys.stderr)
        message.Clear()
        try:
            json_format.ParseDict(data, message, ignore_unknown_fields=True)
        except json_format.ParseError as again:
            raise CtlError(f"config at {path}: {str(again).splitlines()[0]}") from None
    return message


def _with_metadata(message: Message, path: str) -> Any:
    """The config file at `path` parsed into `message`: pod and container configs both need metadata."""
    config = parse_into(read_document(path), message, path)
    if not config.HasField("metadata"):
        raise CtlError(f"config at {path}: metadata is not set")
    return config


def load_pod_config(pb: Any, path: str) -> Any:
    config = _with_metadata(pb.PodSandboxConfig(), path)
    if not config.metadata.uid:
        config.metadata.uid = str(uuid.uuid4())
    if not config.metadata.name or not config.metadata.namespace:
        raise CtlError(f"config at {path}: name or namespace is not in metadata")
    if config.HasField("linux") and not config.linux.cgroup_parent:
        print("cri-proxy ctl: warning: cgroup_parent is not set", file=sys.stderr)
    return config


def load_container_config(pb: Any, path: str) -> Any:
    config = _with_metadata(pb.ContainerConfig(), path)
    if not config.metadata.name:
        raise CtlError(f"config at {path}: name is not in metadata")
    return config
