"""What every part of the training server agrees on: the job states, what ``job.update`` may change,
and how long an idle pool lives by default."""

__all__ = ["ACTIVE", "DONE", "UPDATABLE", "DEFAULT_POOL_IDLE_S"]

#: A job that is not done.
ACTIVE = ("PENDING", "RUNNING")
#: The states a job ends in (a release's gate rejects its candidate; its rollout's guard rolls it back).
DONE = ("SUCCEEDED", "FAILED", "STOPPED", "REJECTED", "ROLLED_BACK")
#: The settings ``job.update`` may change mid-run.
UPDATABLE = ("num_epochs", "checkpoint_every", "keep_checkpoints")
#: An idle pool ends after this many seconds unless ``rm.init(pool_idle_s=...)`` says otherwise.
DEFAULT_POOL_IDLE_S = 120.0
