"""Reading a small file that an operator or another program names: the proxy's config, the
kubelet's CPU manager state, the proxy's own checkpoint, the kubeconfig, a sysfs tree.

A plain `open().read()` waits forever on a FIFO that no one writes (the proxy would hang at start,
before its first log line), reads /dev/zero until memory runs out, and fails with a traceback on
bytes that are not UTF-8. Here the file is opened non-blocking and checked with fstat on the open
descriptor (no swap between a check and the open) before a byte is read, and at most `limit` + 1
bytes are read. Nothing here imports the rest of the package, so every layer may use it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

__all__ = ["kind", "read_small", "text_of"]


def kind(mode: int) -> str:
    """What a file of this `st_mode` is, for a message: "a FIFO", "a directory", ..."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_small(path: Path | str, limit: int, *, devices: bool = False) -> bytes:
    """The bytes of `path` when it is a regular file (with `devices`, also a character device such
    as /dev/null) of at most `limit` bytes. Raises OSError as the system gives it (missing, no
    permission) and ValueError naming what the file is instead (a FIFO, a directory, too big)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:  # a socket cannot be opened at all (ENXIO): say what it is
        if exc.errno == errno.ENXIO and stat.S_ISSOCK(os.stat(path).st_mode):
            raise ValueError(f"{path} is a socket, not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) or (devices and stat.S_ISCHR(st.st_mode))):
            raise ValueError(f"{path} is {kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise ValueError(f"{path} is {st.st_size} bytes, more than the {limit} read")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # it grew after the fstat, or a device that does not end
            raise ValueError(f"{path} is more than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def text_of(data: bytes, path: Path | str) -> str:
    """`data` as UTF-8; ValueError naming the file and the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text (byte {exc.start}: {data[exc.start]:#04x})") from None
