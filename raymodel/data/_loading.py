"""Sharding rows across workers and prefetching the next batch in the background."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, AsyncIterator, Iterable, Iterator

import numpy as np

from raymodel.exceptions import DataError

_DONE = object()


def worker_rows(
    n: int, rank: int, world: int, *, train: bool, shuffle: bool = False, seed: int = 0, epoch: int = 0
) -> np.ndarray:
    """The one sharding policy of every backend: this worker's rows of ``n`` for one epoch.

    Training shards are padded (wrapped around) to the same length on every
    worker, so data-parallel steps stay in step, and reshuffled each epoch
    when ``shuffle``; validation shards are not padded, so every row is
    counted exactly once across workers.
    """
    return shard_indices(n, rank, world, shuffle=train and shuffle, seed=seed, epoch=epoch, pad=train)


def shard_indices(n: int, rank: int, world: int, *, shuffle: bool, seed: int, epoch: int, pad: bool) -> np.ndarray:
    """This worker's rows of ``n`` for one epoch.

    All workers draw the same seeded permutation and take every ``world``-th
    row from their rank on, so the shards are disjoint and cover every row.
    With ``pad`` (training) the permutation is wrapped around so every worker
    gets the same number of rows, and so the same number of batches, which
    DDP's gradient all-reduce needs; validation does not pad, so every row
    counts exactly once.
    """
    _check_shard(n, rank, world, seed, epoch)
    order = np.random.default_rng(seed + epoch).permutation(n) if shuffle else np.arange(n)
    if pad and n % world:
        extra = world - n % world
        order = np.concatenate([order, order[:extra]])
    return order[rank::world]


def _check_shard(n: Any, rank: Any, world: Any, seed: Any, epoch: Any) -> None:
    """The sharding helpers' arguments, checked like ``TrainSettings``' (a ``DataError`` naming the bad one)."""
    from raymodel._internal.settings import MAX_SEED, check_int, check_seed

    check_seed("seed", seed, DataError)
    problem = (
        check_int("n", n, minimum=0)
        or check_int("world", world, minimum=1)
        or check_int("rank", rank, minimum=0, maximum=max(int(world) - 1, 0))
        or check_int("epoch", epoch, minimum=0, maximum=MAX_SEED - seed)
    )
    if problem:
        raise DataError(problem)


def worker_batches(iterable: Iterable[Any], rank: int, world: int, *, train: bool) -> Iterator[Any]:
    """The same policy for a shared iterable of ready batches: every ``world``-th batch from
    ``rank`` on; training keeps whole rounds only (equal batch counts), validation keeps all."""
    if train:
        return round_robin(iterable, rank, world)
    return (batch for i, batch in enumerate(iterable) if i % world == rank)


async def aworker_batches(iterable: Any, rank: int, world: int, *, train: bool) -> AsyncIterator[Any]:
    """``worker_batches`` for an async iterable."""
    if train:
        async for batch in around_robin(iterable, rank, world):
            yield batch
        return
    i = 0
    async for batch in iterable:
        if i % world == rank:
            yield batch
        i += 1


def round_robin(iterable: Iterable[Any], rank: int, world: int) -> Iterator[Any]:
    """Every ``world``-th batch of a shared iterable, from ``rank`` on, whole rounds only.

    A batch is yielded only once its round is complete, so every worker gets
    the same number of batches (a trailing partial round is dropped).
    """
    if world == 1:
        yield from iterable
        return
    mine = None
    for i, batch in enumerate(iterable):
        if i % world == rank:
            mine = batch
        if i % world == world - 1:
            yield mine
            mine = None


async def around_robin(iterable: Any, rank: int, world: int) -> AsyncIterator[Any]:
    """``round_robin`` for an async iterable."""
    i, mine = 0, None
    async for batch in iterable:
        if world == 1:
            yield batch
            continue
        if i % world == rank:
            mine = batch
        if i % world == world - 1:
            yield mine
            mine = None
        i += 1


def prefetch(iterable: Iterable[Any], depth: int = 2) -> Iterator[Any]:
    """Iterate ``iterable`` in a background thread, ``depth`` batches ahead.

    Loading (indexing, collation, a DataLoader's workers) then overlaps the
    step that runs on the current batch. Errors in the producer are re-raised
    in the consumer.
    """
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in iterable:
                if stop.is_set():
                    return
                q.put((True, item))
            q.put((True, _DONE))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            q.put((False, exc))

    thread = threading.Thread(target=produce, name="raymodel-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            ok, item = q.get()
            if not ok:
                raise item
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                thread.join(timeout=0.05)


async def aprefetch(iterable: Any) -> AsyncIterator[Any]:
    """Iterate an async iterable one batch ahead: the next ``__anext__`` runs as a task
    while the caller awaits its step."""
    it = iterable.__aiter__()
    pending = asyncio.ensure_future(it.__anext__())
    try:
        while True:
            try:
                item = await pending
            except StopAsyncIteration:
                return
            pending = asyncio.ensure_future(it.__anext__())
            yield item
    finally:
        if not pending.done():
            pending.cancel()
