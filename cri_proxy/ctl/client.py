"""What needs no runtime: `config` (crictl's client config file) and `completion` (shell scripts).

`config` reads and writes the same YAML file crictl does (--config, $CRI_CONFIG_FILE, else
/etc/crictl.yaml), with crictl's keys, in crictl's order, so the two tools share one file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from cri_proxy.ctl.errors import CtlError
from cri_proxy.ctl.options import DEFAULT_CRICTL_CONFIG, ENV_CONFIG, read_crictl_config

# crictl's keys, in the order it writes them, with the type of each
KEYS: dict[str, type] = {
    "runtime-endpoint": str,
    "image-endpoint": str,
    "timeout": int,
    "debug": bool,
    "pull-image-on-create": bool,
    "disable-pull-on-run": bool,
}
CLEAR_SCREEN = "\033[2J\033[H"  # crictl clears the terminal before `config --list`


def _path(args: argparse.Namespace) -> Path:
    given = args.config or os.environ.get(ENV_CONFIG)
    return Path(given) if given else DEFAULT_CRICTL_CONFIG


def _value(values: dict[str, Any], key: str) -> Any:
    """The key's value, or its type's zero value, as crictl shows an unset key."""
    return values.get(key, KEYS[key]())


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _parse(key: str, text: str) -> Any:
    kind = KEYS.get(key)
    if kind is None:
        raise CtlError(f"no configuration option named {key}")
    if kind is bool:
        if text.lower() not in ("1", "t", "true", "0", "f", "false"):
            raise CtlError(f"set {key!r} to {text!r}: parse {key} value {text!r}: not true or false")
        return text.lower() in ("1", "t", "true")
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise CtlError(f"parse {key} value {text!r}: not a whole number") from None
    return text


def _write(path: Path, values: dict[str, Any]) -> None:
    lines = []
    for key, kind in KEYS.items():
        value = values.get(key)
        if kind is str:
            lines.append(f"{key}: {json.dumps(value or '')}")
        elif kind is int:
            lines.append(f"{key}: {int(value or 0)}")
        else:
            lines.append(f"{key}: {_text(bool(value))}")
    try:
        path.write_text("\n".join(lines) + "\n")
    except OSError as exc:
        raise CtlError(f"writing config file {path}: {exc.strerror}") from None


def config(args: argparse.Namespace) -> int:
    path = _path(args)
    values = dict(read_crictl_config(path, explicit=False))  # --set creates it
    if args.get:
        if args.get not in KEYS:
            raise CtlError(f"no configuration option named {args.get}")
        print(_text(_value(values, args.get)))
        return 0
    if args.set:
        for item in ",".join(args.set).split(","):
            key, equals, value = item.partition("=")
            if not equals:
                raise CtlError(f"incorrectly specified option: {item}")
            values[key] = _parse(key, value)
        _write(path, values)
        return 0
    if args.list:
        from cri_proxy.ctl.output import table

        rows = [["KEY", "VALUE"]]
        rows += [[key, _text(_value(values, key))] for key in KEYS]
        print(CLEAR_SCREEN + table(rows))
        return 0
    if not args.words:
        args.ctl_parser.print_help()
        return 0
    key, value = args.words[0], " ".join(args.words[1:2])
    values[key] = _parse(key, value)
    _write(path, values)
    return 0


def _commands(args: argparse.Namespace) -> dict[str, list[str]]:
    """Every ctl command with its flags, from the parser itself (`ctl_build`: the CLI's builder)."""
    parser = args.ctl_build()
    found: dict[str, list[str]] = {"": [o for a in parser._actions for o in a.option_strings]}
    for name, sub in parser.commands.choices.items():
        found[name] = [o for a in sub._actions for o in a.option_strings]
    return found


def completion(args: argparse.Namespace) -> int:
    """A completion script for bash, zsh or fish: ctl's commands, then each command's flags."""
    commands = _commands(args)
    names = " ".join(n for n in commands if n)
    if args.shell == "bash" or args.shell == "zsh":
        cases = "\n".join(f'        {n}) flags="{" ".join(f)}" ;;' for n, f in commands.items() if n)
        script = f"""# cri-proxy ctl completion ({args.shell})
_cri_proxy() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" cmd="" i flags=""
    if [[ $COMP_CWORD -eq 1 ]]; then
        COMPREPLY=($(compgen -W "serve fake-runtime plan ctl" -- "$cur")); return
    fi
    [[ "${{COMP_WORDS[1]}}" == ctl ]] || return
    for ((i = 2; i < COMP_CWORD; i++)); do
        [[ "${{COMP_WORDS[i]}}" != -* ]] && {{ cmd="${{COMP_WORDS[i]}}"; break; }}
    done
    if [[ -z "$cmd" ]]; then
        COMPREPLY=($(compgen -W "{names} {" ".join(commands[""])}" -- "$cur")); return
    fi
    case "$cmd" in
{cases}
    esac
    COMPREPLY=($(compgen -W "$flags" -- "$cur"))
}}
"""
        if args.shell == "zsh":
            script += "autoload -U +X bashcompinit && bashcompinit\n"
        script += "complete -F _cri_proxy cri-proxy\n"
    elif args.shell == "fish":
        lines = ["# cri-proxy ctl completion (fish)", "complete -c cri-proxy -f"]
        lines.append("complete -c cri-proxy -n '__fish_use_subcommand' -a 'serve fake-runtime plan ctl'")
        lines.append(
            f"complete -c cri-proxy -n '__fish_seen_subcommand_from ctl; and not __fish_seen_subcommand_from "
            f"{names}' -a '{names}'"
        )
        for name, flags in commands.items():
            for flag in flags:
                if name and flag.startswith("--"):
                    lines.append(
                        f"complete -c cri-proxy -n '__fish_seen_subcommand_from {name}' -l {flag[2:]}"
                    )
        script = "\n".join(lines) + "\n"
    else:
        raise CtlError(f"only bash, zsh or fish are supported, not {args.shell!r}")
    sys.stdout.write(script)
    return 0
