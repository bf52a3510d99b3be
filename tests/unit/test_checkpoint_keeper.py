"""The checkpoint keeper on a disk that stops answering: one write at a time, said once it has taken
too long, counted in `unsaved_seconds`, and a stop that does not wait for it past its bound. The
writes here are the real `checkpoint.save` behind a gate the test opens; the stall of a real disk
is in `test_serve_process.py::test_a_stalled_disk_is_said_and_does_not_hold_the_stop`."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from loguru import logger

from cri_proxy.daemon.checkpoints import CheckpointKeeper
from cri_proxy.state import checkpoint
from cri_proxy.state.model import NodeState, PodRecord
from tests.unit.relay_support import eventually


def pod(n: int) -> PodRecord:
    return PodRecord(f"s{n}", f"u{n}", f"p{n}", "default", f"/kubepods/podu{n}", {}, {})


class Gated:
    """The real write, each one waiting for the test to let it through."""

    def __init__(self) -> None:
        self.gate = threading.Semaphore(0)
        self.started = 0
        self.running = 0
        self.most_at_once = 0
        self.lock = threading.Lock()

    def __call__(self, path: Path, state: NodeState, encoder: checkpoint.Encoder) -> int:
        with self.lock:
            self.started += 1
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        generation, pods, containers = state.snapshot()  # taken first, as the real write does
        taken = NodeState()
        taken.replace_all(pods, containers)
        self.gate.acquire()  # then the disk: its file write and fsync
        try:
            checkpoint.save(path, taken, encoder=encoder)
            return generation
        finally:
            with self.lock:
                self.running -= 1


def saved_pods(path: Path) -> set[str]:
    loaded = checkpoint.load(path)
    return {p.sandbox_id for p in loaded[0]} if loaded else set()


def test_a_write_that_does_not_end_is_said_once_and_counted_and_the_stop_does_not_wait_for_it(
    tmp_path: Path,
) -> None:
    lines: list[tuple[str, str]] = []
    sink = logger.add(lambda m: lines.append((m.record["level"].name, m.record["message"])), level="INFO")

    async def main() -> None:
        state = NodeState()
        write = Gated()
        keeper = CheckpointKeeper(tmp_path, state, interval=0.01, stalled_after=0.2, write=write)
        task = asyncio.ensure_future(keeper.run())
        state.put_pod(pod(1))
        await eventually(lambda: write.started == 1, "the first write under way")
        for n in range(2, 6):  # changes while it hangs: no second write beside it
            state.put_pod(pod(n))
            await asyncio.sleep(0.05)
        await eventually(lambda: any("has not ended" in m for _, m in lines), "the stall said")
        assert write.started == 1
        assert keeper.unsaved_seconds() >= 0.2
        assert "s behind: a write under way for" in keeper.describe()  # `ctl status`
        stalls = [m for lvl, m in lines if "has not ended" in m]
        assert len(stalls) == 1 and "is the disk stalled?" in stalls[0] and str(keeper.path) in stalls[0]

        write.gate.release()  # the disk answers again: that write held pod 1 only
        await eventually(lambda: write.started == 2, "the next write, of the state now")
        assert any(lvl == "INFO" and "written after" in m for lvl, m in lines)
        assert saved_pods(keeper.path) == {"s1"}
        assert keeper.unsaved_seconds() > 0  # the changes after its snapshot are not in the file yet
        write.gate.release()
        await eventually(lambda: keeper.unsaved_seconds() == 0.0, "every change written")
        assert saved_pods(keeper.path) == {f"s{n}" for n in range(1, 6)}
        assert keeper.describe() == "up to date"

        state.put_pod(pod(6))
        await eventually(lambda: write.started == 3, "a write that hangs again")
        task.cancel()  # the stop: the loops end, then the last writes within the bound
        began = time.monotonic()
        await keeper.flush(wait=0.3)
        assert 0.25 <= time.monotonic() - began < 2.0
        assert any("stopping without it" in m for _, m in lines)
        assert write.most_at_once == 1
        write.gate.release()
        write.gate.release()

    try:
        asyncio.run(main())
    finally:
        logger.remove(sink)


def test_the_stop_waits_for_the_write_under_way_then_writes_the_state_now(tmp_path: Path) -> None:
    async def main() -> None:
        state = NodeState()
        write = Gated()
        keeper = CheckpointKeeper(tmp_path, state, interval=0.01, write=write)
        task = asyncio.ensure_future(keeper.run())
        state.put_pod(pod(1))
        await eventually(lambda: write.started == 1, "a write under way")
        state.put_pod(pod(2))
        task.cancel()
        threading.Timer(0.1, write.gate.release).start()
        threading.Timer(0.2, write.gate.release).start()
        await keeper.flush(wait=5.0)
        assert write.started == 2 and write.most_at_once == 1
        assert saved_pods(keeper.path) == {"s1", "s2"}
        assert keeper.unsaved_seconds() == 0.0

    asyncio.run(main())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["change", "open", "fail", "turn"]), min_size=1, max_size=30))
def test_one_write_at_a_time_and_the_file_never_goes_back(tmp_path_factory: object, steps: list[str]) -> None:
    """Random interleavings of state changes, writes let through (or failing: the directory is a
    file) and the keeper's turns (`save` with a deadline, as its loop and the stop call it): never
    two writes at once, each write holds a state at least as new as the one before, after a turn
    that ends with no write under way `unsaved_seconds` is 0 exactly when the file holds the state
    (with one under way, never 0: its thread may be ending it as the file is read), and the stop's
    flush (every write let through) leaves the file holding everything."""
    root = Path(str(tmp_path_factory.mktemp("keeper")))  # type: ignore[attr-defined]
    (root / "file").write_text("")

    async def main() -> None:
        state = NodeState()
        write = Gated()
        failing = threading.Event()
        written: list[int] = []

        def maybe_failing(path: Path, now: NodeState, encoder: checkpoint.Encoder) -> int:
            generation = write(root / "file" / "x" if failing.is_set() else path, now, encoder)
            written.append(generation)
            return generation

        keeper = CheckpointKeeper(root, state, stalled_after=60, write=maybe_failing)
        n = 0
        for step in steps:
            if step == "change":
                n += 1
                state.put_pod(pod(n))
            elif step in ("open", "fail"):
                if step == "fail":
                    failing.set()
                else:
                    failing.clear()
                write.gate.release()
            else:
                idle = await keeper.save(time.monotonic() + 0.05)
                assert write.most_at_once <= 1
                assert written == sorted(written)
                if not idle:  # a write under way (its thread may be ending it now): never "up to date"
                    assert keeper.unsaved_seconds() > 0.0 and keeper.describe() != "up to date"
                    continue
                held = keeper.path.exists() and saved_pods(keeper.path) == {
                    p.sandbox_id for p in state.pods()
                }
                assert (keeper.unsaved_seconds() == 0.0) == held
                assert (keeper.describe() == "up to date") == held
        failing.clear()
        for _ in range(4):
            write.gate.release()
        await keeper.flush(wait=5.0)
        assert saved_pods(keeper.path) == {p.sandbox_id for p in state.pods()}
        assert keeper.unsaved_seconds() == 0.0
        for _ in range(8):
            write.gate.release()

    asyncio.run(main())
