#!/usr/bin/env bash
# Install cri-proxy on a node from this checkout, or remove it again.
#
#   sudo scripts/install.sh              install or upgrade; starts nothing
#   sudo scripts/install.sh --enable     ... and enable + start cri-proxy.service
#   sudo scripts/install.sh --uninstall  remove what was installed; keeps /etc/cri-proxy/config.toml
#   scripts/install.sh --prefix DIR      everything under DIR (a scratch root; DESTDIR=DIR works too)
#
# What goes where (under the scratch root with --prefix/DESTDIR):
#   /opt/cri-proxy/                           a Python venv with cri-proxy in it (not editable)
#   /usr/local/bin/cri-proxy                  symlink to /opt/cri-proxy/bin/cri-proxy
#   /etc/systemd/system/cri-proxy.service     the unit (customise with `systemctl edit cri-proxy`)
#   /etc/cri-proxy/config.toml                default config, every key commented; never overwritten
#   /usr/share/doc/cri-proxy/                 kubelet drop-in example, config reference, config example, RBAC example
# It never touches the kubelet's configuration: pointing the kubelet at the proxy is the operator's
# step (README, "Install on a node"). Running it again is safe: it brings everything up to date.
set -euo pipefail

SELF=install.sh
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

say() { printf '%s: %s\n' "$SELF" "$*"; }
warn() { printf '%s: WARNING: %s\n' "$SELF" "$*" >&2; }
die() { printf '%s: error: %s\n' "$SELF" "$*" >&2; exit 1; }

usage() {
  cat <<EOF
usage: scripts/install.sh [--enable] [--prefix DIR] [--python PYTHON] [--runtime-unit UNIT] [--force]
       scripts/install.sh --uninstall [--prefix DIR] [--force]

  --enable        after installing, enable and (re)start cri-proxy.service (systemd only)
  --uninstall     stop and disable the service, remove what install.sh installed;
                  /etc/cri-proxy/config.toml and /var/lib/cri-proxy (state) are kept
  --prefix DIR    install under DIR instead of / (DESTDIR=DIR does the same); no systemctl calls
  --python PY     the Python (>= 3.11) to build the venv from (default: the system's newest)
  --runtime-unit UNIT
                  the runtime's systemd unit the proxy Requires= and starts After= (default
                  containerd.service, or what the installed unit has; CRI-O: crio.service)
  --force         reinstall even when up to date; replace a foreign /usr/local/bin/cri-proxy;
                  uninstall even though the kubelet still points at the proxy
EOF
}

ACTION=install ENABLE=0 FORCE=0 PYTHON_ARG="" RUNTIME_UNIT="" ROOT=${DESTDIR:-}
while [ $# -gt 0 ]; do
  case $1 in
    --enable) ENABLE=1 ;;
    --uninstall) ACTION=uninstall ;;
    --force) FORCE=1 ;;
    --prefix) [ $# -ge 2 ] || die "--prefix needs a directory"; ROOT=$2; shift ;;
    --prefix=*) ROOT=${1#--prefix=} ;;
    --python) [ $# -ge 2 ] || die "--python needs an interpreter"; PYTHON_ARG=$2; shift ;;
    --python=*) PYTHON_ARG=${1#--python=} ;;
    --runtime-unit) [ $# -ge 2 ] || die "--runtime-unit needs a unit name"; RUNTIME_UNIT=$2; shift ;;
    --runtime-unit=*) RUNTIME_UNIT=${1#--runtime-unit=} ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
  shift
done

# ROOT is "" for a real install, else an absolute scratch root without a trailing slash.
if [ -n "$ROOT" ]; then
  mkdir -p "$ROOT"
  ROOT=$(cd "$ROOT" && pwd)
  [ "$ROOT" = / ] && ROOT=""
fi

VENV=$ROOT/opt/cri-proxy
LAUNCHER=$ROOT/usr/local/bin/cri-proxy
UNIT=$ROOT/etc/systemd/system/cri-proxy.service
CONF_DIR=$ROOT/etc/cri-proxy
CONF=$CONF_DIR/config.toml
DOC=$ROOT/usr/share/doc/cri-proxy
KUBELET_DROPIN_DIR=$ROOT/etc/systemd/system/kubelet.service.d
STAMP=$VENV/.cri-proxy-source

# systemctl only for a real install on a machine that runs systemd as PID 1.
systemd_running() {
  [ -z "$ROOT" ] && [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ] && command -v systemctl >/dev/null
}

need_root() {
  if [ -z "$ROOT" ] && [ "$(id -u)" != 0 ]; then
    die "installing into / needs root: run it with sudo, or use --prefix DIR for a scratch root"
  fi
}

# ---------------------------------------------------------------------------------------------
# Python: as scripts/setup-venv, but the system's interpreters first, since the service must be
# able to run it (ProtectHome= hides /root and /home, where pyenv and friends keep theirs).

py_ok() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }

pick_python() {
  local py
  for py in /usr/bin/python3.13 /usr/bin/python3.12 /usr/bin/python3.11 /usr/bin/python3 \
            /usr/local/bin/python3.13 /usr/local/bin/python3.12 /usr/local/bin/python3.11 \
            python3.13 python3.12 python3.11 python3; do
    if command -v "$py" >/dev/null 2>&1 && py_ok "$py"; then
      command -v "$py"; return 0
    fi
  done
  return 1
}

find_python() {
  if [ -n "$PYTHON_ARG" ]; then
    command -v "$PYTHON_ARG" >/dev/null 2>&1 || die "--python $PYTHON_ARG: not found"
    py_ok "$PYTHON_ARG" || die "--python $PYTHON_ARG: need Python >= 3.11 ($("$PYTHON_ARG" --version 2>&1))"
    command -v "$PYTHON_ARG"; return 0
  fi
  if pick_python; then return 0; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "no Python >= 3.11 found; installing Debian's python3 and python3-venv" >&2
    apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 python3-venv >/dev/null
    pick_python && return 0
  fi
  die "need Python >= 3.11 (python3 is $(python3 --version 2>&1 || echo missing)); pass one with --python"
}

make_venv() {
  local py=$1 ver
  if "$py" -m venv "$VENV" 2>/dev/null; then return 0; fi
  rm -rf "$VENV"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    ver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    say "'$py -m venv' failed; installing Debian's python${ver}-venv"
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "python${ver}-venv" >/dev/null
    "$py" -m venv "$VENV" && return 0
  fi
  die "'$py -m venv $VENV' failed; install the python3-venv package"
}

# ---------------------------------------------------------------------------------------------
# The default config: every key of cri_proxy.config.Config, commented out, with its default and
# the one-line description from docs/configuration.md's table. Written by the installed code, so
# it always lists exactly the keys this version accepts.

write_default_config() {
  local out=$1
  "$VENV/bin/python" - "$SRC/docs/configuration.md" >"$out" <<'PY'
import dataclasses
import json
import re
import sys
import textwrap

from cri_proxy import config

descriptions: dict[str, str] = {}
try:
    for line in open(sys.argv[1], encoding="utf-8"):
        m = re.match(r"\|\s*`([a-z_.]+)`\s*\|", line)
        if m:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            descriptions.setdefault(m.group(1), cells[-1])
except OSError:
    pass


def toml_value(value: object) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple) and all(isinstance(v, str | int | float) for v in value):
        return "[" + ", ".join(toml_value(v) or "" for v in value) + "]"
    return None


def emit_key(key: str, name: str, value: object) -> None:
    """`key`: the description's name (`kubernetes.enabled`); `name`: as written in its table."""
    text = toml_value(value)
    desc = re.sub(r"[`*]", "", descriptions.get(key, ""))
    print()
    for line in textwrap.wrap(desc, 96):
        print(f"# {line}")
    if text is None:
        print(f"# {name}: see the reference (default {value!r})")
        return
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1024 * 1024:
        text += f"  # {value / (1024 * 1024):g} MiB"
    print(f"#{name} = {text}")


def emit(obj: object, prefix: str = "") -> None:
    """Top-level keys first, then each TOML table: `config.TABLES` (field-name prefixes) and
    nested dataclasses."""
    table_prefixes = getattr(config, "TABLES", {})
    tables: dict[str, list[tuple[str, object]]] = {}
    for field in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, field.name)
        if dataclasses.is_dataclass(value):
            tables.setdefault(prefix + field.name, []).extend(
                (f.name, getattr(value, f.name)) for f in dataclasses.fields(value)
            )
            continue
        table = next((t for t, p in table_prefixes.items() if not prefix and field.name.startswith(p)), None)
        if table is not None:
            tables.setdefault(table, []).append((field.name.removeprefix(table_prefixes[table]), value))
            continue
        emit_key(prefix + field.name, field.name, value)
    for table, items in tables.items():
        print()
        print(f"#[{table}]")
        for name, value in items:
            emit_key(f"{table}.{name}", name, value)


print("""\
# cri-proxy configuration, read by `cri-proxy serve --config /etc/cri-proxy/config.toml`.
#
# Every key is listed, commented out, with its default: uncomment a line to change it.
# Command-line flags override this file. An unknown key or a wrong value stops the proxy from
# starting, naming the key (see `journalctl -u cri-proxy`).
#""")
reloadable = sorted(getattr(config, "RELOADABLE", ()))
if reloadable:
    text = (
        "`systemctl reload cri-proxy` applies " + ", ".join(reloadable) + " without a restart;"
        " every other key needs `systemctl restart cri-proxy`."
    )
    for line in textwrap.wrap(text, 96):
        print(f"# {line}")
print("# Reference: /usr/share/doc/cri-proxy/configuration.md")
emit(config.Config())
PY
}

# ---------------------------------------------------------------------------------------------

install_file() {  # install_file SRC DEST MODE: copy when different; say what happened
  local from=$1 to=$2 mode=$3
  if [ -f "$to" ] && cmp -s "$from" "$to"; then
    say "unchanged   $to"
  else
    local what=installed
    [ -e "$to" ] && what=updated
    install -D -m "$mode" "$from" "$to"
    say "$(printf '%-11s' "$what") $to"
  fi
}

do_install() {
  need_root
  if [ ! -f "$SRC/pyproject.toml" ] || [ ! -f "$SRC/systemd/cri-proxy.service" ]; then
    die "$SRC does not look like a cri-proxy checkout (no pyproject.toml or systemd/cri-proxy.service)"
  fi
  if [ "$ENABLE" = 1 ] && ! systemd_running; then
    if [ -n "$ROOT" ]; then
      warn "--enable ignored: installing under a scratch root ($ROOT)"
    else
      warn "--enable ignored: systemd is not running as PID 1 here"
    fi
    ENABLE=0
  fi
  # The runtime's unit for Requires=/After=: given, else the installed unit's, else containerd's.
  if [ -z "$RUNTIME_UNIT" ] && [ -f "$UNIT" ]; then
    RUNTIME_UNIT=$(sed -n 's/^Requires=\([^ ]*\.service\)$/\1/p' "$UNIT" | head -n 1)
  fi
  RUNTIME_UNIT=${RUNTIME_UNIT:-containerd.service}
  case $RUNTIME_UNIT in
    *[!A-Za-z0-9@._:-]*) die "--runtime-unit $RUNTIME_UNIT: expected a unit name such as crio.service" ;;
    ?*.service) ;;
    *) die "--runtime-unit $RUNTIME_UNIT: expected a unit name such as crio.service" ;;
  esac
  say "installing cri-proxy from $SRC${ROOT:+ under $ROOT}"

  # 1. The venv.
  if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ]; then
    die "$VENV exists and is not a venv; move it away first"
  fi
  if [ -x "$VENV/bin/python" ] && py_ok "$VENV/bin/python"; then
    say "venv        $VENV ($("$VENV/bin/python" --version 2>&1), kept)"
  else
    local py
    py=$(find_python)
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    make_venv "$py"
    say "venv        $VENV (created from $py, $("$py" --version 2>&1))"
  fi
  local real_py
  real_py=$(readlink -f "$VENV/bin/python")
  case $real_py in
    /root/* | /home/* | /run/user/*)
      warn "the venv's Python is $real_py: the unit's ProtectHome=yes hides it from the service." \
        "Re-run with --python /usr/bin/python3.X, or add ProtectHome=read-only with 'systemctl edit cri-proxy'." ;;
  esac

  # 2. cri-proxy into it: from a clean copy of what the package is built from (no build/ or
  #    egg-info left in the checkout, no editable install), skipped when that exact source is
  #    already installed.
  local tmp
  tmp=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  local parts=() part
  for part in pyproject.toml setup.cfg setup.py MANIFEST.in README.md LICENSE cri_proxy cri_api; do
    if [ -e "$SRC/$part" ]; then parts+=("$part"); fi
  done
  mkdir "$tmp/src"
  tar -C "$SRC" --exclude=__pycache__ --exclude='*.pyc' -cf - "${parts[@]}" | tar -C "$tmp/src" -xf -
  local fingerprint
  fingerprint=$(cd "$tmp/src" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
  local changed=1
  if [ "$FORCE" = 0 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$fingerprint" ] \
    && "$VENV/bin/cri-proxy" --version >/dev/null 2>&1; then
    changed=0
    say "package     $("$VENV/bin/cri-proxy" --version) (up to date)"
  else
    say "package     pip install (this takes a little while)"
    "$VENV/bin/python" -m pip install --quiet --no-input --disable-pip-version-check "$tmp/src" \
      || die "pip install failed (see above)"
    echo "$fingerprint" >"$STAMP"
    say "package     $("$VENV/bin/cri-proxy" --version) installed in $VENV"
  fi

  # 3. The launcher on the PATH.
  local target=$VENV/bin/cri-proxy
  if [ -L "$LAUNCHER" ] && [ "$(readlink "$LAUNCHER")" = "$target" ]; then
    say "unchanged   $LAUNCHER -> $target"
  else
    if [ -e "$LAUNCHER" ] && [ ! -L "$LAUNCHER" ] && [ "$FORCE" = 0 ]; then
      die "$LAUNCHER exists and is not our symlink; move it away or pass --force"
    fi
    mkdir -p "$(dirname "$LAUNCHER")"
    ln -sfn "$target" "$LAUNCHER"
    say "installed   $LAUNCHER -> $target"
  fi

  # 4. The unit (with the runtime's unit), the docs, the config.
  sed -e "s/^Requires=containerd\.service\$/Requires=$RUNTIME_UNIT/" \
      -e "s/^After=containerd\.service\$/After=$RUNTIME_UNIT/" \
      "$SRC/systemd/cri-proxy.service" >"$tmp/cri-proxy.service"
  local unit_changed=0
  if ! { [ -f "$UNIT" ] && cmp -s "$tmp/cri-proxy.service" "$UNIT"; }; then unit_changed=1; fi
  install_file "$tmp/cri-proxy.service" "$UNIT" 0644
  [ "$RUNTIME_UNIT" = containerd.service ] || say "runtime     the unit requires $RUNTIME_UNIT"
  install_file "$SRC/systemd/kubelet.service.d/10-cri-proxy.conf" "$DOC/10-cri-proxy.conf" 0644
  install_file "$SRC/docs/configuration.md" "$DOC/configuration.md" 0644
  install_file "$SRC/systemd/rbac.yaml" "$DOC/rbac.yaml" 0644
  write_default_config "$tmp/config.toml"
  install_file "$tmp/config.toml" "$DOC/config.toml.example" 0644
  if [ -e "$CONF" ]; then
    say "kept        $CONF (yours; the current defaults are in $DOC/config.toml.example)"
  else
    install -d -m 0755 "$CONF_DIR"
    install -m 0644 "$tmp/config.toml" "$CONF"
    say "installed   $CONF (defaults, all commented out)"
  fi

  # 5. systemd: reload definitions; start only when asked.
  if systemd_running; then
    systemctl daemon-reload
    say "systemctl daemon-reload"
    if [ "$ENABLE" = 1 ]; then
      if systemctl is-active --quiet cri-proxy.service; then
        systemctl enable cri-proxy.service
        if [ "$changed" = 1 ] || [ "$unit_changed" = 1 ]; then
          systemctl restart cri-proxy.service
          say "restarted cri-proxy.service (new version or unit)"
        fi
      else
        systemctl enable --now cri-proxy.service
        say "enabled and started cri-proxy.service"
      fi
    elif systemctl is-active --quiet cri-proxy.service && { [ "$changed" = 1 ] || [ "$unit_changed" = 1 ]; }; then
      say "cri-proxy.service is running the old version: 'systemctl restart cri-proxy' to switch"
    fi
  elif [ -z "$ROOT" ]; then
    say "systemd is not PID 1 here: no daemon-reload; run '$LAUNCHER serve' yourself"
  fi

  say "done."
  if [ "$ENABLE" = 0 ] && [ -z "$ROOT" ]; then
    cat <<EOF

Next steps:
  1. review /etc/cri-proxy/config.toml (reference: $DOC/configuration.md)
  2. sudo systemctl enable --now cri-proxy          (or re-run with --enable)
  3. point the kubelet at unix:///run/cri-proxy/cri-proxy.sock:
       sudo install -D -m 0644 $DOC/10-cri-proxy.conf /etc/systemd/system/kubelet.service.d/10-cri-proxy.conf
       sudo systemctl daemon-reload && sudo systemctl restart kubelet
  4. check: sudo cri-proxy ctl cpusets; journalctl -u cri-proxy
EOF
  fi
}

do_uninstall() {
  need_root
  say "uninstalling cri-proxy${ROOT:+ under $ROOT}"
  # Refuse while the kubelet is still pointed at the proxy: removing it would cut the kubelet off
  # from its runtime.
  local pointing=""
  if [ -d "$KUBELET_DROPIN_DIR" ]; then
    pointing=$(grep -l 'cri-proxy.sock' "$KUBELET_DROPIN_DIR"/*.conf 2>/dev/null || true)
  fi
  if [ -z "$pointing" ] && [ -f "$ROOT/var/lib/kubelet/config.yaml" ] \
    && grep -q 'cri-proxy.sock' "$ROOT/var/lib/kubelet/config.yaml"; then
    pointing=$ROOT/var/lib/kubelet/config.yaml
  fi
  if [ -n "$pointing" ]; then
    if [ "$FORCE" = 0 ]; then
      die "the kubelet still uses the proxy ($(echo "$pointing" | paste -sd ' ' -)): point it back at the runtime and restart it first, or pass --force"
    fi
    warn "the kubelet still uses the proxy ($(echo "$pointing" | paste -sd ' ' -)); removing anyway (--force)"
  fi

  if systemd_running && systemctl cat cri-proxy.service >/dev/null 2>&1; then
    systemctl disable --now cri-proxy.service || warn "could not stop/disable cri-proxy.service"
    say "stopped and disabled cri-proxy.service"
  fi

  local removed=0
  if [ -L "$LAUNCHER" ] && [ "$(readlink "$LAUNCHER")" = "$VENV/bin/cri-proxy" ]; then
    rm -f "$LAUNCHER"; say "removed     $LAUNCHER"; removed=1
  elif [ -e "$LAUNCHER" ] || [ -L "$LAUNCHER" ]; then
    warn "left $LAUNCHER: it is not the symlink install.sh made"
  fi
  if [ -f "$UNIT" ]; then
    if grep -q 'cri-proxy serve' "$UNIT"; then
      rm -f "$UNIT"; say "removed     $UNIT"; removed=1
    else
      warn "left $UNIT: it does not look like ours"
    fi
  fi
  if [ -d "$DOC" ]; then rm -rf "$DOC"; say "removed     $DOC"; removed=1; fi
  if [ -d "$VENV" ]; then
    if [ -f "$VENV/pyvenv.cfg" ]; then
      rm -rf "$VENV"; say "removed     $VENV"; removed=1
    else
      warn "left $VENV: it is not a venv"
    fi
  fi
  if systemd_running; then
    systemctl daemon-reload
    systemctl reset-failed cri-proxy.service 2>/dev/null || true
  fi
  [ "$removed" = 1 ] || say "nothing to remove"
  [ -e "$CONF" ] && say "kept        $CONF (delete it yourself if you no longer need it)"
  [ -d "$ROOT/var/lib/cri-proxy" ] && say "kept        $ROOT/var/lib/cri-proxy (state; delete it yourself)"
  say "done."
}

case $ACTION in
  install) do_install ;;
  uninstall) do_uninstall ;;
esac
