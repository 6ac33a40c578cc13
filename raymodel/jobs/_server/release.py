"""A release job in its runner: train -> evaluate -> register -> roll out -> promote.

Each stage ends with a row of the job's history, ``{"stage": ..., "start": ..., "end": ..., ...}``
holding its figures (the train stage's epoch rows carry ``"stage": "train"`` too). A runner started
again for the job (the server or the head restarted) reads those rows and goes on after the last
stage that ended: training resumes from its run's newest checkpoint, evaluation runs again, the
version is registered once (a version whose lineage names this job is the one it registered), a
rollout of the candidate still running on the route is followed, not started again.

The job ends ``SUCCEEDED`` (promoted), ``REJECTED`` (the gate: both figures in the reason; nothing is
registered, no route or alias is touched), ``ROLLED_BACK`` (the guard's breach: the route serves what
it served before, no alias moved), ``STOPPED`` (``job.stop()``; a rollout under way is stopped,
which sets the route back) or ``FAILED`` (an error; or its rollout stopped by another hand: the version
registered, no alias moved, the route serving what it served before).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import ray

from raymodel.jobs._release_plan import STAGES


class Stages:
    """The stage rows of one release job: those of an earlier runner, and each one as it ends."""

    def __init__(self, server: Any, job_id: str, resume: bool) -> None:
        self.server, self.job_id = server, job_id
        rows = ray.get(server.rows.remote(job_id, 0))[0] if resume else []
        self.done = {row["stage"]: row for row in rows if row.get("stage") in STAGES and "end" in row}

    def end(self, stage: str, start: float, **figures: Any) -> dict[str, Any]:
        row = {"stage": stage, "start": start, "end": time.time(), **figures}
        ray.get(self.server.push.remote(self.job_id, [row]))
        self.done[stage] = row
        return row


def run_release(
    runner: Any, job: dict[str, Any], model: Any, server: Any, resume: bool, train_stage: Any, tune_stage: Any
) -> dict[str, Any]:
    """The job's outcome: ``{"result": ..., "status": ...}`` (``status`` omitted: SUCCEEDED, or STOPPED
    when the job was stopped). ``train_stage`` and ``tune_stage``: ``execute.py``'s, which calls this."""
    plan = job["release"]
    stages = Stages(server, runner.job_id, resume)
    result: dict[str, Any] = {"stages": []}

    def ended(status: str | None, reason: str) -> dict[str, Any]:
        result.update(stages=[stages.done[s] for s in STAGES if s in stages.done], reason=reason)
        return {"result": result, **({"status": status} if status else {})}

    # ------------------------------------------------------------------ train
    trained = stages.done.get("train")
    if trained is None:
        start = time.time()
        if "space" in job:  # a tuned release: the best trial's checkpoint is the candidate
            tuned = tune_stage(runner, job, model, server, resume)
            if runner.stopping():
                return ended(None, "stopped while tuning")
            trial = {"trial_id": tuned["best_trial_id"], "config": tuned["best_config"], "trials": tuned["num_trials"]}
            trained = stages.end(
                "train", start, metrics=tuned["best_metrics"], checkpoint=tuned["best_checkpoint"], tuned=trial
            )
        else:
            outcome = train_stage(runner, job, model, server)
            result["train"] = outcome
            if runner.stopping():
                return ended(None, "stopped while training")
            trained = stages.end("train", start, metrics=outcome["metrics"], checkpoint=outcome["checkpoint"])
    candidate_at = trained["checkpoint"]
    if trained.get("tuned"):  # the best trial's config: its checkpoint's weights fit it
        model = type(model)(config=trained["tuned"]["config"])

    # --------------------------------------------------------------- evaluate
    gate = plan["gate"]
    judged = stages.done.get("evaluate")
    if judged is None:
        start = time.time()
        against = _against(plan)
        figures = _score(model, job, plan, candidate_at, "candidate")
        theirs = _score(against["model"], job, plan, against["location"], "against") if against else None
        from raymodel.jobs._release_plan import decide, figure_of

        mine = figure_of(gate, figures, "the candidate")
        other = figure_of(gate, theirs, against["ref"]) if against else None
        assert mine is not None  # the candidate's figures are there
        passed, why = decide(gate, mine, other)
        judged = stages.end(
            "evaluate",
            start,
            candidate=figures,
            against=theirs,
            against_version=against["ref"] if against else None,
            passed=passed,
            reason=why,
        )
    if not judged["passed"]:  # (a runner started again after the gate's row: the same end)
        return ended("REJECTED", f"rejected at the gate: {judged['reason']}")
    ray.get(server.done_computing.remote(runner.job_id))  # the rest waits: it holds no workers
    if runner.stopping():
        return ended(None, "stopped after the gate")

    # --------------------------------------------------------------- register
    registered = stages.done.get("register")
    if registered is None:
        start = time.time()
        version = _register(plan, runner.job_id, candidate_at, judged)
        registered = stages.end("register", start, version=version)
    version = registered["version"]
    result["version"] = version
    if runner.stopping():
        return ended(None, f"stopped after registering {version}")

    # ---------------------------------------------------------------- rollout
    route, rollout = plan.get("route"), plan["rollout"]
    if route is not None:
        rolled = stages.done.get("rollout")
        if rolled is None:
            start = time.time()
            status, reason = _roll_out(runner, route, version, rollout)
            rolled = stages.end("rollout", start, route=route, status=status, reason=reason)
        if rolled["status"] == "rolled back":
            return ended("ROLLED_BACK", rolled["reason"])
        if rolled["status"] != "promoted":  # stopped: the route serves what it served before
            if runner.stopping():  # by job.stop()
                return ended(None, rolled["reason"])
            # by another hand (rollout.stop(), the route not served again after a restart): not released
            return {"error": f"the rollout of {version} on `{route}` ended without promoting it: {rolled['reason']}"}

    # ---------------------------------------------------------------- promote
    if "promote" not in stages.done:
        start = time.time()
        moved = _promote(plan, version)
        stages.end("promote", start, alias=moved)
    alias = stages.done["promote"].get("alias")
    return ended(None, f"released {version}" + (f": {alias} names it" if alias else ""))


def _against(plan: dict[str, Any]) -> dict[str, Any] | None:
    """The version ``gate.against`` names now: its reference, model and checkpoint's location (``None``:
    the first release, no such version yet)."""
    from raymodel.exceptions import RegistryError
    from raymodel.registry import Registry

    gate = plan["gate"]
    if gate.against is None:
        return None
    registry = Registry(plan["registry"])
    try:
        record = registry.show(gate.against)
    except RegistryError:  # no such alias (or key) yet: the submit checked that this is a first release
        return None
    ref = f"{record.key}:{record.version}"
    return {"ref": ref, "model": registry.get(ref), "location": registry.location(ref)}


def _score(model: Any, job: dict[str, Any], plan: dict[str, Any], location: str, side: str) -> dict[str, float]:
    """The gate's figures of the checkpoint at ``location``, by a run of one worker in this runner (Ray
    Train's local mode: no worker group to start; RLlib: the Algorithm's actor without env runners) on
    the release's held-out data (the data's ``valid`` split, or ``gate.data``)."""
    from raymodel.train import Trainable

    settings = job["settings"]
    trial = getattr(settings, "train", settings)  # a tuned release: its trials' settings
    scoring = dataclasses.replace(
        trial,
        num_workers=0,
        name=f"{settings.name}-gate-{side}",
        progress=False,
        callbacks=[],
        max_failures=0,
    )
    data = plan.get("gate_data") if plan.get("gate_data") is not None else job["data"]
    return Trainable(model, scoring, data=data).evaluate(location)


def _register(plan: dict[str, Any], job_id: str, checkpoint: str, judged: dict[str, Any]) -> str:
    """The candidate as the next version of the key, once: a version whose lineage names this job
    (registered by a runner that died before its row was written) is that version."""
    from raymodel.registry import Registry

    registry = Registry(plan["registry"])
    key, alias = plan["key"], plan["alias"]
    for record in registry.list(key) if key in registry.keys() else []:
        if record.lineage.get("job") == job_id:
            return f"{key}:{record.version}"
    lineage = {
        "job": job_id,
        "parent": plan.get("parent") or judged.get("against_version"),
        "gate": {"candidate": judged["candidate"], "against": judged["against"], "reason": judged["reason"]},
    }
    return str(registry.put(checkpoint, key, alias, lineage=lineage))


def _roll_out(runner: Any, route: str, version: str, plan: Any) -> tuple[str, str]:
    """The rollout of ``version`` on ``route`` (one already running for it is followed): its end."""
    from raymodel.serve import rollout, rollouts

    # One started for it before a restart is taken up by the controller (started here if need be) and followed.
    going = [r for r in rollouts(start=True) if r.state()["route"] == route and r.state()["candidate"] == version]
    running = next((r for r in going if r.state()["status"] == "running"), None)
    ended = next((r for r in reversed(going) if r.state()["status"] != "running"), None)
    if running is None and ended is not None:
        return ended.status, str(ended.reason)
    live = running or rollout(route, version, plan.steps, plan.step_s, plan.guard)
    while (status := live.status) == "running":
        if runner.stopping():
            live.stop()  # the route serves what it served before the rollout began
            return "stopped", str(live.reason)
        time.sleep(0.5)
    return status, str(live.reason)


def _promote(plan: dict[str, Any], version: str) -> str | None:
    """``gate.against``'s alias names ``version`` (a rollout on its route moved it already): the alias."""
    from raymodel._internal import name_rules
    from raymodel.registry import Registry

    against = plan["gate"].against
    if against is None:
        return None
    key, alias = name_rules.parse_ref(against)
    if not isinstance(alias, str):
        return None  # a version number: nothing to move
    Registry(plan["registry"]).set_alias(key, alias, int(version.rsplit(":", 1)[1]))
    return f"{key}@{alias}"
