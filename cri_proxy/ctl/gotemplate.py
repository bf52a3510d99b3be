"""`-o go-template --template T`: a subset of Go's text/template over the JSON document that
`-o json` prints, as crictl executes it (missing keys are errors).

The subset (docs in README's ctl section): text and `{{ }}` actions with `{{-`/`-}}` trimming and
`{{/* comments */}}`; `.`, `.a.b`, `$`, `$x.a`; string, number, `true`/`false`/`nil` literals;
pipelines with `|` and `( )`; `{{$x := ...}}` and `{{$x = ...}}`; `if`/`else if`/`else`,
`range` (with `$i, $e :=`, `else`), `with`; the functions `json`, `upper`, `lower`, `title`
(crictl's own), and `len`, `index`, `printf` (%s %d %v %q %f), `print`, `println`, `eq`, `ne`,
`lt`, `le`, `gt`, `ge`, `and`, `or`, `not`. Values print as Go prints them: `map[k:v]`, `[a b]`,
`<no value>` for nil.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cri_proxy.ctl.errors import CtlError

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_TOKEN = re.compile(
    r"""\s*(?:
    (?P<str>"(?:[^"\\]|\\.)*"|`[^`]*`)
    |(?P<num>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
    |(?P<decl>:=)
    |(?P<assign>=)
    |(?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)
    |(?P<field>(?:\.[A-Za-z0-9_]+)+|\.)
    |(?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<punct>[()|,])
    )""",
    re.X,
)


class TemplateError(CtlError):
    """A template that does not parse, or data it cannot be executed on."""


@dataclass
class Node:
    kind: str  # text | action | if | range | with
    text: str = ""
    pipe: list[Any] = field(default_factory=list)
    decl: list[str] = field(default_factory=list)
    assign: bool = False
    body: list[Node] = field(default_factory=list)
    orelse: list[Node] = field(default_factory=list)


def _tokens(source: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    source = source.strip()
    while pos < len(source):
        m = _TOKEN.match(source, pos)
        if not m or m.end() == pos:
            raise TemplateError(f"template: unexpected {source[pos:]!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
        while pos < len(source) and source[pos].isspace():
            pos += 1
    return out


def _pipeline(tokens: list[tuple[str, str]]) -> tuple[list[str], bool, list[Any]]:
    """(declared variables, whether `=` not `:=`, commands); a command is a list of operands."""
    decl: list[str] = []
    assign = False
    for i, (kind, _) in enumerate(tokens):
        if kind in ("decl", "assign"):
            decl = [value for k, value in tokens[:i] if k == "var"]
            assign = kind == "assign"
            tokens = tokens[i + 1 :]
            break
    commands: list[Any] = [[]]
    depth_stack: list[list[Any]] = []
    current = commands
    for kind, value in tokens:
        if kind == "punct" and value == "|":
            current.append([])
        elif kind == "punct" and value == "(":
            depth_stack.append(current)
            current = [[]]
        elif kind == "punct" and value == ")":
            if not depth_stack:
                raise TemplateError("template: unexpected )")
            inner = current
            current = depth_stack.pop()
            current[-1].append(("pipe", inner))
        elif kind == "punct":
            continue
        else:
            current[-1].append((kind, value))
    if depth_stack:
        raise TemplateError("template: unclosed (")
    if any(not c for c in commands):
        raise TemplateError("template: missing value for command")
    return decl, assign, commands


def parse(template: str) -> list[Node]:
    """The template as a tree of nodes; a TemplateError names what does not parse."""
    root: list[Node] = []
    stack: list[tuple[Node, list[Node]]] = []
    body = root
    pieces: list[tuple[str, str]] = []
    pos, trim_next = 0, False
    for m in _ACTION.finditer(template):
        text = template[pos : m.start()]
        text = text.lstrip() if trim_next else text
        text = text.rstrip() if m.group(1) else text
        if text:
            pieces.append(("text", text))
        pieces.append(("action", m.group(2)))
        trim_next, pos = bool(m.group(3)), m.end()
    rest = template[pos:].lstrip() if trim_next else template[pos:]
    if "{{" in rest:
        raise TemplateError("template: unclosed action")
    if rest:
        pieces.append(("text", rest))
    for kind, content in pieces:
        if kind == "text":
            body.append(Node("text", text=content))
            continue
        content = content.strip()
        if content.startswith("/*"):
            continue
        word = content.split(None, 1)[0] if content else ""
        rest_words = content[len(word) :]
        if word in ("if", "range", "with"):
            decl, assign, pipe = _pipeline(_tokens(rest_words))
            node = Node(word, pipe=pipe, decl=decl, assign=assign)
            body.append(node)
            stack.append((node, body))
            body = node.body
        elif word == "else":
            if not stack:
                raise TemplateError("template: unexpected {{else}}")
            node, outer = stack[-1]
            if rest_words.strip().startswith("if "):
                nested = Node("if", pipe=_pipeline(_tokens(rest_words.strip()[3:]))[2])
                node.orelse.append(nested)
                stack[-1] = (nested, outer)  # the chain ends with the one {{end}}
                body = nested.body
            else:
                body = node.orelse
        elif word == "end":
            if not stack:
                raise TemplateError("template: unexpected {{end}}")
            _, body = stack.pop()
        else:
            decl, assign, pipe = _pipeline(_tokens(content))
            body.append(Node("action", pipe=pipe, decl=decl, assign=assign))
    if stack:
        raise TemplateError(f"template: unexpected EOF: {{{{{stack[-1][0].kind}}}}} without {{{{end}}}}")
    return root


def go_string(value: Any) -> str:
    """A value printed as Go's fmt prints the decoded JSON."""
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{_inner(value[k])}" for k in sorted(value)) + "]"
    if isinstance(value, list):
        return "[" + " ".join(_inner(v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return str(value)


def _inner(value: Any) -> str:
    return "<nil>" if value is None else go_string(value)


def truth(value: Any) -> bool:
    return value not in (None, False, 0, "", [], {})


def _printf(fmt: str, *args: Any) -> str:
    values = iter(args)

    def one(m: re.Match[str]) -> str:
        verb = m.group(0)
        if verb == "%%":
            return "%"
        value: Any = next(values, None)
        if verb[-1] == "v" or verb[-1] == "s":
            return go_string(value)
        if verb[-1] == "q":
            return json.dumps(go_string(value))
        if verb[-1] == "d":
            return str(int(value))
        return str(verb % float(value))

    return re.sub(r"%%|%[-+ 0#]*\d*(?:\.\d+)?[vsdqf]", one, fmt)


def _json(value: Any) -> str:
    """Go's json.Encoder: keys sorted, <, > and & escaped, a newline after."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026") + "\n"


def _index(value: Any, *keys: Any) -> Any:
    for key in keys:
        try:
            value = value[key if isinstance(value, dict) else int(key)]
        except (KeyError, IndexError, TypeError, ValueError):
            raise TemplateError(f"template: index of {go_string(value)} with {key!r}") from None
    return value


def _compare(op: Callable[[Any, Any], bool]) -> Callable[..., bool]:
    return lambda a, *b: all(op(a, x) for x in b)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "json": _json,
    "upper": lambda s: go_string(s).upper(),
    "lower": lambda s: go_string(s).lower(),
    "title": lambda s: re.sub(r"\b\w", lambda m: m.group(0).upper(), go_string(s)),
    "len": len,
    "index": _index,
    "printf": _printf,
    "print": lambda *a: "".join(go_string(x) for x in a),
    "println": lambda *a: " ".join(go_string(x) for x in a) + "\n",
    "eq": _compare(lambda a, b: a == b),
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "not": lambda a: not truth(a),
    "and": lambda *a: next((x for x in a if not truth(x)), a[-1]),
    "or": lambda *a: next((x for x in a if truth(x)), a[-1]),
}


class Executor:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.vars: list[dict[str, Any]] = [{"$": root}]

    def lookup(self, name: str) -> Any:
        for scope in reversed(self.vars):
            if name in scope:
                return scope[name]
        raise TemplateError(f"template: undefined variable {name!r}")

    def fields(self, value: Any, path: str) -> Any:
        for name in [p for p in path.split(".") if p]:
            if not isinstance(value, dict):
                raise TemplateError(f"template: can't evaluate field {name} in {type(value).__name__} value")
            if name not in value:
                raise TemplateError(f'template: map has no entry for key "{name}"')
            value = value[name]
        return value

    def operand(self, token: tuple[str, Any], dot: Any) -> Any:
        kind, value = token
        if kind == "field":
            return self.fields(dot, value)
        if kind == "var":
            name, _, path = value.partition(".")
            return self.fields(self.lookup(name), path)
        if kind == "str":
            return value[1:-1] if value.startswith("`") else json.loads(value)
        if kind == "num":
            return float(value) if any(c in value for c in ".eE") else int(value)
        if kind == "pipe":
            return self.pipeline(value, dot)
        if kind == "ident":
            if value in ("true", "false"):
                return value == "true"
            if value == "nil":
                return None
            return self.call(value, [], dot)
        raise TemplateError(f"template: unexpected {value!r}")

    def call(self, name: str, args: list[Any], dot: Any) -> Any:
        function = FUNCTIONS.get(name)
        if function is None:
            raise TemplateError(f'template: function "{name}" not defined')
        try:
            return function(*args)
        except TemplateError:
            raise
        except (TypeError, ValueError) as exc:
            raise TemplateError(f"template: error calling {name}: {exc}") from None

    def pipeline(self, commands: list[Any], dot: Any) -> Any:
        value: Any = None
        for i, command in enumerate(commands):
            first = command[0]
            if first[0] == "ident" and first[1] not in ("true", "false", "nil"):
                args = [self.operand(t, dot) for t in command[1:]] + ([value] if i else [])
                value = self.call(first[1], args, dot)
            elif len(command) == 1 and i == 0:
                value = self.operand(first, dot)
            else:
                raise TemplateError(f"template: can't give argument to non-function {first[1]}")
        return value

    def run(self, nodes: list[Node], dot: Any, out: list[str]) -> None:
        for node in nodes:
            if node.kind == "text":
                out.append(node.text)
                continue
            value = self.pipeline(node.pipe, dot)
            if node.kind == "action":
                if node.decl:
                    self.set(node.decl[0], value, node.assign)
                else:
                    out.append(go_string(value))
            elif node.kind == "if":
                self.scoped(node.body if truth(value) else node.orelse, dot, out)
            elif node.kind == "with":
                if truth(value):
                    self.scoped(node.body, value, out)
                else:
                    self.scoped(node.orelse, dot, out)
            elif node.kind == "range":
                self.range(node, value, dot, out)

    def range(self, node: Node, value: Any, dot: Any, out: list[str]) -> None:
        if isinstance(value, dict):
            items = [(k, value[k]) for k in sorted(value)]
        elif isinstance(value, list):
            items = list(enumerate(value))
        elif value is None:
            items = []
        else:
            raise TemplateError(f"template: range can't iterate over {go_string(value)}")
        if not items:
            self.scoped(node.orelse, dot, out)
            return
        for key, item in items:
            self.vars.append({})
            if len(node.decl) == 1:
                self.vars[-1][node.decl[0]] = item
            elif len(node.decl) == 2:
                self.vars[-1].update({node.decl[0]: key, node.decl[1]: item})
            self.run(node.body, item, out)
            self.vars.pop()

    def scoped(self, nodes: list[Node], dot: Any, out: list[str]) -> None:
        self.vars.append({})
        self.run(nodes, dot, out)
        self.vars.pop()

    def set(self, name: str, value: Any, assign: bool) -> None:
        if assign:
            for scope in reversed(self.vars):
                if name in scope:
                    scope[name] = value
                    return
            raise TemplateError(f"template: undefined variable {name!r}")
        self.vars[-1][name] = value


def render(template: str, data: Any) -> str:
    """Execute `template` on `data` (decoded JSON); a TemplateError says what went wrong."""
    nodes = parse(template)
    out: list[str] = []
    Executor(data).run(nodes, data, out)
    return "".join(out)
