"""Which keys of a Ray Tune result the model reported: the rest is Tune's own bookkeeping."""

from __future__ import annotations

#: What Tune adds to every result (and a trial's config, under ``config``).
TUNE_KEYS = frozenset(
    {
        "training_iteration",
        "should_checkpoint",
        "checkpoint_path",
        "time_this_iter_s",
        "time_total_s",
        "timestamp",
        "trial_id",
        "date",
        "pid",
        "hostname",
        "node_ip",
        "time_since_restore",
        "iterations_since_restore",
        "done",
        "config",
        "experiment_tag",
        "checkpoint_dir_name",
    }
)


def is_reported(key: str) -> bool:
    """Whether a result's ``key`` is the model's own (not Tune's bookkeeping or the trial's config)."""
    return key not in TUNE_KEYS and not key.startswith("config")
