"""Images: `images`, `inspecti`, `pull`, `rmi`, `imagefsinfo`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cri_proxy.ctl import output, resolve
from cri_proxy.ctl.conn import Conn
from cri_proxy.ctl.errors import CtlError

NONE = "<none>"


def _sort_key(image: Any) -> tuple[str, str, str]:
    return (
        image.repo_tags[0] if image.repo_tags else "",
        image.repo_digests[0] if image.repo_digests else "",
        image.id,
    )


def _repo_digest(digests: Any) -> tuple[str, str]:
    if not digests:
        return NONE, NONE
    pair = digests[0].split("@")
    return (pair[0], pair[1]) if len(pair) == 2 else ("errorName", "errorRepoDigest")


def _repo_tag_pairs(tags: Any, name: str) -> list[tuple[str, str]]:
    if not tags:
        return [(name, NONE)]
    pairs = []
    for tag in tags:
        repo, colon, version = tag.rpartition(":")
        if not colon:
            pairs.append(("errorRepoTag", "errorRepoTag"))
            continue
        pairs.append((name if repo == NONE else repo, version))
    return pairs


def _list(conn: Conn, name: str) -> list[Any]:
    """The images `--name`/IMAGE selects, sorted as crictl sorts them (`images` and `inspecti`)."""
    pb = conn.pb
    request = pb.ListImagesRequest(filter=pb.ImageFilter(image=pb.ImageSpec(image=name)))
    return sorted(conn.image("ListImages", request).images, key=_sort_key)


def images(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    found = _list(conn, args.name)
    if output.brief_listing(args, pb.ListImagesResponse(images=found), (image.id for image in found)):
        return 0
    if args.verbose:
        for image in found:
            lines = [f"ID: {image.id}"]
            lines += [f"RepoTags: {t}" for t in image.repo_tags] + [
                f"RepoDigests: {d}" for d in image.repo_digests
            ]
            if image.size:
                lines.append(f"Size: {image.size}")
            if image.HasField("uid"):
                lines.append(f"Uid: value:{image.uid.value}")
            if image.username:
                lines.append(f"Username: {image.username}")
            if image.pinned:
                lines.append("Pinned: true")
            print("\n".join(lines) + "\n")
        return 0
    head = ["IMAGE", "TAG"] + (["DIGEST"] if args.digests else []) + ["IMAGE ID", "SIZE"]
    rows = [head + (["PINNED"] if args.pinned else [])]
    for image in found:
        name, digest = _repo_digest(image.repo_digests)
        image_id = image.id if args.no_trunc else output.truncate(image.id, "sha256:")
        if not args.no_trunc:
            digest = output.truncate(digest, "sha256:")
        for repo, tag in _repo_tag_pairs(image.repo_tags, name):
            row = [repo, tag] + ([digest] if args.digests else []) + [image_id, output.human_size(image.size)]
            rows.append(row + (["true" if image.pinned else "false"] if args.pinned else []))
    print(output.table(rows))
    return 0


def inspecti(args: argparse.Namespace, conn: Conn) -> int:
    texts = resolve.named_or_listed(list(args.ids), lambda: _list(conn, args.name))
    if not texts:
        return resolve.nothing_found(args)
    docs = []
    for text in texts:
        _, r = resolve.image(conn, text, verbose=not args.quiet)
        if args.output == "table":
            lines = [f"ID: {r.image.id}"]
            lines += [f"Tag: {t}" for t in r.image.repo_tags] + [f"Digest: {d}" for d in r.image.repo_digests]
            lines.append(f"Size: {output.human_size(r.image.size)}")
            if not args.quiet:
                lines.append(f"Info: {output.go_map(r.info)}")
            print("\n".join(lines))
            continue
        docs.append(output.status_document(output.message_dict(r.image), r.info))
    if docs:
        print(output.documents_output(docs, args.output, args.template))
    return 0


def pull(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    request = pb.PullImageRequest(image=pb.ImageSpec(image=args.image))
    if args.pod_config:
        from cri_proxy.ctl.configs import load_pod_config

        request.sandbox_config.CopyFrom(load_pod_config(pb, args.pod_config))
    try:
        r = conn.image("PullImage", request, None)
    except CtlError as exc:
        raise CtlError(f"pulling image: {exc}") from None
    print(f"Image is up to date for {r.image_ref}")
    return 0


def rmi(args: argparse.Namespace, conn: Conn) -> int:
    pb = conn.pb
    targets: dict[str, bool] = dict.fromkeys(args.ids, True)
    if args.all or args.prune:
        for image in conn.image("ListImages", pb.ListImagesRequest()).images:
            if not (args.prune and image.pinned):
                targets[image.id] = True
    if args.prune:
        for c in resolve.containers(conn):
            r = conn.image("ImageStatus", pb.ImageStatusRequest(image=pb.ImageSpec(image=c.image.image)))
            if r.HasField("image"):
                targets[r.image.id] = False
    if not targets:
        if args.all or args.prune:
            print("No images to remove", file=sys.stderr)
            return 0
        raise CtlError("give at least one IMAGE-ID, or --all, or --prune")
    failed = 0
    for text, remove in targets.items():
        if not remove:
            continue
        try:
            ref, status = resolve.image(conn, text)
            conn.image("RemoveImage", pb.RemoveImageRequest(image=pb.ImageSpec(image=ref)))
        except CtlError as exc:
            if not args.prune:
                print(f"cri-proxy ctl: removing image {text!r}: {exc}", file=sys.stderr)
                failed += 1
            continue
        for name in status.image.repo_tags or status.image.repo_digests:
            print(f"Deleted: {name}")
    return 1 if failed else 0


def imagefsinfo(args: argparse.Namespace, conn: Conn) -> int:
    r = conn.image("ImageFsInfo", conn.pb.ImageFsInfoRequest())
    if args.output == "table":
        for label, filesystems in (("Container", r.container_filesystems), ("Image", r.image_filesystems)):
            print(f"{label} Filesystem ")
            for i, fs in enumerate(filesystems):
                print(f"TimeStamp[{i}]: {fs.timestamp}")
                print(f"Disk[{i}]: {output.human_size(fs.used_bytes.value, 4)}")
                print(f"Inodes[{i}]: {fs.inodes_used.value}")
                print(f"Mountpoint[{i}]: {fs.fs_id.mountpoint}")
        return 0
    print(
        output.documents_output(
            [output.status_document(output.message_dict(r), {})], args.output, args.template
        )
    )
    return 0
