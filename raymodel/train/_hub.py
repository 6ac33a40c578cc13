"""``RunHub``: one small actor per training run, between its workers and its driver.

* Workers gather small values from every rank through it (``Collective``):
  the ``should_stop`` vote, metric sums, each rank's RNG state. Frameworks
  without a collective of their own (LightGBM, scikit-learn, Keras outside its
  strategy) get one this way, and every backend uses the same one.
* The driver reads the epoch rows the run's ``HubRows`` (its ``RunEvents``) push into it,
  for progress output; a Tune trial reads them to report each epoch to Tune,
  and acknowledges each one, so that training waits for Tune's decision
  (ASHA's stop, PBT's exploit) before the next epoch, as Ray's own Train-in-Tune
  reporting does.

It holds no CPU (``num_cpus=0``) and lives as long as the run's driver.
"""

from __future__ import annotations

import asyncio
import collections
import os
from typing import Any

from raymodel.contract import RayTrain


class RunHub:
    """The actor class (wrapped with ``ray.remote`` by ``start_hub``)."""

    def __init__(self) -> None:
        self._rounds: dict[tuple[str, int], dict[str, Any]] = {}
        self._rows: collections.deque[dict[str, Any]] = collections.deque()
        self._new_row = asyncio.Event()
        self._waiting: dict[int, asyncio.Event] = {}
        self._next_id = 0

    async def gather(self, token: str, seq: int, rank: int, world: int, value: Any) -> list[Any]:
        """Wait until every rank sent its ``value`` for round ``(token, seq)``; all values by rank."""
        key = (token, seq)
        entry = self._rounds.get(key)
        if entry is None:
            entry = self._rounds[key] = {"values": [None] * world, "left": world, "taken": 0, "done": asyncio.Event()}
        entry["values"][rank] = value
        entry["left"] -= 1
        if entry["left"] == 0:
            entry["done"].set()
        await entry["done"].wait()
        entry["taken"] += 1
        if entry["taken"] == world:
            del self._rounds[key]
        return entry["values"]

    def push(self, row: dict[str, Any]) -> None:
        self._rows.append(row)
        self._new_row.set()

    async def deliver(self, row: dict[str, Any]) -> None:
        """Push ``row`` and return once the reader acknowledged it (``ack``)."""
        self._next_id += 1
        done = self._waiting[self._next_id] = asyncio.Event()
        self.push({**row, "_row_id": self._next_id})
        await done.wait()

    def ack(self, row_id: int) -> None:
        event = self._waiting.pop(row_id, None)
        if event is not None:
            event.set()

    async def pop(self, timeout: float) -> list[dict[str, Any]]:
        """Every row pushed since the last call, waiting up to ``timeout`` s for one."""
        if not self._rows:
            self._new_row.clear()
            try:
                await asyncio.wait_for(self._new_row.wait(), timeout)
            except TimeoutError:
                return []
        rows = list(self._rows)
        self._rows.clear()
        return rows


def gathers_through_hub(backend: Any, workers: int) -> bool:
    """Whether a run of ``workers`` ranks on ``backend`` gathers through a hub: several ranks, on Ray
    Train, and a framework without a collective of its own (torch gathers through torch.distributed)."""
    training = backend.training
    return workers > 1 and isinstance(training, RayTrain) and not training.collective


def start_hub() -> Any:
    """Start a hub actor (asynchronously: the call returns before the process is up)."""
    import ray

    from raymodel._ray.cluster import on_this_node

    return ray.remote(num_cpus=0, max_restarts=0)(RunHub).options(scheduling_strategy=on_this_node()).remote()


def stop_hub(hub: Any) -> None:
    import ray

    if hub is not None:
        ray.kill(hub, no_restart=True)


class Collective:
    """All-gather of small Python values across the workers of one attempt of a run.

    A framework's own collective is used when it has one (``native``, e.g.
    ``torch.distributed.all_gather_object``); otherwise the values go through
    the run's hub, under a token rank 0 draws per attempt (shared with Ray
    Train's ``broadcast_from_rank_zero``), so rounds of a failed attempt never
    mix with the next one's. With one worker nothing leaves the process.

    ``barrier`` waits for every rank the same way: through the framework's own
    collective when it has one (a gather of nothing, over torch.distributed),
    else through the session's ``barrier`` (Ray Train's: a round trip to its
    synchronization actor from every rank).
    """

    def __init__(self, hub: Any, rank: int, world: int, broadcast: Any, barrier: Any) -> None:
        self.hub, self.rank, self.world = hub, rank, world
        self.native: Any = None
        self._broadcast, self._barrier = broadcast, barrier
        self._token: str | None = None
        self._seq = 0

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, indexed by rank (a collective: every rank must call it)."""
        if self.world == 1:
            return [value]
        if self.native is not None:
            return list(self.native(value))
        if self.hub is None:
            raise RuntimeError("This run has several workers but no RunHub to gather through.")
        import ray

        if self._token is None:
            self._token = self._broadcast(os.urandom(8).hex() if self.rank == 0 else None)
        self._seq += 1
        return ray.get(self.hub.gather.remote(self._token, self._seq, self.rank, self.world, value))

    def barrier(self) -> None:
        """Return once every rank has called it (a collective: every rank must call it)."""
        if self.world == 1:
            return
        if self.native is not None:
            self.native(None)
        else:
            self._barrier()
