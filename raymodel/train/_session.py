"""``TrainSession``: where a run is placed when it is a Ray Train V2 worker."""

from __future__ import annotations

from typing import Any


class TrainSession:
    """Where a run is placed: a Ray Train V2 worker (rank, reports, checkpoints).

    A session answers: rank, world, local_rank, ``latest_checkpoint()``,
    ``report(metrics, checkpoint_dir, name)``, ``broadcast(value)``, ``barrier()``,
    ``settings_changed(settings)`` (``job.update`` changed them at an epoch boundary).
    The other placement is a Tune trial's own process (``tune/_trial.py``).
    """

    #: The framework's distributed setup (DDP, a strategy's cluster) comes from Ray Train.
    on_ray_train = True

    def __init__(self) -> None:
        import ray.train

        context = ray.train.get_context()
        self.rank: int = context.get_world_rank()
        self.world: int = context.get_world_size()
        self.local_rank: int = context.get_local_rank()

    def latest_checkpoint(self) -> Any:
        import ray.train

        return ray.train.get_checkpoint()

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, name: str) -> None:
        import ray.train

        checkpoint = None if checkpoint_dir is None else ray.train.Checkpoint.from_directory(checkpoint_dir)
        ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=name)

    def broadcast(self, value: Any) -> Any:
        from ray.train.collective import broadcast_from_rank_zero

        return broadcast_from_rank_zero(value)

    def barrier(self) -> None:
        from ray.train.collective import barrier

        barrier()

    def settings_changed(self, settings: Any) -> None:
        """Ray Train's ``CheckpointConfig`` is fixed for the run (the server refuses ``keep_checkpoints``
        changes of such a run); nothing else here depends on the settings."""
