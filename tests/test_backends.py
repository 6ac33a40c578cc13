"""The five built-in backends through the one conformance suite (`conformance.py`).

A backend joins the suite with its line in `CASES`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from conformance import Case, install

import raymodel as rm

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

CASES = [
    Case.example(
        "torch",
        "torch_digits",
        payload=lambda rows: {"pixels": rows.tolist()},
        numbers=lambda answer: answer["digit"],
        batch_numbers=lambda columns: columns["prediction"].argmax(1),
    ),
    Case.example("lightning", "lightning_digits"),
    Case.example("tensorflow", "keras_iris"),
    Case.example("xgboost", "xgboost_breast_cancer"),
    Case.example("lightgbm", "lightgbm_breast_cancer"),
]
install(globals(), CASES)


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
            for case in CASES:
                name = case.backend
                assert f'backend == "{name}"' not in text and f'backend.name == "{name}"' not in text, path


@pytest.mark.integration
@pytest.mark.after("test_a_used_pool_trains_exactly_as_a_fresh_one[lightning]")  # on that case's idle pool
def test_lightnings_own_boring_model_trains_unchanged(ray_session):
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    class Boring(rm.RayLightningModel):
        def setup(self, config):
            return BoringModel()  # Lightning's own test model, not a line changed

    model = Boring()
    result = model.train(
        {"num_workers": 2, "num_epochs": 2, "batch_size": 8, "progress": False},
        data={"train": RandomDataset(32, 64), "valid": RandomDataset(32, 16)},
    )
    assert [row["epoch"] for row in result.history] == [1, 2]
    assert np.isfinite(result.history[-1]["loss"])
    assert np.asarray(model.predict(np.ones((3, 32), dtype=np.float32))).shape == (3, 2)
