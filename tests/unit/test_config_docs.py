"""docs/configuration.md documents every option of `cri-proxy serve`, as the code has it.

Adding a field to `Config` (or a flag to `serve`) without a row in the Options table fails here,
and so does a row whose default, flag or reload column no longer matches the code.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from cri_proxy import config
from cri_proxy.cli import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
ROW = re.compile(r"^\|\s*`([a-z_][a-z0-9_.]*)`\s*\|(.*)\|\s*$")


def doc_rows() -> dict[str, list[str]]:
    """TOML key -> [flag, default, SIGHUP, description] from the Options table."""
    text = DOC.read_text()
    table = text[text.index("## Options") :]
    table = table[: table.index("\n\n", table.index("|"))]
    rows: dict[str, list[str]] = {}
    for line in table.splitlines():
        m = ROW.match(line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)}: documented twice"
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return rows


def toml_key(field: str) -> str:
    """The key as the file spells it: `kubernetes_enabled` is `enabled` in `[kubernetes]`."""
    for table, prefix in getattr(config, "TABLES", {}).items():
        if field.startswith(prefix):
            return f"{table}.{field.removeprefix(prefix)}"
    return field


def config_fields(obj: Any = None, prefix: str = "") -> dict[str, Any]:
    """Every option by its TOML key (tables as dotted keys, `kubernetes.enabled`), with its default."""
    obj = config.Config() if obj is None else obj
    out: dict[str, Any] = {}
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if dataclasses.is_dataclass(value):
            out.update(config_fields(value, f"{prefix}{field.name}."))
        else:
            out[toml_key(prefix + field.name)] = value
    return out


def toml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def serve_flags() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = sub.choices["serve"]
    return {opt for action in serve._actions for opt in action.option_strings if opt.startswith("--")}


def test_every_option_is_documented_and_nothing_else() -> None:
    rows, fields = doc_rows(), config_fields()
    missing = sorted(set(fields) - set(rows))
    assert not missing, f"add these options to docs/configuration.md's Options table: {missing}"
    stale = sorted(set(rows) - set(fields))
    assert not stale, f"docs/configuration.md documents options the code no longer has: {stale}"


def test_documented_defaults_are_the_code_defaults() -> None:
    rows = doc_rows()
    for key, default in config_fields().items():
        cell = rows[key][1]
        assert f"`{toml_literal(default)}`" in cell, (
            f"{key}: default is {toml_literal(default)}, doc says {cell}"
        )


def test_documented_reload_column_matches_the_code() -> None:
    reloadable = getattr(config, "RELOADABLE", None)
    rows = doc_rows()
    for key in config_fields():
        said = rows[key][2]
        assert said in ("reload", "restart"), f"{key}: SIGHUP column must be reload or restart, not {said}"
        if reloadable is not None:
            field = key.replace(".", "_")
            want = "reload" if key in reloadable or field in reloadable else "restart"
            assert said == want, f"{key}: the code says {want} on SIGHUP, the doc says {said}"


def test_documented_flags_exist_and_every_flag_is_documented() -> None:
    rows, flags = doc_rows(), serve_flags()
    documented = set()
    for key, (flag_cell, *_rest) in rows.items():
        for flag in re.findall(r"`(--[a-z-]+)`", flag_cell):
            assert flag in flags, f"{key}: `cri-proxy serve` has no {flag}"
            documented.add(flag)
    text = DOC.read_text()
    for flag in sorted(flags - documented - {"--help"}):
        assert f"`{flag}" in text, f"`cri-proxy serve {flag}` is not in docs/configuration.md"


def test_kubelet_settings_are_documented() -> None:
    text = DOC.read_text()
    for needle in (
        "containerRuntimeEndpoint",
        "imageServiceEndpoint",
        "--container-runtime-endpoint",
        "--image-service-endpoint",
        config.DEFAULT_LISTEN,
    ):
        assert needle in text
