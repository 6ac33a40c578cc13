"""A Tune callback that interrupts an experiment (its own module: `ray.tune` takes about a second to
import, and `models.py` is imported by every subprocess the tests start)."""

from __future__ import annotations

import os
import signal

from ray import tune as ray_tune


class StopAfter(ray_tune.Callback):
    """Interrupts the experiment like Ctrl-C once `n` trials have finished."""

    def __init__(self, n: int) -> None:
        self.n, self.done = n, 0

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.done += 1
        if self.done == self.n:
            os.kill(os.getpid(), signal.SIGINT)
