"""Dropping down to Ray: the wrappers behind the verbs hand you Ray's own objects.

    python examples/native_ray.py

1. `rm.Trainable(...).as_trainer()`: the native Ray Train `TorchTrainer`, fit by Ray itself.
2. `rm.Tunable(...).as_trainable()`: a Tune trainable under your own `tune.Tuner` and scheduler.
3. `rm.Servable("digits@production", ...).as_application()`: a Serve application for `serve.run`
   (or `serve run examples.native_ray:app`, or a Serve config file).
"""

from __future__ import annotations

import sys
from pathlib import Path

import requests
from ray import serve, tune
from ray.tune.schedulers import ASHAScheduler

sys.path.insert(0, str(Path(__file__).resolve().parent))

from digits import DigitsNet, load_data

import raymodel as rm


def main() -> None:
    X, y = load_data()
    data = rm.data.from_numpy(X, y, valid_fraction=0.2)
    rm.init(num_cpus=2)

    print("\n== 1. a native Ray Train trainer ==")
    trainer = rm.Trainable(DigitsNet(), {"num_workers": 2, "num_epochs": 3, "progress": False}, data=data).as_trainer()
    print(f"{type(trainer).__module__}.{type(trainer).__name__}")
    result = trainer.fit()  # Ray's own Result; its checkpoints are raymodel checkpoints
    model = rm.RayModel.from_checkpoint(result.checkpoint.path)
    print(f"Ray's result: {result.metrics['val_acc']=:.4f}; restored {type(model).__name__}")

    print("\n== 2. a Tune trainable under your own Tuner and ASHA ==")
    trainable = rm.Tunable(
        DigitsNet(), data=data, settings={"train": {"resources_per_worker": {"CPU": 0.95}}}
    ).as_trainable()
    grid = tune.Tuner(
        trainable,
        param_space={"hidden": 64, "lr": tune.grid_search([1e-4, 1e-3, 1e-2]), "train.num_epochs": 4},
        tune_config=tune.TuneConfig(
            scheduler=ASHAScheduler(time_attr="epoch", metric="val_loss", mode="min", max_t=4, grace_period=1)
        ),
    ).fit()
    best = grid.get_best_result("val_loss", "min")
    print(f"best lr {best.config['lr']}: val_loss {best.metrics['val_loss']:.4f} after {best.metrics['epoch']} epochs")
    rm.registry.put(rm.RayModel.from_checkpoint(best.metrics["checkpoint_path"]), key="digits", alias="production")

    print("\n== 3. a Serve application from the registry ==")
    serve.run(rm.Servable("digits@production", "/native").as_application(), name="native", route_prefix="/native")
    answer = requests.post("http://127.0.0.1:8000/native", json={"pixels": X[:3].tolist()}, timeout=60)
    print(f"POST /native -> {answer.status_code} {answer.json()} (served by {answer.headers['x-raymodel-model']})")
    serve.delete("native")


if __name__ == "__main__":
    main()
