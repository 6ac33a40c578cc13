"""Where a replica runs its batches (no cluster): a small model's on the event loop, where a thread hop
would cost more than the batch; a slow one's on a thread, so the loop keeps answering meanwhile. Slow
is CPU time (what a batch computes), or a long wait on the clock; not a busy machine's clock."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time

from raymodel.serve._replica.batching import INLINE_BATCH_S, BatchRunner


def compute(seconds: float) -> None:
    """Use ``seconds`` of this thread's CPU, as a forward does (hashing, which lets go of the GIL as
    torch's kernels do)."""
    data = b"x" * 65536
    began = time.thread_time()
    while time.thread_time() - began < seconds:
        hashlib.sha256(data).digest()


def recording(seconds: float):
    threads: list[str] = []

    def run(items):
        threads.append(threading.current_thread().name)
        compute(seconds)
        return [x * 2 for x in items]

    return run, threads


def test_fast_batches_run_on_the_loop_after_the_first_is_timed():
    run, threads = recording(0)
    runner = BatchRunner(run)

    async def main():
        return [await runner([i]) for i in range(5)]

    assert asyncio.run(main()) == [[0], [2], [4], [6], [8]]
    assert threads[0].startswith("raymodel-forward")  # not yet timed: the thread
    assert threads[1:] == [threading.current_thread().name] * 4
    assert runner.where() == "event loop"


def test_slow_batches_stay_on_the_thread_and_the_loop_keeps_answering():
    run, threads = recording(3 * INLINE_BATCH_S)
    runner = BatchRunner(run)
    ticks = 0

    async def health():  # what Serve's health checks and new requests need: the loop, free
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    async def main():
        checker = asyncio.create_task(health())
        for i in range(4):
            await runner([i])
        checker.cancel()

    asyncio.run(main())
    assert all(name.startswith("raymodel-forward") for name in threads)
    assert runner.where() == "forward thread"
    assert ticks >= 8  # 4 batches of 6 ms: the loop ran while each one computed


def test_a_model_that_slows_down_moves_back_to_the_thread():
    durations = [0.0] * 4 + [10 * INLINE_BATCH_S] * 3
    threads: list[str] = []

    def run(items):
        threads.append(threading.current_thread().name)
        compute(durations[len(threads) - 1])
        return items

    runner = BatchRunner(run)

    async def main():
        for i in range(len(durations)):
            await runner([i])

    asyncio.run(main())
    main_thread = threading.current_thread().name
    assert threads[1:5] == [main_thread] * 4  # fast: inline, including the first slow one (not yet known)
    assert threads[5].startswith("raymodel-forward") and runner.where() == "forward thread"


def test_where_a_batch_runs_follows_its_cpu_time_not_a_busy_clock():
    """In-process: a batch stretched on the clock (a busy machine: 10 ms, little CPU) stays on the
    loop; one that computes (5 ms of CPU) or waits long (80 ms) goes to the thread."""

    def stretched(_):
        time.sleep(0.01)
        return threading.current_thread().name

    def computes(_):
        compute(0.005)
        return threading.current_thread().name

    def waits(_):
        time.sleep(0.08)
        return threading.current_thread().name

    async def run(fn):
        runner = BatchRunner(fn)
        names = [await runner(None) for _ in range(6)]
        return names, runner.where()

    names, where = asyncio.run(run(stretched))
    assert names[0].startswith("raymodel-forward") and names[1:] == ["MainThread"] * 5 and where == "event loop"
    for fn in (computes, waits):
        names, where = asyncio.run(run(fn))
        assert all(n.startswith("raymodel-forward") for n in names) and where == "forward thread", fn.__name__
