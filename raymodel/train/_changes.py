"""``JobChanges``: how a run of the training server hears from it at each epoch boundary.

Rank 0 asks the server (``control``) at the end of every epoch, and once before
the first, whether to stop or give way (preemption) and which ``job.update``
changes it has not applied yet; every worker applies rank 0's answer at that
same boundary (``WorkerRun.end_epoch`` gathers it with the stop vote). Applied
changes go into each checkpoint; a run that resumes applies them again.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raymodel.contract import Model
    from raymodel.hooks import HookRunner, RunContext
    from raymodel.train._settings import TrainSettings


class JobChanges:
    """Mixed into ``WorkerRun``, whose ``__init__`` sets what is declared here."""

    control: tuple[Any, str] | None  # (training server, job id), or None outside the server
    changes: list[dict[str, Any]]
    settings: TrainSettings
    context: RunContext
    model: Model
    worker: Any  # the backend's WorkerLoop
    session: Any
    hooks: HookRunner
    _tag: dict[str, Any] | None  # the change the next row shows

    if TYPE_CHECKING:

        @property
        def num_epochs(self) -> int: ...

    def _ask_server(self, epoch: int) -> dict[str, Any] | None:
        """Rank 0, at an epoch's end: whether the training server stops or preempts this job, and the
        changes ``job.update`` asked for that this run has not applied yet."""
        if self.control is None:
            return None
        import ray

        server, job_id = self.control
        return ray.get(server.control.remote(job_id, epoch, len(self.changes)))

    async def _apply_changes(self, changes: list[dict[str, Any]]) -> None:
        """Apply ``job.update``'s changes from the next epoch on: settings, then the config (merged into
        ``model.config``; the backend sets what it can, e.g. the optimizers' ``lr``), then the hook."""
        config: dict[str, Any] = {}
        for change in changes:
            self.changes.append(dict(change))
            self._set_settings(change.get("settings") or {})
            config.update(change.get("config") or {})
        shown = {**config, **{k: v for c in changes for k, v in (c.get("settings") or {}).items()}}
        self._tag = {**(self._tag or {}), **shown}
        if config:
            self.model.config.update(config)
            self.worker.apply_config(config)
            await self.hooks.call("on_config_update", dict(config))

    def _set_settings(self, settings: dict[str, Any]) -> None:
        if not settings:
            return
        self.settings = dataclasses.replace(self.settings, **settings)
        self.context.settings, self.context.num_epochs = self.settings, self.num_epochs
        self.session.settings_changed(self.settings)
        self.worker.settings_changed()

    def _replay(self, changes: list[dict[str, Any]]) -> dict[str, Any]:
        """The changes a checkpoint recorded, applied again (settings, ``model.config``); their config."""
        config: dict[str, Any] = {}
        for change in changes:
            self._set_settings(change.get("settings") or {})
            config.update(change.get("config") or {})
        self.changes = [dict(c) for c in changes]
        self.model.config.update(config)
        return config
