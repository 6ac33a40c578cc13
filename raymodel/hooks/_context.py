"""``RunContext``: what a hook or callback knows of the run it is in."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class RunContext:
    """Where a training run is and what it may do next; ``model.context`` and
    ``callback.context`` on every train worker (``None`` outside a run).

    Set ``should_stop = True`` from the model or any callback, on any worker:
    every worker finishes the current epoch, a final checkpoint is written,
    and the run ends normally (``after_fit`` runs).

    Attributes:
        rank: This worker's rank among all workers (0 writes checkpoints).
        world_size: How many workers train together.
        local_rank: This worker's rank on its node.
        epoch: The current epoch (1-based; 0 before the first one starts).
        num_epochs: The last epoch the run may reach.
        name: The run's name.
        storage_path: The run's folder or URI (where its checkpoints go).
        resumed_from: The epoch of the checkpoint this attempt resumed from (0: a fresh start).
        checkpoint: Where that checkpoint is (``None``: a fresh start).
        trial_id: The Ray Tune trial this run is (``None`` outside ``tune``).
        settings: The run's ``TrainSettings``.
        should_stop: Stop at the end of this epoch (any worker may set it).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    epoch: int = 0
    num_epochs: int = 0
    name: str = ""
    storage_path: str = ""
    resumed_from: int = 0
    checkpoint: str | None = None
    trial_id: str | None = None
    settings: Any = None
    should_stop: bool = False
