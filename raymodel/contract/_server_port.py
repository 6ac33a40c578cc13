"""The training server as the drivers below ``raymodel.jobs`` see it: a port, not a name.

``train/``, ``tune/``, ``serve/`` and ``predict/`` sit below ``raymodel.jobs`` and
may not import it, yet two things they do involve the training server:

* before they take resources (a one-off run, a Tune experiment, a route, a
  batch-inference pool) the server's idle pools that stand in the way end
  (``make_room``);
* a Tune trial with several workers runs its training as a job of the server,
  on a pool, and follows it to its end (``train_job``).

They ask for it through ``TrainingServer``, which they type against and
``raymodel.jobs`` provides when it is imported (``import raymodel`` imports it):
the same plug-in pattern as the backend table. Without a provider (a process
that imports a driver alone) there is no server: nothing to make room for, and
trials train on worker groups of their own.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol


class TrainingServer(Protocol):
    """What a driver may ask of the training server (``raymodel.jobs._port.ServerClient`` is the one provider)."""

    def running(self) -> bool:
        """Whether a training server runs on the cluster this process is attached to."""
        ...

    def make_room(self, needs: Mapping[str, float] | None = None) -> None:
        """End the idle pools that stand in the way of ``needs`` (``None``: every idle pool) and
        return once their resources are back; nothing happens without a server."""
        ...

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
        """Run checked ``settings`` and data ``spec`` as a job of the server, on a pool, and follow it
        to its end: each epoch's row goes to ``hub`` and waits there for its acknowledgement;
        ``relay(done)`` is called between polls to pass rows on. A job left unfinished (the caller
        was interrupted) is stopped.

        Raises:
            TrainingError: the job failed.
        """
        ...

    def stop_trial_jobs(self, trial_id: str) -> None:
        """Stop the server's jobs that Tune trial ``trial_id`` started (the trial ended)."""
        ...


class _NoServer:
    """The port before ``raymodel.jobs`` provides one: no server, nothing to ask."""

    def running(self) -> bool:
        return False

    def make_room(self, needs: Mapping[str, float] | None = None) -> None:
        return None

    def train_job(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("No training server is provided in this process (`import raymodel.jobs` provides it).")

    def stop_trial_jobs(self, trial_id: str) -> None:
        return None


_PROVIDED: list[TrainingServer] = [_NoServer()]


def provide_training_server(server: TrainingServer) -> None:
    """Called by ``raymodel.jobs`` when it is imported: the drivers' port from then on."""
    _PROVIDED[0] = server


def training_server() -> TrainingServer:
    """The training server's port (a no-server stand-in until ``raymodel.jobs`` provides it)."""
    return _PROVIDED[0]
