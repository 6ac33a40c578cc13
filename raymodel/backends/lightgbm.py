"""LightGBM: ``RayLightGBMModel`` on Ray Train's ``LightGBMTrainer``, one boosting round per epoch.

Training is really distributed: each worker passes Ray Train's network
parameters (``ray.train.lightgbm.get_network_params()``) to LightGBM's
data-parallel tree learner and builds its ``Dataset`` from its own shard.
Hooks: see :mod:`raymodel.backends._trees`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from raymodel._internal.deps import require
from raymodel.backends._trees import TreeBackend, TreeRun
from raymodel.model import RayModel


class LightGBMBackend(TreeBackend):
    name = "lightgbm"
    extra = "lightgbm"
    packages = ("lightgbm",)
    booster_file = "model.txt"

    @classmethod
    def model_base(cls) -> type:
        return RayLightGBMModel

    def import_framework(self) -> None:
        require("lightgbm", "lightgbm")

    def train_loop(self) -> Callable[[dict[str, Any]], Any]:
        return lightgbm_train_loop

    def make_trainer(self, train_loop: Callable[[dict[str, Any]], Any], *, train_loop_config: dict[str, Any],
                     scaling_config: Any, run_config: Any, datasets: dict[str, Any] | None) -> Any:
        from ray.train.lightgbm import LightGBMTrainer

        return LightGBMTrainer(train_loop, train_loop_config=train_loop_config, scaling_config=scaling_config,
                               run_config=run_config, datasets=datasets or None)

    def load_booster(self, path: Path) -> Any:
        import lightgbm

        return lightgbm.Booster(model_file=str(path))

    def forward(self, model: RayModel, x: Any) -> Any:
        return self.trained_booster(model).predict(x)


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


def lightgbm_train_loop(loop_config: dict[str, Any]) -> dict[str, Any]:
    """``train_loop_per_worker``: one ``lightgbm.train`` over this worker's shard."""
    import lightgbm
    from ray.train.lightgbm import get_network_params

    tree = TreeRun(loop_config)
    run, model = tree.run, tree.run.model
    tree.wait(run.setup_model())
    tree.wait(run.restore())
    splits = run.splits()
    x, y = tree.shard(splits["train"])
    train_set = lightgbm.Dataset(x, label=y, free_raw_data=False)
    valid_sets, names = [train_set], ["train"]
    if "valid" in splits:
        vx, vy = tree.shard(splits["valid"])
        valid_sets.append(lightgbm.Dataset(vx, label=vy, reference=train_set))
        names.append("valid")
    params = {"verbosity": -1, **model.params}
    if run.world > 1:
        params = {"tree_learner": "data_parallel", "pre_partition": True, **params, **get_network_params()}
    done = len(run.history)
    tree.wait(run.hooks.call("before_fit"))

    def before_round(env: Any) -> None:
        tree.wait(run.hooks.call("before_epoch", done + env.iteration - env.begin_iteration + 1))

    def after_round(env: Any) -> None:
        model.booster = env.model
        tree.wait(tree.end_round(done + env.iteration - env.begin_iteration + 1, _metrics(env.evaluation_result_list)))

    before_round.before_iteration = True  # type: ignore[attr-defined]
    remaining = run.num_epochs - done
    if remaining > 0:
        model.booster = lightgbm.train(params, train_set, num_boost_round=remaining, valid_sets=valid_sets,
                                       valid_names=names, init_model=model.booster,
                                       callbacks=[before_round, after_round])
    return tree.wait(run.finish())


def _metrics(results: list[tuple[Any, ...]]) -> dict[str, float]:
    out: dict[str, float] = {}
    seen: dict[str, int] = {}
    for data_name, metric, value, *_ in results:
        prefix = "" if data_name == "train" else "val_"
        i = seen.get(data_name, 0)
        seen[data_name] = i + 1
        out[f"{prefix}loss" if i == 0 else f"{prefix}{metric}"] = float(value)
    return out
