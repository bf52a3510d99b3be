#!/usr/bin/env python3
"""Run a command next to a private containerd (root), then stop it and remove what it made.

The command gets `CONTAINERD_SOCK` (the socket's path), `CONTAINERD_PID` and `CONTAINERD_IMAGE` (the
one local busybox image, also the sandbox image) in its environment; its exit status is this
script's. The containerd is the test bed's (`tests/e2e/containerd.py`): every path under one temp
directory, its CNI directories in `$(dirname $CONTAINERD_SOCK)/cni/{bin,conf}`, empty.
With `--registry` first, containerd pulls from a local registry (`tests/e2e/registry.py`) that serves
busybox stand-ins under the names critest pulls (`REGISTRY` in the environment: its address).

    .venv/bin/python bench/with_containerd.py bench/conformance-critest.sh
    .venv/bin/python bench/with_containerd.py --registry bench/conformance-critest.sh
    .venv/bin/python bench/with_containerd.py .venv/bin/python bench/hostile.py
"""

from __future__ import annotations

import os
import subprocess
import sys

from common import ROOT


def main() -> int:
    command = sys.argv[1:]
    with_registry = bool(command) and command[0] == "--registry"
    if with_registry:
        command = command[1:]
    if not command or command[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    sys.path.insert(0, str(ROOT / "tests" / "e2e"))
    from containerd import PrivateContainerd, missing_tools, run_setup_script

    if missing_tools():
        run_setup_script()
    registry = None
    if with_registry:
        from registry import Registry, critest_images

        registry = Registry(critest_images()).start()
    containerd = PrivateContainerd(registry_hosts=registry.hosts_dir if registry else None).start()
    try:
        env = dict(
            os.environ,
            CONTAINERD_SOCK=str(containerd.socket_path),
            CONTAINERD_PID=str(containerd.pid or ""),
            CONTAINERD_IMAGE=containerd.image,
        )
        if registry is not None:
            env["REGISTRY"] = registry.address
        return subprocess.call(command, env=env)
    finally:
        containerd.stop()
        if registry is not None:
            registry.stop()
            print(f"registry: {len(registry.pulls)} requests", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
