"""Where the training server is: its actor's name and namespace, and a look-up of the running one.

Only ``raymodel.jobs`` reads this; the server's own parts (pools, runners) are handed its handle.
"""

from __future__ import annotations

from typing import Any

#: The training server's actor name and Ray namespace (one server per cluster).
NAME, NAMESPACE = "raymodel-job-server", "raymodel"


def running_handle() -> Any:
    """The running server's handle, or ``None``; never starts Ray or a server (for code inside the
    cluster: a Tune trial, the port's calls)."""
    import ray

    if not ray.is_initialized():
        return None
    try:
        return ray.get_actor(NAME, namespace=NAMESPACE)
    except ValueError:
        return None
