"""LightGBM: ``RayLightGBMModel`` on Ray Train's ``LightGBMTrainer``, one boosting round per epoch.

Training is really distributed: each worker passes Ray Train's network
parameters (``ray.train.lightgbm.get_network_params()``) to LightGBM's
data-parallel tree learner and builds its ``Dataset`` from its own shard;
each epoch is one ``Booster.update``. LightGBM evaluates each worker's rows,
and raymodel averages the metrics over workers weighted by rows (exact for
mean metrics such as logloss and error). A checkpoint holds the booster in
LightGBM's own text format. Hooks: see ``raymodel.backends._trees``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raymodel.backends._trees import TreeBackend, TreeInference, TreeLoop, trained_booster
from raymodel.contract import PoolKind, RayTrain
from raymodel.model import RayModel


class LightGBMInference(TreeInference):
    def forward(self, model: Any, x: Any) -> Any:
        return trained_booster(model).predict(x)


class LightGBMBackend(TreeBackend):
    name = "lightgbm"
    extra = "lightgbm"
    imports = ("lightgbm",)
    pool = PoolKind(worker_imports=("lightgbm",))
    packages = ("lightgbm",)
    training = RayTrain("raymodel.backends.lightgbm:LightGBMLoop", "ray.train.lightgbm.LightGBMTrainer")
    inference = LightGBMInference()
    booster_file = "model.txt"

    def load_booster(self, path: Path) -> Any:
        import lightgbm

        return lightgbm.Booster(model_file=str(path))

    def num_features(self, booster: Any) -> int:
        return int(booster.num_feature())


class RayLightGBMModel(RayModel):
    """A LightGBM model trained on Ray Train workers; ``setup`` sets ``self.params``.

    After training, ``self.booster`` is the ``lightgbm.Booster``; ``forward``
    defaults to its predictions. Each epoch is one boosting round; the first
    ``metric`` is reported as ``loss`` (training rows) and ``val_loss``
    (validation rows), others under their own names.

    Example:
        >>> class Cancer(rm.RayLightGBMModel):
        ...     def setup(self, config):
        ...         self.params = {"objective": "binary", "metric": ["binary_logloss", "binary_error"]}
    """

    backend = LightGBMBackend()
    booster: Any = None
    #: The booster's parameter dict, which ``setup`` sets.
    params: dict[str, Any]


class LightGBMLoop(TreeLoop):
    """LightGBM's own ``Booster.update`` per round; the first round of an attempt builds the booster
    with ``lightgbm.train`` (which continues a restored one and joins Ray Train's network)."""

    def dataset(self, name: str, x: Any, y: Any) -> Any:
        import lightgbm

        reference = self.datasets["train"] if name != "train" else None
        return lightgbm.Dataset(x, label=y, reference=reference, free_raw_data=False)

    def ready(self) -> None:
        params = {"verbosity": -1, **self.model.params}
        if self.run.world > 1:
            params = {"tree_learner": "data_parallel", "pre_partition": True, **params, **self._network()}
        self.params = params
        self.booster: Any = None  # lightgbm.Booster, once the first round is boosted

    def _network(self) -> dict[str, Any]:
        """Ray Train's network parameters; on a pool, a fresh port per job (the previous job's
        listening socket may linger), gathered from every rank."""
        if not getattr(self.run.session, "pooled", False):
            from ray.train.lightgbm import get_network_params

            return get_network_params()
        import socket

        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        machines = self.run.all_gather(f"{ray.util.get_node_ip_address()}:{port}")
        return {"machines": ",".join(machines), "local_listen_port": port, "num_machines": len(machines)}

    def close(self) -> None:
        if self.booster is not None and self.run.world > 1:
            self.booster.free_network()  # the next job on this worker joins a network of its own

    def set_params(self, params: dict[str, Any]) -> None:
        if not hasattr(self, "params"):  # replayed from a checkpoint: `ready` reads `model.params`
            return
        self.params = {**self.params, **params}
        if self.booster is not None:
            self.booster.reset_parameter(params)

    def boost(self, epoch: int) -> Any:
        import lightgbm

        if self.booster is not None:
            self.booster.update()
            return self.booster
        valid = {k: v for k, v in self.datasets.items() if k != "train"}
        self.booster = lightgbm.train(
            self.params,
            self.datasets["train"],
            num_boost_round=1,
            init_model=self.model.booster,
            keep_training_booster=True,
            valid_sets=list(valid.values()) or None,
            valid_names=list(valid) or None,
        )
        return self.booster

    async def score(self) -> dict[str, float]:
        """LightGBM evaluates a booster only on data it trains with: one round from the restored booster
        with the validation set attached, taken back (``rollback_one_iter``), then its validation."""
        self.booster = None
        self.boost(0)
        self.booster.rollback_one_iter()
        return await self.validate(0)

    def evaluate(self, name: str, epoch: int) -> list[tuple[str, float]]:
        results = self.booster.eval_train() if name == "train" else self.booster.eval_valid()
        return [(r[1], float(r[2])) for r in results if name == "train" or r[0] == name]
