"""`-o go-template`: the subset of Go's text/template ctl executes, on JSON documents as crictl
decodes them; expected strings are what Go's text/template prints for the same template and data."""

from __future__ import annotations

from typing import Any

import pytest

from cri_proxy.ctl.gotemplate import TemplateError, go_string, render

DOC: dict[str, Any] = {
    "status": {
        "id": "abc",
        "state": "CONTAINER_RUNNING",
        "labels": {"b": "2", "a": "1"},
        "ports": [80, 443],
        "empty": [],
        "flag": False,
        "nested": {"x": {"y": "deep"}},
        "html": "a<b>&c",
    },
    "info": {"pid": 42},
}


@pytest.mark.parametrize(
    ("template", "out"),
    [
        ("{{.status.id}}", "abc"),
        ("{{.status.nested.x.y}}", "deep"),
        ("id={{ .status.id }} pid={{.info.pid}}", "id=abc pid=42"),
        ("{{.status.labels}}", "map[a:1 b:2]"),
        ("{{.status.ports}}", "[80 443]"),
        ("{{.status.flag}}", "false"),
        ("{{range .status.ports}}<{{.}}>{{end}}", "<80><443>"),
        ("{{range $i, $p := .status.ports}}{{$i}}:{{$p}} {{end}}", "0:80 1:443 "),
        ("{{range $k, $v := .status.labels}}{{$k}}={{$v}};{{end}}", "a=1;b=2;"),
        ("{{range .status.empty}}x{{else}}none{{end}}", "none"),
        ('{{if eq .status.state "CONTAINER_RUNNING"}}up{{else}}down{{end}}', "up"),
        ("{{if .status.flag}}a{{else if .status.ports}}b{{else}}c{{end}}", "b"),
        ("{{if not .status.flag}}yes{{end}}", "yes"),
        ("{{with .status.nested.x}}{{.y}}{{end}}", "deep"),
        ("{{$s := .status}}{{$s.id}}/{{$.info.pid}}", "abc/42"),
        ('{{.status.id | upper}} {{lower "ABC"}} {{title "hello world"}}', "ABC abc Hello World"),
        ('{{len .status.ports}} {{index .status.labels "a"}} {{index .status.ports 1}}', "2 1 443"),
        ('{{printf "%s-%d-%v" .status.id .info.pid .status.flag}}', "abc-42-false"),
        ("{{json .status.labels}}", '{"a":"1","b":"2"}\n'),
        ("{{json .status.html}}", '"a\\u003cb\\u003e\\u0026c"\n'),
        ("a  {{- .status.id -}}  b", "aabcb"),
        ("{{/* a comment */}}x", "x"),
        ("{{and .status.id .info.pid}} {{or .status.flag .status.id}}", "42 abc"),
        ("{{(index .status.ports 0)}}", "80"),
    ],
)
def test_renders_as_go_does(template: str, out: str) -> None:
    assert render(template, DOC) == out


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{.status.nope}}", 'map has no entry for key "nope"'),
        ("{{.status.id.more}}", "can't evaluate field more"),
        ("{{if .status.id}}x", "without {{end}}"),
        ("{{end}}", "unexpected {{end}}"),
        ("{{nosuch .status}}", 'function "nosuch" not defined'),
        ("{{$undefined}}", "undefined variable"),
        ("{{.status.id", "unclosed action"),
    ],
)
def test_errors_name_what_is_wrong(template: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message.replace("(", r"\(").replace("{", r"\{")):
        render(template, DOC)


def test_go_value_printing() -> None:
    assert go_string(None) == "<no value>"
    assert go_string({"a": None, "b": [1, None]}) == "map[a:<nil> b:[1 <nil>]]"
    assert go_string(True) == "true" and go_string(2.0) == "2" and go_string(2.5) == "2.5"
