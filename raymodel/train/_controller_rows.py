"""The Ray Train ``UserCallback`` that carries each epoch's row from Train V2's controller to the driver.

Its own module: importing ``ray.train`` takes about a second, and only a run needs it.
"""

from __future__ import annotations

from typing import Any

from ray.train import UserCallback

from raymodel._internal import storage


class ProgressCallback(UserCallback):
    """Forward each report's rank-0 metrics (and its checkpoint's path, as ``checkpoint_path``) to the run's hub.

    With ``wait=True`` the report waits until the reader acknowledged the row
    (the run then moves at its reader's pace, as a Tune trial must). ``root``,
    the run's storage, gives the path its scheme back (Ray's is a path on the
    storage's filesystem).
    """

    def __init__(self, hub: Any, wait: bool = False, root: str | None = None) -> None:
        self.hub, self.wait, self.root = hub, wait, root

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        if metrics:
            row = dict(metrics[0])
            if checkpoint is not None:
                row["checkpoint_path"] = storage.rebase(self.root, checkpoint.path) if self.root else checkpoint.path
            if self.wait:
                import ray

                ray.get(self.hub.deliver.remote(row))
            else:
                self.hub.push.remote(row)
