"""The ``TrainingServer`` port of ``raymodel.contract``, as ``raymodel.jobs`` fills it for the drivers below it
(train, tune, serve, predict): room before they take resources, and a Tune trial's job on a pool."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from raymodel.exceptions import TrainingError
from raymodel.jobs._address import running_handle
from raymodel.jobs._client import follow
from raymodel.jobs._constants import DONE
from raymodel.jobs._job import submit_request


class ServerClient:
    """The ``TrainingServer`` port of ``raymodel.contract``, for the drivers below ``raymodel.jobs``.

    It holds nothing: pickled into a Tune trial, it finds the server there by its name.
    """

    def running(self) -> bool:
        return running_handle() is not None

    def make_room(self, needs: Mapping[str, float] | None = None) -> None:
        import ray

        server = running_handle()
        if server is not None:
            ray.get(server.make_room.remote(None if needs is None else dict(needs)))

    def train_job(
        self,
        model: Any,
        settings: Any,
        spec: Any,
        *,
        hub: Any,
        info: dict[str, Any],
        resume_from: str | None,
        relay: Callable[[bool], None],
    ) -> None:
        from raymodel.jobs._request import train_request

        blob, request = train_request(model, settings, spec, hub=hub, deliver=True, info=info, resume_from=resume_from)
        job = submit_request("train", blob, request)
        record: dict[str, Any] = {"status": None}
        try:
            # Rows wait at the hub for their acknowledgement: relay them between short polls.
            record = follow(job, lambda r: relay(r["status"] in DONE), wait_s=0.0)
        finally:
            if record["status"] not in DONE:
                job.stop()  # Tune ended the trial (ASHA, the experiment's end)
        if record["status"] == "FAILED":
            raise TrainingError(record["error"])

    def stop_trial_jobs(self, trial_id: str) -> None:
        server = running_handle()
        if server is not None:
            server.stop_trial.remote(trial_id)
