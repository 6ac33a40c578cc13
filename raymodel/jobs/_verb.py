"""``model.release(...)``: mixed into ``RayModel`` (``model.py``), which is full; the work is ``_release.py``'s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from raymodel.jobs._job import Job
    from raymodel.jobs._release_plan import Gate, ReleaseResult, RolloutPlan
    from raymodel.train import TrainSettings
    from raymodel.tune import TuneSettings


class Releases:
    """The release verb of every model."""

    def release(
        self,
        *,
        data: Any = None,
        settings: TrainSettings | Mapping[str, Any] | None = None,
        tune: TuneSettings | Mapping[str, Any] | None = None,
        space: Mapping[str, Any] | None = None,
        register: str,
        gate: Gate | Mapping[str, Any],
        route: str | None = None,
        rollout: RolloutPlan | Mapping[str, Any] | None = None,
        registry: str | None = None,
        wait: bool = False,
    ) -> Job | ReleaseResult:
        """Train, gate, register, roll out and promote, as one durable job of the training server.

        Stages (each a row of ``job.history()`` with ``"stage"``, its start, end and figures):
        **train** as ``train(settings, data=...)`` (or, with ``tune``, as ``tune(space, settings=tune,
        data=...)``: the best trial's checkpoint is the candidate); **evaluate**: the candidate and the version
        ``gate.against`` names are scored on the same held-out data (the data's ``valid`` split, or
        ``gate.data``) in the cluster; one that does not pass ends the job ``REJECTED`` and nothing
        is registered; **register** as ``register`` (its lineage names the job, the parent version
        and both figures); **rollout** on ``route`` (``rm.RolloutPlan``: steps, guarded): a breach
        ends it ``ROLLED_BACK``, the route serving what it served, and a stop by another hand than
        ``job.stop()`` (``rollout.stop()``) ends it ``FAILED``; **promote**: ``gate.against``'s
        alias names the new version. docs/releases.md says more.

        Args:
            data: As for ``train``, with a ``valid`` split (unless ``gate.data`` is given).
            settings: A ``TrainSettings`` or a dict of its fields (a release trains in a one-off run).
            tune: A ``TuneSettings`` (or a dict) instead of ``settings``: the release tunes first.
            space: With ``tune``: the search space (default: ``hyperparameter_space()``).
            register: ``"KEY"`` or ``"KEY@ALIAS"``: where the candidate goes, once it passes the gate.
            gate: ``rm.Gate(metric=..., mode=..., min_delta=..., against="KEY@production")``.
            route: A route that serves ``against``'s alias (``rm.Servable('digits@production',
                '/digits').deploy()``); ``None``: no rollout, the alias moves once registered.
            rollout: ``rm.RolloutPlan(steps=..., step_s=..., guard=rm.Guard(...))``.
            registry: The registry (default: ``RAYMODEL_REGISTRY`` or ``$RAYMODEL_HOME/registry``).
            wait: Block, printing each row and stage as it comes, and return the ``ReleaseResult``.

        Returns:
            A ``Job`` of kind ``"release"`` (``job.stage``, ``job.status``, ``job.wait()``), or with
            ``wait=True`` its ``ReleaseResult``.

        Raises:
            SettingsError / DataError: bad input (a gate metric the model does not report, ``against``
                naming no version, a route not served, steps not ending at 1.0), before anything runs.
        """
        from raymodel.jobs._release import follow, submit_release

        job = submit_release(
            self, data=data, settings=settings, tune=tune, space=space, register=register, gate=gate, route=route,
            rollout=rollout, registry=registry,
        )  # fmt: skip
        return follow(job) if wait else job
