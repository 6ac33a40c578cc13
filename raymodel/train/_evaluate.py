"""A run that only scores: a checkpoint's figures on the validation split, no training (a release's gate).

``WorkerRun`` does it when its payload's ``info`` names a checkpoint under ``"evaluate"``: the user's
``setup``, the data, the backend's ``build``, then that checkpoint's state, then the backend's
``WorkerLoop.score``: ``validate`` over the whole split for a loop-driven backend, the framework's
own evaluation for one with its own loop (Lightning's ``Trainer.validate``, the ``Trainer``'s
``evaluate``, RLlib's evaluation episodes). The validation hooks run around it as in training; the
figures come back as ``val_*`` in ``{"metrics": ..., "history": []}``, the same on every worker.
"""

from __future__ import annotations

from typing import Any

from raymodel.contract import checkpoint as ckpt
from raymodel.exceptions import DataError


async def evaluate(run: Any, location: str) -> dict[str, Any]:
    """Score the checkpoint at ``location`` (a run's, or a registry version's) on the validation split of
    ``run`` (the ``WorkerRun``, which calls this: typed ``Any`` to keep the two modules out of a circle)."""
    if not run.worker.has_validation and not getattr(run.worker, "evaluates_without_data", False):
        raise DataError(
            "Scoring a model needs held-out data: give data with a `valid` split (`valid_fraction=0.2`, say), "
            "or the gate's own `data`."
        )
    with ckpt.local_copy(location) as directory:
        ckpt.verify(directory)
        state = ckpt.read_state(run.model, directory)
    run.worker.set_state(state)
    run.worker.ready()
    run._phase = "evaluate"  # WorkerRun's phase order (``_NEXT``), which its methods check from here
    figures = await run.worker.score()
    if run._phase == "evaluate":  # scored by ``validate``, outside the phase: the run calls it around
        await run.begin_validation()
        figures = await run.end_validation(figures)
    else:  # the framework's evaluation called the run's validation phase itself
        figures = {k if k.startswith("val_") else f"val_{k}": float(v) for k, v in figures.items()}
    run._enter("evaluated")
    return {"metrics": figures, "history": [], "evaluated": location}
