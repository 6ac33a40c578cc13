"""Why Serve could not deploy an application, in the words of what failed.

``serve.run`` raises with the application's summary alone ("Failed to update the deployments
['digits-model']"); what failed (a replica's constructor: the model's ``setup``, a checkpoint that
would not load, a base folder that is gone) is in each deployment's status message, as the
traceback the replica raised, and otherwise only in the Serve controller's log.
"""

from __future__ import annotations


def replica_failures(app_name: str) -> str | None:
    """The exception each failed deployment of ``app_name`` last raised (its message's last line,
    by deployment), or None when Serve says none failed or cannot be asked."""
    from ray import serve

    try:
        app = serve.status().applications.get(app_name)
    except Exception:  # noqa: BLE001 - without Serve's status, the caller's summary alone is said
        return None
    said = []
    for name, deployment in (app.deployments if app is not None else {}).items():
        lines = [line.strip() for line in (deployment.message or "").splitlines() if line.strip()]
        if deployment.status in ("DEPLOY_FAILED", "UNHEALTHY") and lines:
            said.append(f"{name}: {lines[-1]}")
    return "; ".join(said) or None
