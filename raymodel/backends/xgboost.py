"""XGBoost: ``RayXGBoostModel`` on Ray Train's ``XGBoostTrainer``, one boosting round per epoch.

Training is really distributed: Ray Train starts XGBoost's collective
(tracker and communicator) and each worker builds its ``DMatrix`` from its own
shard of the rows. Hooks: see :mod:`raymodel.backends._trees`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from raymodel._internal.deps import require
from raymodel.backends._trees import TreeBackend, TreeRun
from raymodel.model import RayModel


class XGBoostBackend(TreeBackend):
    name = "xgboost"
    extra = "xgboost"
    packages = ("xgboost",)
    booster_file = "model.json"

    @classmethod
    def model_base(cls) -> type:
        return RayXGBoostModel

    def import_framework(self) -> None:
        require("xgboost", "xgboost")

    def train_loop(self) -> Callable[[dict[str, Any]], Any]:
        return xgboost_train_loop

    def make_trainer(self, train_loop: Callable[[dict[str, Any]], Any], *, train_loop_config: dict[str, Any],
                     scaling_config: Any, run_config: Any, datasets: dict[str, Any] | None) -> Any:
        from ray.train.xgboost import XGBoostTrainer

        return XGBoostTrainer(train_loop, train_loop_config=train_loop_config, scaling_config=scaling_config,
                              run_config=run_config, datasets=datasets or None)

    def load_booster(self, path: Path) -> Any:
        import xgboost

        booster = xgboost.Booster()
        booster.load_model(str(path))
        return booster

    def forward(self, model: RayModel, x: Any) -> Any:
        import xgboost

        return self.trained_booster(model).predict(xgboost.DMatrix(x))


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


def xgboost_train_loop(loop_config: dict[str, Any]) -> dict[str, Any]:
    """``train_loop_per_worker``: one ``xgboost.train`` over this worker's shard."""
    import xgboost

    tree = TreeRun(loop_config)
    run, model = tree.run, tree.run.model
    tree.wait(run.setup_model())
    tree.wait(run.restore())
    splits = run.splits()
    x, y = tree.shard(splits["train"])
    dtrain = xgboost.DMatrix(x, label=y)
    evals = [(dtrain, "train")]
    if "valid" in splits:
        vx, vy = tree.shard(splits["valid"])
        evals.append((xgboost.DMatrix(vx, label=vy), "valid"))
    done = len(run.history)
    tree.wait(run.hooks.call("before_fit"))

    class Rounds(xgboost.callback.TrainingCallback):
        def before_iteration(self, booster: Any, epoch: int, evals_log: Any) -> bool:
            tree.wait(run.hooks.call("before_epoch", done + epoch + 1))
            return False

        def after_iteration(self, booster: Any, epoch: int, evals_log: Any) -> bool:
            model.booster = booster
            tree.wait(tree.end_round(done + epoch + 1, _metrics(evals_log)))
            return False

    remaining = run.num_epochs - done
    if remaining > 0:
        model.booster = xgboost.train(dict(model.params), dtrain, num_boost_round=remaining, evals=evals,
                                      callbacks=[Rounds()], xgb_model=model.booster, verbose_eval=False)
    return tree.wait(run.finish())


def _metrics(evals_log: dict[str, dict[str, list[float]]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for data_name, prefix in (("train", ""), ("valid", "val_")):
        for i, (metric, values) in enumerate(evals_log.get(data_name, {}).items()):
            out[f"{prefix}loss" if i == 0 else f"{prefix}{metric}"] = float(values[-1])
    return out
