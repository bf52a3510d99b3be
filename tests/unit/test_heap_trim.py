"""The heap given back after a connection closes: the trigger's rules on a fake heap, glibc's trim on
the real one (the proxy in front of containerd: tests/e2e/test_h2_edges.py)."""

from __future__ import annotations

import asyncio
import time

from cri_proxy.relay.heap import HeapTrim, malloc_trim, rss_bytes

MiB = 1 << 20


class Heap:
    """A fake RSS, and a trim that brings it down to `live` and counts its runs."""

    def __init__(self, rss: int) -> None:
        self.now = rss
        self.live = rss
        self.runs = 0
        self.fail = False

    def rss(self) -> int:
        return self.now

    def trim(self) -> int:
        self.runs += 1
        if self.fail:
            raise OSError("trim failed")
        self.now = self.live
        return 1


async def settled(heap: HeapTrim, timeout: float = 5.0) -> None:
    """Until nothing is pending (a look waiting, a trim running), within `timeout`."""
    deadline = time.monotonic() + timeout
    while heap.pending is not None:
        assert time.monotonic() < deadline, "the heap trim never settled"
        await asyncio.sleep(0.005)


def test_no_trim_while_the_rss_stays_within_the_slack() -> None:
    async def go() -> None:
        fake = Heap(100 * MiB)
        heap = HeapTrim(fake.trim, fake.rss, slack=4 * MiB, wait=0.01, every=0.0)
        fake.now += 4 * MiB  # grown, but not past the slack
        heap.look()
        await settled(heap)
        assert (fake.runs, heap.trims) == (0, 0)

    asyncio.run(go())


def test_a_close_that_leaves_the_heap_grown_trims_it_once_and_moves_the_floor() -> None:
    async def go() -> None:
        fake = Heap(100 * MiB)
        heap = HeapTrim(fake.trim, fake.rss, slack=4 * MiB, wait=0.01, every=0.0)
        fake.now, fake.live = 130 * MiB, 103 * MiB  # 27 MiB up, 3 of it live
        for _ in range(5):  # connections closing together: one look
            heap.look()
        await settled(heap)
        assert (fake.runs, heap.trims, heap.floor) == (1, 1, 103 * MiB)
        fake.now = 106 * MiB  # within the slack of the new floor
        heap.look()
        await settled(heap)
        assert fake.runs == 1

    asyncio.run(go())


def test_the_floor_follows_the_rss_down() -> None:
    """Memory given back without a trim lowers the mark the next growth is measured from."""

    async def go() -> None:
        fake = Heap(100 * MiB)
        heap = HeapTrim(fake.trim, fake.rss, slack=4 * MiB, wait=0.0, every=0.0)
        fake.now = fake.live = 90 * MiB
        heap.look()
        await settled(heap)
        assert (fake.runs, heap.floor) == (0, 90 * MiB)
        fake.now = 99 * MiB  # within the slack of the first mark, past it from the lower one
        heap.look()
        await settled(heap)
        assert (fake.runs, heap.floor) == (1, 90 * MiB)

    asyncio.run(go())


def test_trims_are_spaced_by_every() -> None:
    async def go() -> None:
        fake = Heap(100 * MiB)
        heap = HeapTrim(fake.trim, fake.rss, slack=MiB, wait=0.0, every=0.3)
        fake.now = 120 * MiB
        heap.look()
        await settled(heap)
        first = asyncio.get_running_loop().time()
        fake.now = 140 * MiB
        heap.look()
        await settled(heap)
        assert fake.runs == 2
        assert asyncio.get_running_loop().time() - first >= 0.3 - 0.01

    asyncio.run(go())


def test_a_failing_trim_is_not_counted_and_the_next_close_looks_again() -> None:
    async def go() -> None:
        fake = Heap(100 * MiB)
        heap = HeapTrim(fake.trim, fake.rss, slack=MiB, wait=0.0, every=0.0)
        fake.now, fake.fail = 120 * MiB, True
        heap.look()
        await settled(heap)
        assert (fake.runs, heap.trims, heap.floor) == (1, 0, 100 * MiB)
        fake.fail = False
        heap.look()
        await settled(heap)
        assert (fake.runs, heap.trims, fake.now) == (2, 1, 100 * MiB)

    asyncio.run(go())


def test_without_malloc_trim_or_once_cancelled_nothing_is_scheduled() -> None:
    async def go() -> None:
        fake = Heap(100 * MiB)
        fake.now = 200 * MiB
        absent = HeapTrim(None, fake.rss, wait=0.0)
        absent.look()
        assert absent.pending is None
        heap = HeapTrim(fake.trim, fake.rss, slack=MiB, wait=0.05, every=0.0)
        heap.look()
        assert heap.pending is not None
        heap.cancel()
        heap.look()
        await asyncio.sleep(0.1)
        assert (fake.runs, heap.pending) == (0, None)

    asyncio.run(go())


def test_glibc_malloc_trim_gives_back_freed_pages() -> None:
    """The binding works on this C library: blocks glibc keeps in its heap (not mmapped, not
    pymalloc's) freed with a few kept among them, then trimmed: the RSS falls."""
    trim = malloc_trim()
    assert trim is not None, "glibc's malloc_trim not found"
    trim()
    blocks = [bytes(4000) for _ in range(20000)]  # ~80 MB in 4 KB blocks, each touched (zeroed)
    kept = blocks[::50]  # a block kept every 200 KB: the heap's top cannot shrink past them
    del blocks
    before = rss_bytes()
    trim()
    after = rss_bytes()
    assert kept
    assert before - after > 40 * MiB, (before / MiB, after / MiB)
