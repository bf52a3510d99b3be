"""The kubelet state file's reader over random sequences of what happens to the real file: the
kubelet's rewrites (by rename, as it writes), a bad rewrite, the file removed, replaced by a FIFO,
a directory, a symlink or a runaway file. After each poll: the last good contents are kept while
the file is unusable, dropped when it is gone; the problem is there exactly while the file is
unusable; and the poll says it changed exactly when what it holds did."""

from __future__ import annotations

import asyncio
import json
import os
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cri_proxy.cpu import parse_kubelet_state_text
from cri_proxy.sources.kubelet_file import MAX_BYTES, KubeletStateFile

GOOD = [
    {"policyName": "static", "defaultCpuSet": "0-11", "entries": {"uid-g": {"main": "12-13"}}},
    {"policyName": "static", "defaultCpuSet": "0-9", "entries": {"uid-g": {"main": "10-13"}}},
    {"policyName": "none", "defaultCpuSet": ""},
]
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("good"), st.integers(0, len(GOOD) - 1)),
        st.tuples(st.sampled_from(["bad", "gone", "fifo", "dir", "link", "huge", "poll"]), st.just(0)),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_the_reader_holds_the_last_good_contents_and_says_each_change(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]]
) -> None:
    base = tmp_path_factory.mktemp("kubelet")
    path = base / "cpu_manager_state"
    spare = base / "other_state"
    spare.write_text(json.dumps(GOOD[2]))
    reader = KubeletStateFile(path)
    kept = None  # the model: the last good contents, and whether the file is unusable now
    unusable = False
    serial = 0

    def remove() -> None:
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        elif path.exists() or path.is_symlink():
            path.unlink()

    def replace_with(make: object) -> None:
        nonlocal serial
        serial += 1
        tmp = base / f"new-{serial}"
        make(tmp)  # type: ignore[operator]
        if path.is_dir() and not path.is_symlink():
            path.rmdir()  # a rename does not go over a directory
        os.rename(tmp, path)  # as the kubelet writes: a new file renamed over the old

    async def main() -> None:
        nonlocal kept, unusable
        for op, n in ops:
            if op == "good":
                text = json.dumps(GOOD[n])
                replace_with(lambda p, text=text: p.write_text(text))
                kept, unusable = parse_kubelet_state_text(text), False
            elif op == "bad":
                replace_with(lambda p: p.write_text('{"policyName": "static", "defaultCpuSet": '))
                unusable = True
            elif op == "gone":
                remove()
                kept, unusable = None, False
            elif op == "fifo":
                replace_with(os.mkfifo)
                unusable = True
            elif op == "dir":
                remove()
                path.mkdir()
                unusable = True
            elif op == "link":
                replace_with(lambda p: p.symlink_to(spare))
                kept, unusable = parse_kubelet_state_text(spare.read_text()), False
            elif op == "huge":
                replace_with(lambda p: p.write_bytes(b" " * (MAX_BYTES + 1)))
                unusable = True
            before = (reader.state, reader.problem)
            changed = await reader.refresh()
            assert reader.state == kept, op
            assert (reader.problem is not None) == unusable, (op, reader.problem)
            assert changed == ((reader.state, reader.problem) != before), op
            assert await reader.refresh() is False  # nothing moved since: nothing to say

    try:
        asyncio.run(main())
    finally:
        shutil.rmtree(base, ignore_errors=True)
