"""Training runs in this process, without Ray: the real `WorkerRun` and the real loop, with a session
that stores checkpoints the way Ray Train does (a copy under the run's folder)."""

from __future__ import annotations

import shutil
from pathlib import Path

from raymodel.train import TrainSettings, WorkerRun
from raymodel.train._driver import worker_payload


class StoringSession:
    """One worker, no Ray: reports are recorded and checkpoints copied under the run's folder."""

    rank, world, local_rank = 0, 1, 0
    in_worker_group = False

    def __init__(self, run_path: Path, handed_back: str | None = None) -> None:
        self.run_path, self.handed_back = run_path, handed_back
        self.reports: list[tuple[dict, bool]] = []

    def latest_checkpoint(self):
        from ray.train import Checkpoint

        return None if self.handed_back is None else Checkpoint(self.handed_back)

    def report(self, metrics, checkpoint_dir, name):
        self.reports.append((metrics, checkpoint_dir is not None))
        if checkpoint_dir is not None:
            shutil.copytree(checkpoint_dir, self.run_path / name, dirs_exist_ok=True)

    def broadcast(self, value):
        return value

    def barrier(self):
        pass


def run_in_process(model, settings, data, session, path):
    """``WorkerRun`` of ``model`` on ``data`` in this process, with ``session``: its outcome."""
    settings = TrainSettings.coerce(settings)
    blob = worker_payload(model, settings, {"name": "run", "path": str(path)})
    return WorkerRun({"payload": blob, "data": data, "hub": None}, session=session).run()
