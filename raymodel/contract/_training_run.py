"""A training run as whoever drives it sees it: the driver, a job's runner, a pool, a Tune trial.

A ``TrainingRun`` is given a ``RunPlan`` (what to run, where it writes, on which resources, with
which limits, and whom to tell) and ``fit()`` trains to the end, telling the plan's ``RunEvents``
each report's row and each failure as they come, and returns a ``RunOutcome``. Every run type runs
the same worker lifecycle (``raymodel.train.WorkerRun``), so what a run of any type does:

* **starts on the resources it was given**: the plan's workers and per-worker resources;
* **rows as they come**: ``RunEvents.row`` with each report's rank-0 row and the checkpoint written;
* **a checkpoint**: written into ``plan.path`` (``checkpoint_epoch_NNNNNN``), ``keep_checkpoints`` kept;
* **stop**: the ``control`` in ``loop_config`` (the training server's handle and the job's id) is asked
  at each epoch's end; a stopped run writes its checkpoint and returns;
* **resume from a checkpoint**: the payload's ``resume_from``, and after a failure (within
  ``max_failures``) the newest complete checkpoint in ``plan.path``;
* **an error**: ``fit()`` raises ``TrainingError`` naming the worker's exception.

The types that implement it: the Ray Train run (``raymodel/train/_ray_train_run.py``, a one-off run or a
training server's pool) and the RLlib Algorithm's actor (``raymodel/backends/rllib/_run.py``).
Nothing outside a run's own module sees that run's framework types (Ray Train's callbacks and result).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, runtime_checkable

from raymodel._internal import storage
from raymodel.contract import checkpoint as ckpt


class RunEvents:
    """What a run tells as it goes; a subclass overrides what it follows (the defaults do nothing).

    The methods run wherever the run reports from (Ray Train's controller actor, the Algorithm's
    actor, the driver): an implementation is pickled there, so it holds actor handles, not local state.
    """

    def row(self, row: dict[str, Any], checkpoint: str | None) -> None:
        """Rank 0's row of one report, and the checkpoint that report wrote (a location with its
        scheme, ``s3://...`` included), if it wrote one."""

    def workers_failed(self, failures: dict[int, str]) -> None:
        """Workers died or raised (rank -> ``"ErrorType: message"``; a run of one actor: rank 0). The
        run starts them again within ``max_failures`` and resumes from its newest checkpoint."""


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What a run is given."""

    #: The run's name: its folder is ``storage/name``.
    name: str
    #: Where run folders go (a local path or a URI).
    storage: str
    #: The function every worker runs (``raymodel.train``'s ``run_worker``), and its argument.
    loop: Callable[[dict[str, Any]], Any]
    loop_config: dict[str, Any]
    #: Workers, or ``(min, max)`` for an elastic run; each holds ``resources_per_worker`` (and a GPU).
    num_workers: int | tuple[int, int] = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    #: Restarts after failures (``-1``: forever); checkpoints kept (``None``: all), the best by ``metric``.
    max_failures: int = 0
    keep_checkpoints: int | None = None
    metric: str | None = None
    mode: str = "min"
    #: An elastic run: how often it looks for more workers, how long it waits for its minimum.
    elastic_resize_s: float | None = None
    elastic_wait_s: float | None = None
    #: ``ray.data`` Datasets the run's framework splits across its workers (``None``: none).
    datasets: dict[str, Any] | None = None
    #: Whom the run tells of its rows and failures.
    events: tuple[RunEvents, ...] = ()
    verbose: bool = False
    #: Someone else removes the run's placement groups when the run dies without removing them (the
    #: training server sweeps those of its pools), so the run need not start a cleaner of its own.
    groups_swept: bool = False

    @property
    def path(self) -> str:
        """The run's folder: its checkpoints, and the framework's own files."""
        return storage.join(self.storage, self.name)


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """What a run that ended leaves."""

    #: Rank 0's return value (``WorkerRun.run``'s: its ``history`` of rows, ...).
    returned: dict[str, Any]
    #: The run's folder, and its newest checkpoint (``None``: none was written).
    path: str
    checkpoint: str | None
    #: The checkpoints kept, each with the row of the report that wrote it, oldest first.
    checkpoints: list[tuple[str, dict[str, Any]]]

    @classmethod
    def from_storage(cls, path: str, returned: dict[str, Any]) -> RunOutcome:
        """The outcome of a run that applied ``keep_checkpoints`` itself: the checkpoints in ``path``,
        each with the row of its epoch in ``returned["history"]``."""
        rows = {int(r.get("epoch", 0)): r for r in returned.get("history", [])}
        epochs = sorted(e for e in (ckpt.epoch_of(n) for n in storage.listdir(path)) if e is not None)
        found = [(storage.join(path, f"checkpoint_epoch_{e:06d}"), dict(rows.get(e, {}))) for e in epochs]
        return cls(returned=returned, path=path, checkpoint=found[-1][0] if found else None, checkpoints=found)


@runtime_checkable
class TrainingRun(Protocol):
    """A run of one plan; see the module's docstring for what every run type does."""

    plan: RunPlan

    def fit(self) -> RunOutcome:
        """Train to the end (or to a stop), telling ``plan.events`` as it goes.

        Raises:
            TrainingError: the run failed (a worker's exception, or more failures than ``max_failures``).
        """
        ...


def failure_text(error: BaseException) -> str:
    """``"ErrorType: last line of its message"``: how ``RunEvents.workers_failed`` names a failure."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[-1] if text else ''}"
