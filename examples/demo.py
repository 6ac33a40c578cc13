"""`make demo`: the digits model of the quickstart, end to end on a local Ray.

1. train on 2 workers (DDP) with early stopping, 2. tune with ASHA, 3. register
the tuned model, load it back, 4. serve that over HTTP and send real requests.
The learning curves and the trials are saved as PNGs under demo-output/.
"""

from __future__ import annotations

import sys
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))

from digits import DigitsNet, load_data

import raymodel as rm


def main() -> None:
    X, y = load_data()
    data = rm.data.from_numpy(X, y, valid_fraction=0.2)
    valid = data.splits["valid"]
    rm.init(num_cpus=2)
    out = Path("demo-output")

    print("\n== 1. train: 2 workers, DDP ==")
    model = DigitsNet(config={"hidden": 128, "lr": 3e-3})
    stop = rm.callbacks.EarlyStopping("val_loss", patience=2, min_delta=0.005)
    result = model.train(rm.TrainSettings(num_workers=2, num_epochs=10, batch_size=32, callbacks=[stop]), data=data)
    print(f"final validation accuracy: {result.metrics['val_acc']:.4f}   checkpoint: {result.checkpoint}")
    result.plot(out / "train_curves.png")
    print(f"learning curves: {out / 'train_curves.png'}")

    print("\n== 2. tune: ASHA over hyperparameter_space(), 8 trials ==")
    tuned = model.tune(
        settings=rm.TuneSettings(
            num_samples=8,
            metric="val_loss",
            mode="min",
            max_epochs=8,
            grace_period=2,
            train={"batch_size": 32, "resources_per_worker": {"CPU": 0.95}},
        ),
        data=data,
    )
    print(f"best config: {tuned.best_config}")
    print(f"best validation accuracy: {tuned.best_metrics['val_acc']:.4f}")
    tuned.plot(out / "tune_trials.png")
    print(f"every trial's curve: {out / 'tune_trials.png'}")

    print("\n== 3. registry: put the tuned model, load it back ==")
    ref = rm.registry.put(tuned, key="digits", alias="production")
    print(f"registered {ref}; versions of `digits`: {[(r.version, r.aliases) for r in rm.registry.list('digits')]}")
    loaded = rm.registry.get("digits", "production")

    print("\n== 4. serve the registry's model over HTTP ==")
    app = loaded.serve("/digits", settings={"ray_actor_options": {"num_cpus": 0.5}})
    print(f"serving at {app.url}")
    for rows in ([0], [1, 2, 3]):
        payload = {"pixels": valid.x[rows].tolist()}
        answer = requests.post(app.url, json=payload, timeout=60)
        print(
            f"POST {app.url} {len(rows)} image(s) -> {answer.status_code} {answer.json()}   "
            f"(true: {valid.y[rows].tolist()})"
        )
    bad = requests.post(app.url, json={"pixel": []}, timeout=60)
    print(f"POST {app.url} {{'pixel': []}} -> {bad.status_code} {bad.json()}")
    print(f"GET {app.url}/info -> {requests.get(app.url + '/info', timeout=60).json()}")
    app.shutdown()
    print("\ndone.")


if __name__ == "__main__":
    main()
