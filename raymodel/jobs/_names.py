"""Names every part of the training server agrees on: the server actor's, and the job states."""

from raymodel._internal.runtime import JOB_ACTIVE as ACTIVE
from raymodel._internal.runtime import JOB_DONE as DONE
from raymodel._internal.runtime import SERVER_NAME as NAME
from raymodel._internal.runtime import SERVER_NAMESPACE as NAMESPACE

__all__ = ["ACTIVE", "DONE", "NAME", "NAMESPACE", "UPDATABLE"]

#: The settings ``job.update`` may change mid-run.
UPDATABLE = ("num_epochs", "checkpoint_every", "keep_checkpoints")
