"""Where the training server is: its actor's name and namespace, and a look-up of the running one.

Only ``raymodel.jobs`` reads this; the server's own parts (pools, runners) are handed its handle.
"""

from __future__ import annotations

from typing import Any

#: The training server's actor name and Ray namespace (one server per cluster).
NAME, NAMESPACE = "raymodel-job-server", "raymodel"


def find() -> Any:
    """The server's handle in the cluster this process is attached to, or ``None``: the one look-up of
    the actor (``running_handle`` and ``_client.server_handle`` both ask here)."""
    import ray

    try:
        return ray.get_actor(NAME, namespace=NAMESPACE)
    except ValueError:
        return None


def running_handle() -> Any:
    """The running server's handle, or ``None``; never starts Ray or a server (for code inside the
    cluster: a Tune trial, the port's calls)."""
    import ray

    return find() if ray.is_initialized() else None
