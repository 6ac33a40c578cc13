"""XGBoost: ``RayXGBoostModel`` on Ray Train's ``XGBoostTrainer``, one boosting round per epoch.

Training is really distributed: Ray Train starts XGBoost's collective
(tracker and communicator) and each worker builds its ``DMatrix`` from its own
shard of the rows; each epoch is one ``Booster.update``. A checkpoint holds
the booster in XGBoost's own JSON format. Hooks: see ``raymodel.backends._trees``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raymodel.backends._trees import TreeBackend, TreeInference, TreeLoop, trained_booster
from raymodel.contract import PoolKind, RayTrain
from raymodel.model import RayModel


class XGBoostInference(TreeInference):
    def forward(self, model: Any, x: Any) -> Any:
        import xgboost

        return trained_booster(model).predict(xgboost.DMatrix(x))


class XGBoostBackend(TreeBackend):
    name = "xgboost"
    extra = "xgboost"
    imports = ("xgboost",)
    pool = PoolKind(worker_imports=("xgboost",))
    packages = ("xgboost",)
    training = RayTrain("raymodel.backends.xgboost:XGBoostLoop", "ray.train.xgboost.XGBoostTrainer")
    inference = XGBoostInference()
    booster_file = "model.json"

    def load_booster(self, path: Path) -> Any:
        import xgboost

        booster = xgboost.Booster()
        booster.load_model(str(path))
        return booster

    def num_features(self, booster: Any) -> int:
        return int(booster.num_features())


class RayXGBoostModel(RayModel):
    """An XGBoost model trained on Ray Train workers; ``setup`` sets ``self.params``.

    After training, ``self.booster`` is the ``xgboost.Booster``; ``forward``
    defaults to its predictions. Each epoch is one boosting round; the metrics
    are XGBoost's evaluation metrics: the first ``eval_metric`` is reported as
    ``loss`` on the training rows and ``val_loss`` on the validation rows,
    others under their own names (``error``, ``val_error``).

    Example:
        >>> class Cancer(rm.RayXGBoostModel):
        ...     def setup(self, config):
        ...         self.params = {"objective": "binary:logistic", "eval_metric": ["logloss", "error"]}
    """

    backend = XGBoostBackend()
    booster: Any = None
    #: The booster's parameter dict, which ``setup`` sets.
    params: dict[str, Any]


class XGBoostLoop(TreeLoop):
    """XGBoost's own ``Booster.update`` per round, inside Ray Train's collective (metrics are global)."""

    def dataset(self, name: str, x: Any, y: Any) -> Any:
        import xgboost

        return xgboost.DMatrix(x, label=y)

    def ready(self) -> None:
        import xgboost

        self.booster = xgboost.Booster(
            dict(self.model.params), list(self.datasets.values()), model_file=self.model.booster
        )  # continues a restored booster

    def set_params(self, params: dict[str, Any]) -> None:
        if getattr(self, "booster", None) is not None:  # else `ready` builds it from `model.params`
            self.booster.set_param(params)

    def boost(self, epoch: int) -> Any:
        self.booster.update(self.datasets["train"], epoch - 1)
        return self.booster

    def evaluate(self, name: str, epoch: int) -> list[tuple[str, float]]:
        text = self.booster.eval_set([(self.datasets[name], name)], epoch - 1)  # "[0]\ttrain-logloss:0.45\t..."
        pairs = [item.removeprefix(f"{name}-").rsplit(":", 1) for item in text.split("\t")[1:]]
        return [(metric, float(value)) for metric, value in pairs]
