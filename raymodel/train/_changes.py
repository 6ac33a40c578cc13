"""``JobChanges``: how a run of the training server hears from it at each epoch boundary.

Rank 0 asks the server (``control``) at the end of every epoch, and once before
the first, whether to stop or give way (preemption) and which ``job.update``
changes it has not applied yet; every worker applies rank 0's answer at that
same boundary (``WorkerRun.end_epoch`` gathers it with the stop vote). Applied
changes go into each checkpoint; a run that resumes applies them again.
"""

from __future__ import annotations

from typing import Any


class JobChanges:
    """A run's side of the training server's control: the server to ask, the changes applied so far
    (``{"epoch", "config", "settings"}``, checkpointed), and what the next row shows of them."""

    def __init__(self, control: tuple[Any, str] | None) -> None:
        self.control = control  # (training server, job id), or None outside the server
        self.applied: list[dict[str, Any]] = []
        self.tag: dict[str, Any] | None = None  # the change the next row shows

    def ask(self, epoch: int) -> dict[str, Any] | None:
        """Rank 0, at an epoch's end: whether the training server stops or preempts this job, and the
        changes ``job.update`` asked for that this run has not applied yet."""
        if self.control is None:
            return None
        import ray

        server, job_id = self.control
        return ray.get(server.control.remote(job_id, epoch, len(self.applied)))

    def apply(self, changes: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Take ``changes`` (from the next epoch on): ``(settings, config)``, each merged in order; the next
        row shows them."""
        self.applied.extend(dict(change) for change in changes)
        settings, config = _merged(changes)
        self.tag = {**(self.tag or {}), **config, **settings}
        return settings, config

    def replay(self, changes: list[dict[str, Any]], start_epoch: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The changes a checkpoint recorded, taken again by a run that resumes at ``start_epoch``:
        ``(settings, config)``; the next row shows those that took effect from that epoch."""
        self.applied = [dict(c) for c in changes]
        shown = [c for c in self.applied if int(c.get("epoch", 0)) == start_epoch]
        if shown:  # the next row is the first under the change
            self.tag = {k: v for c in shown for part in ("config", "settings") for k, v in c[part].items()}
        return _merged(changes)

    def take_tag(self) -> dict[str, Any] | None:
        """What the row being written shows of the changes (once)."""
        tag, self.tag = self.tag, None
        return tag


def _merged(changes: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    settings: dict[str, Any] = {}
    config: dict[str, Any] = {}
    for change in changes:
        settings.update(change.get("settings") or {})
        config.update(change.get("config") or {})
    return settings, config
