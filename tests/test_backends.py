"""One conformance suite for all five backends: the same promises, whatever the framework.

For each backend's example model: train on 2 workers (recording every hook) ->
one history row per epoch and the example's accuracy -> the hook order that
backend documents -> a checkpoint restored in a fresh process predicts the
same -> tune 4 trials with ASHA -> serve one HTTP request -> registry round trip.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import requests

import raymodel as rm

from models import Recorder

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

BACKENDS = {
    "torch": "torch_digits",
    "lightning": "lightning_digits",
    "tensorflow": "keras_iris",
    "xgboost": "xgboost_breast_cancer",
    "lightgbm": "lightgbm_breast_cancer",
}
TREES = {"xgboost", "lightgbm"}
TRIAL = {"resources_per_worker": {"CPU": 0.95}}


def payload(backend: str, rows: np.ndarray):
    return {"pixels": rows.tolist()} if backend == "torch" else rows.tolist()


def collapsed(calls: list[list]) -> list[str]:
    """Hook names, with each epoch's run of before_batch/after_batch pairs folded into `batches`."""
    out: list[str] = []
    for call in calls:
        name = call[0] if call[0] not in ("before_batch", "after_batch") else "batches"
        if name == "batches" and out and out[-1] == "batches":
            continue
        out.append(f"{name}({call[1]})" if name in ("before_epoch", "after_epoch") else name)
    return out


def expected_hooks(backend: str, rank: int, epochs: int) -> list[str]:
    seq = ["before_setup", "after_setup", "before_fit"]
    for epoch in range(1, epochs + 1):
        if backend in TREES:  # no batches and no separate validation pass
            seq += [f"before_epoch({epoch})", "after_validation", f"after_epoch({epoch})"]
        else:
            seq += [f"before_epoch({epoch})", "batches", "before_validation", "after_validation",
                    f"after_epoch({epoch})"]
        if rank == 0:
            seq.append("on_save_checkpoint")
    return seq + ["after_fit"]


@pytest.fixture(scope="module", params=list(BACKENDS))
def trained(request, ray_session, tmp_path_factory):
    backend = request.param
    example = importlib.import_module(BACKENDS[backend])
    calls = tmp_path_factory.mktemp(f"hooks-{backend}")
    model, result, data = example.train(callbacks=[Recorder(str(calls))], progress=False)  # the example's epochs
    return backend, example, model, result, data, calls


@pytest.mark.integration
def test_train_history_hooks_and_accuracy(trained):
    backend, example, model, result, data, calls = trained
    assert model.backend.name == backend
    epochs = len(result.history)
    assert epochs >= 3 and [row["epoch"] for row in result.history] == list(range(1, epochs + 1))
    assert all("loss" in row and "val_loss" in row for row in result.history)
    for rank in (0, 1):
        recorded = [json.loads(line) for line in (calls / f"rank{rank}.jsonl").read_text().splitlines()]
        assert collapsed(recorded) == expected_hooks(backend, rank, epochs), f"{backend} rank {rank}"
    assert example.accuracy(model, data) >= example.MIN_ACCURACY


@pytest.mark.integration
def test_checkpoint_predicts_the_same_in_a_fresh_process(trained):
    backend, example, model, result, data, _ = trained
    rows = data.splits["valid"].x[:8]
    code = textwrap.dedent("""
        import json, sys
        import raymodel as rm
        model = rm.RayModel.from_checkpoint(sys.argv[1])
        print(json.dumps(model.predict(json.loads(sys.stdin.read()))))
    """)
    out = subprocess.run([sys.executable, "-c", code, result.checkpoint], input=json.dumps(payload(backend, rows)),
                         capture_output=True, text=True, check=True)
    again = json.loads(out.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(np.asarray(_numbers(again)), np.asarray(_numbers(model.predict(payload(backend, rows)))),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.integration
def test_tune_serve_and_registry(trained):
    backend, example, model, result, data, _ = trained
    tuned_model = type(model)()
    tuned = tuned_model.tune(data=data, settings={"num_samples": 4, "max_epochs": 2, "grace_period": 1,
                                                  "reduction_factor": 2, "train": {**TRIAL, "batch_size": 32},
                                                  "progress": False})
    assert tuned.num_trials == 4 and len(tuned.dataframe()) == 4
    assert set(tuned_model.hyperparameter_space()) <= set(tuned.best_config)

    rows = data.splits["valid"].x[:3]
    app = tuned_model.serve(f"/conformance-{backend}", settings={"ray_actor_options": {"num_cpus": 0.25}})
    try:
        answer = requests.post(app.url, json=payload(backend, rows), timeout=60)
        assert answer.status_code == 200
        np.testing.assert_allclose(np.asarray(_numbers(answer.json())),
                                   np.asarray(_numbers(tuned_model.predict(payload(backend, rows)))), rtol=1e-5,
                                   atol=1e-6)
    finally:
        app.shutdown()

    reg = rm.registry.open(str(Path(result.path).parent.parent / f"registry-{backend}"))
    ref = reg.put(tuned, key=backend)
    loaded = reg.get(backend, ref.version)
    assert type(loaded).__name__ == type(model).__name__ and loaded.config == tuned.best_config
    np.testing.assert_allclose(np.asarray(_numbers(loaded.predict(payload(backend, rows)))),
                               np.asarray(_numbers(tuned_model.predict(payload(backend, rows)))), rtol=1e-5, atol=1e-6)


def test_a_missing_framework_names_the_extra(monkeypatch):
    from raymodel.backends.xgboost import XGBoostBackend
    from raymodel.exceptions import MissingDependencyError

    monkeypatch.setitem(sys.modules, "xgboost", None)  # what an uninstalled package looks like to import
    with pytest.raises(MissingDependencyError, match=r"pip install 'raymodel\[xgboost\]'"):
        XGBoostBackend().import_framework()
    monkeypatch.setitem(sys.modules, "tf_keras", None)
    from raymodel.backends.tensorflow import TensorflowBackend

    with pytest.raises(MissingDependencyError, match=r"pip install 'raymodel\[tensorflow\]'"):
        TensorflowBackend().import_framework()


def test_drivers_never_ask_which_backend_they_hold():
    root = Path(rm.__file__).parent
    for folder in ("train", "tune", "serve", "registry"):
        for path in (root / folder).glob("*.py"):
            text = path.read_text()
            for name in BACKENDS:
                assert f'backend == "{name}"' not in text and f"backend.name == \"{name}\"" not in text, path


def _numbers(value):
    return value["digit"] if isinstance(value, dict) and "digit" in value else value


@pytest.mark.integration
def test_lightnings_own_boring_model_trains_unchanged(ray_session):
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    class Boring(rm.RayLightningModel):
        def setup(self, config):
            return BoringModel()  # Lightning's own test model, not a line changed

    model = Boring()
    result = model.train({"num_workers": 2, "num_epochs": 2, "batch_size": 8, "progress": False},
                         data={"train": RandomDataset(32, 64), "valid": RandomDataset(32, 16)})
    assert [row["epoch"] for row in result.history] == [1, 2]
    assert np.isfinite(result.history[-1]["loss"])
    assert np.asarray(model.predict(np.ones((3, 32), dtype=np.float32))).shape == (3, 2)
