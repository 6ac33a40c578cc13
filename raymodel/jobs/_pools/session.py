"""``PoolSession``: where a job on a pool runs, and how its checkpoints reach the job's own storage."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from raymodel._internal import storage
from raymodel.contract import checkpoint as ckpt


class PoolSession:
    """Where a job on a pool runs: a worker of the pool's Ray Train run (see ``TrainSession``).

    Ray Train is not told of the job's reports: rank 0 writes each checkpoint to
    the job's storage, keeps ``keep_checkpoints`` of them, and sends each row to
    the server and to the job's hub.
    """

    in_worker_group = True
    pooled = True

    def __init__(self, spec: dict[str, Any], job_id: str) -> None:
        import ray.train

        context = ray.train.get_context()
        self.rank: int = context.get_world_rank()
        self.world: int = context.get_world_size()
        self.local_rank: int = context.get_local_rank()
        self.job_id, self.spec = job_id, spec
        self.server, self.hub = spec.get("server"), spec["loop_config"].get("hub")
        self.history: dict[int, dict[str, Any]] = {}

    def latest_checkpoint(self) -> Any:
        return None  # the job's storage decides (``WorkerRun._resume_candidates``)

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, name: str) -> None:
        if self.rank != 0:
            return
        row = dict(metrics)
        self.history[int(row.get("epoch", 0))] = row
        path = self.spec["path"]
        if checkpoint_dir is not None:
            location = storage.join(path, name)
            _store(checkpoint_dir, location)
            prune(path, self.spec.get("keep_checkpoints"), self.spec.get("metric"), self.spec.get("mode"), self.history)
            row["checkpoint_path"] = location
        if self.server is not None:
            self.server.push.remote(self.job_id, [{k: v for k, v in row.items() if k != "checkpoint_path"}])
        if self.hub is not None:
            import ray

            # Waited for: an async actor may run calls out of order. A Tune trial (``deliver``) also
            # waits for its answer (ASHA's stop, PBT's exploit) before the next epoch.
            try:
                ray.get(self.hub.deliver.remote(row) if self.spec.get("deliver") else self.hub.push.remote(row))
            except ray.exceptions.RayActorError:  # its caller is gone (a trial Tune ended): stop the job
                self.hub = None
                if self.server is not None:
                    self.server.stop.remote(self.job_id)

    def settings_changed(self, settings: Any) -> None:
        """``job.update`` changed the settings: keep as many checkpoints as they now say."""
        self.spec = {**self.spec, "keep_checkpoints": settings.keep_checkpoints}

    def broadcast(self, value: Any) -> Any:
        from ray.train.collective import broadcast_from_rank_zero

        return broadcast_from_rank_zero(value)

    def barrier(self) -> None:
        from ray.train.collective import barrier

        barrier()


def _store(directory: str, location: str) -> None:
    """Copy a checkpoint to the job's storage, its manifest last (a local folder appears whole, by rename)."""
    if storage.is_uri(location):
        storage.upload(directory, location, last=ckpt.MANIFEST)
        return
    target = Path(location)
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = target.parent / f".{target.name}.{os.getpid()}.tmp"
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(directory, staged)
    if target.exists():
        shutil.rmtree(target)
    os.replace(staged, target)


def prune(
    path: str, keep: int | None, metric: str | None, mode: str | None, history: dict[int, dict[str, Any]]
) -> None:
    """Keep the ``keep`` best checkpoints by ``metric`` (the newest without one) and always the newest,
    as Ray Train's ``CheckpointConfig`` does for a one-off run."""
    if keep is None:
        return
    epochs = sorted(e for e in (ckpt.epoch_of(n) for n in storage.listdir(path)) if e is not None)
    if len(epochs) <= keep:
        return
    newest = epochs[-1]
    if metric is not None:
        scored = [e for e in epochs if metric in history.get(e, {})]
        sign = 1.0 if mode == "max" else -1.0
        ranked = sorted(scored, key=lambda e: sign * float(history[e][metric]), reverse=True)
        ranked += [e for e in reversed(epochs) if e not in scored]
    else:
        ranked = list(reversed(epochs))
    kept = set(ranked[:keep]) | {newest}
    for epoch in epochs:
        if epoch not in kept:
            storage.delete(storage.join(path, f"checkpoint_epoch_{epoch:06d}"))
