"""Names every part of the training server agrees on: the server actor's, and the job states."""

from raymodel._internal.runtime import SERVER_NAME as NAME
from raymodel._internal.runtime import SERVER_NAMESPACE as NAMESPACE

#: A job that is not done, and the states a job ends in.
ACTIVE, DONE = ("PENDING", "RUNNING"), ("SUCCEEDED", "FAILED", "STOPPED")

__all__ = ["ACTIVE", "DONE", "NAME", "NAMESPACE"]
