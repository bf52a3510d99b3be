"""Printing as crictl prints: aligned tables, 13-character ids, "5 minutes ago", "1.2MB",
protobuf's JSON mapping (camelCase keys, every field), the same as YAML, and the merged
status-and-info documents of `inspect`, `inspectp`, `inspecti`, `info` and `imagefsinfo`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cri_proxy.ctl.errors import CtlError

if TYPE_CHECKING:
    from google.protobuf.message import Message

TRUNCATED_ID = 13
_DIGEST = re.compile(r"^(sha256:[0-9a-f]{64}|sha384:[0-9a-f]{96}|sha512:[0-9a-f]{128})$")


def truncate(value: str, prefix: str = "") -> str:
    """crictl's short ids: without `prefix` (e.g. "sha256:"), 13 characters."""
    if prefix and value.startswith(prefix):
        value = value[len(prefix) :]
    return value[:TRUNCATED_ID]


def short_image(image: str) -> str:
    """An image given as a digest shows as its truncated hex, a name stays a name."""
    if _DIGEST.match(image):
        return truncate(image.split(":", 1)[1])
    return image


def human_duration(seconds: float) -> str:
    """go-units' HumanDuration, which crictl prints followed by " ago"."""
    secs = int(seconds)
    if secs < 1:
        return "Less than a second"
    if secs == 1:
        return "1 second"
    if secs < 60:
        return f"{secs} seconds"
    minutes = int(seconds / 60)
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = int(seconds / 3600 + 0.5)
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    if hours < 24 * 7 * 2:
        return f"{hours // 24} days"
    if hours < 24 * 30 * 2:
        return f"{hours // 24 // 7} weeks"
    if hours < 24 * 365 * 2:
        return f"{hours // 24 // 30} months"
    return f"{int(seconds / 3600) // 24 // 365} years"


def ago(timestamp_ns: int, now_ns: int | None = None) -> str:
    now = time.time_ns() if now_ns is None else now_ns
    return human_duration(max(0, now - timestamp_ns) / 1e9) + " ago"


def human_size(size: float, precision: int = 3) -> str:
    """go-units' HumanSizeWithPrecision: decimal units, `%.<precision>g`, no space ("1.2MB")."""
    units = ("B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB")
    i = 0
    while size >= 1000.0 and i < len(units) - 1:
        size /= 1000.0
        i += 1
    return f"{size:.{precision}g}{units[i]}"


def rfc3339nano(timestamp_ns: int) -> str:
    """Go's time.Unix(0, ns).Format(time.RFC3339Nano), in the local time zone."""
    secs, nanos = divmod(timestamp_ns, 1_000_000_000)
    moment = dt.datetime.fromtimestamp(secs, dt.UTC).astimezone()
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if nanos:
        text += "." + f"{nanos:09d}".rstrip("0")
    offset = moment.utcoffset()
    if not offset:
        return text + "Z"
    total = int(offset.total_seconds())
    sign = "+" if total >= 0 else "-"
    hours, minutes = divmod(abs(total) // 60, 60)
    return f"{text}{sign}{hours:02d}:{minutes:02d}"


def go_time(timestamp_ns: int) -> str:
    """Go's time.Time printed with %v: "2006-01-02 15:04:05.999999999 -0700 MST", local time."""
    secs, nanos = divmod(timestamp_ns, 1_000_000_000)
    moment = dt.datetime.fromtimestamp(secs, dt.UTC).astimezone()
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    if nanos:
        text += "." + f"{nanos:09d}".rstrip("0")
    return f"{text} {moment.strftime('%z')} {moment.strftime('%Z')}"


def go_map(values: Mapping[str, str]) -> str:
    """A Go map[string]string printed with %v: "map[k1:v1 k2:v2]", keys sorted."""
    return "map[" + " ".join(f"{k}:{values[k]}" for k in sorted(values)) + "]"


def table(rows: Sequence[Sequence[str]], minwidth: int = 20, padding: int = 3) -> str:
    """Go's tabwriter as crictl sets it up: every column but the last at least `minwidth` wide,
    cells padded by `padding` spaces; the last column is not padded."""
    if not rows:
        return ""
    columns = max(len(r) for r in rows)
    widths = [
        max([minwidth] + [len(r[i]) + padding for r in rows if i < len(r) - 1]) for i in range(columns - 1)
    ]
    lines = []
    for row in rows:
        cells = [cell.ljust(widths[i]) if i < len(row) - 1 else cell for i, cell in enumerate(row)]
        lines.append("".join(cells))
    return "\n".join(lines)


def plain_table(heads: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """The proxy's own tables (`cpusets`, `pools`, `problems`): columns two spaces apart."""
    body = [list(r) for r in rows]
    widths = [max([len(h)] + [len(line[i]) for line in body]) for i, h in enumerate(heads)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in body]
    return "\n".join(lines)


def _in_field_order(message: Any, data: dict[str, Any]) -> dict[str, Any]:
    """`data` (protobuf's JSON mapping of `message`) with keys in field-number order and map
    entries sorted, as Go's protojson writes them (Python's puts unset fields last)."""
    ordered: dict[str, Any] = {}
    for f in message.DESCRIPTOR.fields:
        if f.json_name not in data:
            continue
        value = data[f.json_name]
        kind = f.message_type
        if kind is not None and kind.GetOptions().map_entry:
            items = getattr(message, f.name)
            nested = kind.fields_by_name["value"].message_type is not None
            value = {k: _in_field_order(items[k], v) if nested else v for k, v in sorted(value.items())}
        elif kind is not None and f.is_repeated:
            value = [
                _in_field_order(m, d) if isinstance(d, dict) else d
                for m, d in zip(getattr(message, f.name), value, strict=False)
            ]
        elif kind is not None and isinstance(value, dict):
            value = _in_field_order(getattr(message, f.name), value)
        ordered[f.json_name] = value
    ordered.update({k: v for k, v in data.items() if k not in ordered})
    return ordered


def message_dict(message: Message) -> dict[str, Any]:
    """The JSON mapping of `message`: camelCase keys, every field, in Go's order."""
    from google.protobuf import json_format

    data = json_format.MessageToDict(message, always_print_fields_with_no_presence=True)
    return _in_field_order(message, data)


def message_json(message: Message) -> str:
    """crictl's protobufObjectToJSON: the JSON mapping, every field, indented by two spaces."""
    return json.dumps(message_dict(message), indent=2, ensure_ascii=False)


def go_json(data: Any) -> str:
    """Go's json.Marshal then json.Indent: keys sorted, <, > and & escaped."""
    text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def to_yaml(data: Any) -> str:
    """YAML as crictl's (sigs.k8s.io/yaml) writes it: keys sorted, strings that need quotes in
    double quotes."""
    import yaml

    class Dumper(yaml.SafeDumper):
        """go-yaml's choices: a string that would read back as another type (or is empty) in
        double quotes, one of several lines as a literal block, else plain or single-quoted."""

    def string(dumper: yaml.SafeDumper, value: str) -> Any:
        tag = "tag:yaml.org,2002:str"
        if "\n" in value:
            return dumper.represent_scalar(tag, value, style="|")
        if not value or dumper.resolve(yaml.ScalarNode, value, (True, False)) != tag:  # type: ignore[no-untyped-call]
            return dumper.represent_scalar(tag, value, style='"')
        return dumper.represent_scalar(tag, value)

    Dumper.add_representer(str, string)

    text: str = yaml.dump(data, Dumper=Dumper, sort_keys=True, default_flow_style=False, allow_unicode=True)
    return text


def message_output(message: Message, fmt: str) -> str:
    """`-o json` / `-o yaml` of a list command: the CRI response itself (YAML with the blank
    line crictl's Println adds after it)."""
    if fmt == "json":
        return message_json(message)
    if fmt == "yaml":
        return to_yaml(message_dict(message))
    raise CtlError(f"unsupported output format {fmt!r}")


def status_document(
    status: Mapping[str, Any] | None, info: Mapping[str, str], extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """crictl's status-and-info document: {"status": ..., <each info key>: parsed JSON or text}."""
    doc: dict[str, Any] = {}
    if status is not None:
        doc["status"] = dict(status)
    for key, value in (extra or {}).items():
        if value:
            doc[key] = value
    for key in sorted(info):
        value = info[key]
        if value.startswith("{"):
            try:
                doc[key] = json.loads(value)
            except ValueError:
                raise CtlError(f"the runtime's info[{key!r}] is not valid JSON") from None
        else:
            doc[key] = value.strip('"')
    return doc


def documents_output(docs: Sequence[dict[str, Any]], fmt: str, template: str = "") -> str:
    """One document alone, several as a list; keys sorted at every level, as crictl's are;
    `go-template` executes `template` on that same document."""
    data: Any = docs[0] if len(docs) == 1 else list(docs)
    if fmt == "go-template":
        from cri_proxy.ctl.gotemplate import render

        return render(template, data)
    if fmt == "json":
        return go_json(data)
    if fmt == "yaml":
        return to_yaml(data)
    raise CtlError(f"unsupported output format {fmt!r}")


def with_null_fields(data: dict[str, Any], message: Message) -> dict[str, Any]:
    """Unset message fields show as null at the top level, as in crictl's inspect output."""
    for field in message.DESCRIPTOR.fields:
        data.setdefault(field.json_name, None)
    return data


def labels_block(title: str, values: Mapping[str, str]) -> list[str]:
    if not values:
        return []
    return [f"{title}:"] + [f"\t{k} -> {values[k]}" for k in sorted(values)]


def brief_listing(args: argparse.Namespace, response: Message, ids: Iterable[str]) -> bool:
    """`-o json|yaml` (the response) or `-q` (ids alone), the same for every list command; True
    when printed, and the command's own table or verbose form is not wanted."""
    if args.output != "table":
        print(message_output(response, args.output))
        return True
    if args.quiet:
        for item_id in ids:
            print(item_id)
        return True
    return False
