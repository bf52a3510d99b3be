"""Ids as people type them: a full id, or a prefix of exactly one (found by a List call).

An unknown id and an ambiguous prefix are errors that say so, naming the candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cri_proxy.ctl.conn import Conn
from cri_proxy.ctl.errors import CtlError
from cri_proxy.ctl.output import truncate


def _pick(kind: str, text: str, items: Sequence[Any], key: str = "id") -> Any:
    if not text:
        raise CtlError(f"{kind} ID cannot be empty")
    exact = [item for item in items if getattr(item, key) == text]
    if exact:
        return exact[0]
    matches = [item for item in items if getattr(item, key).startswith(text)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise CtlError(f"{kind} {text!r} not found: no {kind} id starts with it")
    names = ", ".join(sorted(truncate(getattr(m, key)) for m in matches))
    raise CtlError(f"{kind} id prefix {text!r} is ambiguous: it starts {len(matches)} ids ({names})")


def containers(conn: Conn) -> list[Any]:
    pb = conn.pb
    return list(
        conn.runtime("ListContainers", pb.ListContainersRequest(filter=pb.ContainerFilter())).containers
    )


def pods(conn: Conn) -> list[Any]:
    pb = conn.pb
    return list(conn.runtime("ListPodSandbox", pb.ListPodSandboxRequest(filter=pb.PodSandboxFilter())).items)


def container(conn: Conn, text: str) -> Any:
    """The listed `Container` whose id is `text` or starts with it."""
    return _pick("container", text, containers(conn))


def pod(conn: Conn, text: str) -> Any:
    """The listed `PodSandbox` whose id is `text` or starts with it."""
    return _pick("pod sandbox", text, pods(conn))


def image(conn: Conn, text: str, verbose: bool = False) -> tuple[str, Any]:
    """(the reference to use, the ImageStatusResponse): a name the runtime knows, or an id prefix."""
    pb = conn.pb
    if not text:
        raise CtlError("image ID cannot be empty")
    found = conn.image("ImageStatus", pb.ImageStatusRequest(image=pb.ImageSpec(image=text), verbose=verbose))
    if found.HasField("image"):
        return text, found
    listed = conn.image("ListImages", pb.ListImagesRequest()).images
    stripped = text.removeprefix("sha256:")
    matches = [i for i in listed if i.id.removeprefix("sha256:").startswith(stripped)]
    if len(matches) > 1:
        names = ", ".join(sorted(truncate(m.id, "sha256:") for m in matches))
        raise CtlError(f"image id prefix {text!r} is ambiguous: it starts {len(matches)} ids ({names})")
    if not matches:
        raise CtlError(f"no such image {text!r} present")
    image_id = matches[0].id
    status = conn.image(
        "ImageStatus", pb.ImageStatusRequest(image=pb.ImageSpec(image=image_id), verbose=verbose)
    )
    if not status.HasField("image"):
        raise CtlError(f"no such image {text!r} present")
    return image_id, status


def named_or_listed(named: list[str], listed: Callable[[], Sequence[Any]]) -> list[str]:
    """What the `inspect*` commands show: the ids named, else those of all the filters find
    (none: see `nothing_found`)."""
    return named or [item.id for item in listed()]


def nothing_found(args: Any) -> int:
    """crictl's answer to an `inspect*` with no id where the filters find nothing: the error on
    stderr, the command's usage on stdout, exit 0."""
    import sys

    print("cri-proxy ctl: No IDs provided or nothing found per filter", file=sys.stderr)
    args.ctl_parser.print_help()
    return 0
