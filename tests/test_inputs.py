"""Hardening, second pass: the inputs that reached a raw library error, bad data that was accepted,
the input signature recorded at training, and bounds on every numeric setting. No cluster here: the
signature over HTTP is in test_serve.py, after a real training job in test_model_server.py, and in
`predict_batch` in test_predict.py; random inputs are in test_properties.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from in_process import StoringSession
from models import DigitsNet, PairDataset, TinyNet

import raymodel as rm
from raymodel._internal.settings import LIMITS, MAX_RESOURCE
from raymodel._ray import cluster
from raymodel.exceptions import CheckpointError, DataError, ModelDefinitionError, RegistryError, SettingsError

TESTS = str(Path(__file__).parent)
SIGNATURE = {"shape": [4], "dtype": "float32", "nonfinite": "warn"}


def _saved(tmp_path: Path, **config) -> str:
    torch.manual_seed(0)
    model = TinyNet(config=config)
    model.ensure_setup()
    return model.save(tmp_path / "ckpt")


# ------------------------------------------------- 1. raymodel's errors, not the library's
@pytest.mark.parametrize(
    "config,parameter,shapes",
    [
        ({"hidden": 16}, "net.0.weight", "(8, 4) in the checkpoint and (16, 4) in the model"),
        ({"in_features": 5}, "net.0.weight", "(8, 4) in the checkpoint and (8, 5) in the model"),
        ({"classes": 3}, "net.2.weight", "(2, 8) in the checkpoint and (3, 8) in the model"),
    ],
)
def test_a_checkpoint_loaded_with_a_config_of_other_shapes_names_the_parameter(tmp_path, config, parameter, shapes):
    path = _saved(tmp_path)
    with pytest.raises(CheckpointError) as info:
        TinyNet.from_checkpoint(path, config=config)
    text = str(info.value)
    assert f"`{parameter}` has shape {shapes}" in text and path in text
    key, value = next(iter(config.items()))
    assert f"{key}={value!r} (checkpoint: " in text  # the config entry that made the difference


def test_load_weights_into_another_architecture_is_a_checkpoint_error(tmp_path):
    path = _saved(tmp_path)
    with pytest.raises(CheckpointError, match=r"`net.0.weight` has shape \(8, 4\) in the checkpoint and \(64, 64\)"):
        DigitsNet().load_weights(path)


@pytest.mark.parametrize("path", [None, 123, "", 1.5, ["a"]])
def test_a_checkpoint_path_that_is_not_a_path_is_named(path):
    with pytest.raises(CheckpointError, match=r"`path` must be a checkpoint folder or URI .* got "):
        rm.RayModel.from_checkpoint(path)
    with pytest.raises(CheckpointError, match="`path` must be"):
        TinyNet().load_weights(path)


def test_a_config_that_is_not_a_dict_or_that_setup_cannot_use(tmp_path):
    for config in ([1, 2], "abc", 3):
        with pytest.raises(SettingsError, match=r"`config` of `TinyNet` must be a dict"):
            TinyNet(config=config)
    with pytest.raises(SettingsError, match="`config` keys of `TinyNet` must be strings"):
        TinyNet(config={1: 2})
    with pytest.raises(SettingsError, match="`config` must be a dict of entries merged"):
        TinyNet.from_checkpoint(_saved(tmp_path), config=[("hidden", 3)])
    with pytest.raises(ModelDefinitionError) as info:
        TinyNet(config={"hidden": "abc"}).ensure_setup()
    assert "`TinyNet.setup(config)` failed with config" in str(info.value) and "'hidden': 'abc'" in str(info.value)
    assert isinstance(info.value.__cause__, TypeError)  # torch's own error stays the cause

    class Stops(TinyNet):  # a cause whose message ends its own sentence (transformers' OSErrors do)
        def setup(self, config):
            raise OSError("no such base.")

    with pytest.raises(ModelDefinitionError, match=r"OSError: no such base\. Check the config's values"):
        Stops().ensure_setup()


def test_a_file_where_a_key_folder_belongs_is_a_registry_error(tmp_path):
    registry = rm.registry.open(str(tmp_path / "registry"))
    model = TinyNet()
    registry.put(model, "digits")
    (tmp_path / "registry" / "other").write_text("not a folder")
    with pytest.raises(RegistryError) as info:
        registry.put(model, "other")
    assert "Not a directory" in str(info.value) and "registry/other" in str(info.value)
    assert "move it out of the registry" in str(info.value)
    assert [r.version for r in registry.list()] == [1]


_READ_ONLY_PUT = """
import sys
sys.path.insert(0, {tests!r})
import raymodel as rm
from models import TinyNet
try:
    rm.registry.open({root!r}).put(TinyNet(), "digits")
except Exception as exc:
    print(type(exc).__name__ + ": " + str(exc))
"""


def test_a_read_only_registry_is_a_registry_error_and_stays_intact():
    base = Path(tempfile.mkdtemp(prefix="raymodel-ro-", dir="/tmp"))
    try:
        root, home = base / "registry", base / "home"
        rm.registry.open(str(root)).put(TinyNet(), "digits")
        home.mkdir()
        for path in (base, home):
            path.chmod(0o777)
        for path in [root, *root.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        script = _READ_ONLY_PUT.format(tests=TESTS, root=str(root))
        command = [sys.executable, "-c", script]
        if os.geteuid() == 0:  # root writes anywhere: the put runs as nobody
            command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
        env = {**os.environ, "RAYMODEL_HOME": str(home), "HOME": str(home)}
        out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
        assert out.stdout.startswith("RegistryError: `put` failed in the registry"), out.stdout + out.stderr
        assert "Permission denied" in out.stdout and "may write" in out.stdout
        assert [r.version for r in rm.registry.open(str(root)).list()] == [1]
    finally:
        for path in [base, *base.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        shutil.rmtree(base)


@pytest.mark.parametrize(
    "metadata,fragment",
    [
        ([1, 2], "got [1, 2] that is a list"),
        ("abc", "got 'abc' that is a str"),
        ({"auc": math.nan}, "metadata['auc'] is nan"),
        ({"run": {"loss": math.inf}}, "metadata['run']['loss'] is inf"),
        ({"model": object()}, "metadata['model'] is a object"),
        ({"when": np.datetime64("2026-01-01")}, "metadata['when'] is a datetime64"),
        ({"scores": np.arange(3)}, "metadata['scores'] is a ndarray"),
        ({"auc": np.float32("nan")}, "metadata['auc'] is nan"),
        ({1: "a"}, "has the key 1 that is a int"),
    ],
)
def test_metadata_must_be_json(tmp_path, metadata, fragment):
    registry = rm.registry.open(str(tmp_path / "registry"))
    with pytest.raises(RegistryError) as info:
        registry.put(TinyNet(), "digits", metadata=metadata)
    assert fragment in str(info.value)
    assert registry.keys() == []
    ref = registry.put(
        TinyNet(), "digits", metadata={"note": "fine", "scores": [1, 2.5, None, True], "auc": np.float32(0.5)}
    )
    assert registry.show("digits", ref.version).metadata["auc"] == 0.5


# ----------------------------------------------------------------------- 2. bad data
@pytest.mark.parametrize(
    "data,fragment",
    [
        ({"train": []}, r"`data`\['train'\] is empty \(no batches\)"),
        ({"train": ([], [])}, "must have at least one row"),
        ({"train": np.empty((0, 4), np.float32)}, "must have at least one row"),
        ({"train": PairDataset(np.empty((0, 4), np.float32), np.empty(0, np.int64))}, "empty Dataset"),
        ({"train": torch.utils.data.DataLoader(PairDataset(np.empty((0, 4)), np.empty(0)))}, "is empty"),
    ],
)
def test_empty_training_data_is_refused_before_ray(monkeypatch, data, fragment):
    monkeypatch.setattr(cluster, "ensure_ray", lambda *a, **k: pytest.fail("Ray was touched"))
    with pytest.raises(DataError, match=fragment):
        TinyNet().train({"num_workers": 1, "progress": False}, data=data)


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, True, "0", None])
def test_the_data_helpers_check_their_seeds_like_train_settings(tiny, seed):
    import pandas as pd

    X, y = tiny
    bound = "`seed` must be an int from 0 to 4294967295"
    with pytest.raises(DataError, match=bound):
        rm.data.from_numpy(X, y, seed=seed)
    with pytest.raises(DataError, match=bound):
        rm.data.from_pandas(pd.DataFrame({"a": X[:, 0], "label": y}), label="label", seed=seed)
    with pytest.raises(DataError, match=bound):
        rm.data.shard_indices(10, 0, 2, shuffle=True, seed=seed, epoch=0, pad=True)
    with pytest.raises(DataError, match=bound):
        rm.data.worker_rows(10, 0, 2, train=True, shuffle=True, seed=seed)


def test_the_sharding_helpers_name_a_bad_rank_world_or_epoch():
    with pytest.raises(DataError, match="`rank` must be an int from 0 to 1"):
        rm.data.worker_rows(10, 2, 2, train=True)
    with pytest.raises(DataError, match="`world` must be an int >= 1"):
        rm.data.worker_rows(10, 0, 0, train=True)
    with pytest.raises(DataError, match="`epoch` must be an int from 0"):
        rm.data.worker_rows(10, 0, 1, train=True, epoch=-1)
    assert rm.data.worker_rows(10, 1, 2, train=True).tolist() == [1, 3, 5, 7, 9]


def test_a_label_listed_among_the_features_is_refused(tiny):
    import pandas as pd

    X, y = tiny
    frame = pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "label": y})
    with pytest.raises(DataError, match=r"`label='label'` is also listed in `features`.*a leak"):
        rm.data.from_pandas(frame, label="label", features=["a", "label"])
    assert rm.data.from_pandas(frame, label="label", features=["a", "b"]).splits["train"].x.shape[1] == 2


# ------------------------------------------------------------------ 3. the input signature
def test_the_data_knows_the_signature_of_its_inputs(tiny):
    X, y = tiny
    assert rm.data.from_numpy(X, y).signature == {"shape": [4], "dtype": "float32"}
    assert rm.data.resolve({"train": (X.reshape(16, 2, 2), y)}).signature == {"shape": [2, 2], "dtype": "float32"}
    assert rm.data.resolve({"train": PairDataset(X, y)}).signature == {"shape": [4], "dtype": "float32"}
    batches = [(torch.tensor(X[:8]), torch.tensor(y[:8])), (torch.tensor(X[8:]), torch.tensor(y[8:]))]
    assert rm.data.resolve({"train": batches}).signature == {"shape": [4], "dtype": "float32"}
    assert rm.data.resolve({"train": [{"x": X[:8]}]}).signature is None  # dict batches: none recorded


def test_the_signature_is_recorded_at_training_and_checked_before_forward(tmp_path, tiny):

    from raymodel.train import Trainable, WorkerRun
    from raymodel.train._driver import worker_payload

    X, y = tiny
    data = rm.data.from_numpy(X, y, valid_fraction=0)
    trainable = Trainable(TinyNet(), {"num_epochs": 1, "batch_size": 8, "nonfinite": "error"}, data=data)
    blob = worker_payload(trainable.model, trainable.settings, {**trainable._info, "path": str(tmp_path)})
    WorkerRun({"payload": blob, "data": data, "hub": None}, session=StoringSession(tmp_path)).run()
    checkpoint = tmp_path / "checkpoint_epoch_000001"
    manifest = json.loads((checkpoint / "raymodel.json").read_text())
    assert manifest["input_signature"] == {"shape": [4], "dtype": "float32", "nonfinite": "error"}

    model = rm.RayModel.from_checkpoint(checkpoint)
    assert len(model.predict(X[:3].tolist())) == 3
    with pytest.raises(DataError, match="^expected rows of 4 values, got 3$"):
        model.predict([[0.0, 1.0, 2.0]])
    with pytest.raises(DataError, match=r"expected rows of 4 values, got shape \(1, 2, 2\)"):
        model.predict([[[0.0, 1.0], [2.0, 3.0]]])
    with pytest.raises(DataError, match=r"1 NaN, None or infinite value\(s\) of 8; .*`nonfinite='error'`"):
        model.predict([[0.0, None, 2.0, 3.0], [0.0, 1.0, 2.0, 3.0]])  # None is NaN once cast
    with pytest.raises(DataError, match="the input is complex"):
        model.predict(X[:2].astype(np.complex64))
    again = model.save(tmp_path / "again")  # saving keeps it, and so does the registry (a copy of the folder)
    assert TinyNet.from_checkpoint(again).input_signature == manifest["input_signature"]


def _signed(nonfinite: str | None = None) -> TinyNet:
    model = TinyNet()
    model.ensure_setup()
    model.input_signature = dict(SIGNATURE) | ({"nonfinite": nonfinite} if nonfinite else {})
    return model


def test_nonfinite_inputs_warn_by_default():
    with pytest.warns(RuntimeWarning, match=r"1 NaN, None or infinite value\(s\) of 4; .*`nonfinite='warn'`"):
        _signed().predict([[0.0, math.inf, 1.0, 2.0]])


def test_nonfinite_inputs_pass_silently_with_allow_but_complex_ones_never_do():
    model = _signed("allow")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.predict([[0.0, math.nan, 1.0, 2.0]])
    with pytest.raises(DataError, match="the input is complex"):  # refused whatever the policy, as in training
        model.predict(torch.zeros((1, 4), dtype=torch.complex64))


class _Convolution(rm.RayTorchModel):
    def setup(self, config):
        self.features = torch.nn.Conv2d(3, 4, kernel_size=3)

    def configure_optimizers(self):
        return torch.optim.SGD(self.features.parameters(), lr=0.1)

    def forward(self, x):
        return self.features(x).mean((1, 2, 3))

    def train_step(self, batch):
        return self(batch[0]).sum()


def test_a_network_with_no_recorded_signature_checks_the_width_its_first_layer_takes():
    """Untrained, or built in code: no signature was recorded. The first layer `forward` reaches names
    the width it takes (not torch's `mat1 and mat2 shapes cannot be multiplied`)."""
    model = TinyNet()
    assert model.input_signature is None
    assert len(model.predict([[0.0, 1.0, 2.0, 3.0]])) == 1
    with pytest.raises(DataError, match=r"first layer: `net\.0` \(Linear\) takes 4 values a row, got 3"):
        model.predict([[0.0, 1.0, 2.0]])
    assert all(not layer._forward_pre_hooks for layer in model.net)  # the check leaves nothing behind
    conv = _Convolution()
    assert len(conv.predict(np.zeros((2, 3, 5, 5)).tolist())) == 2
    with pytest.raises(DataError, match=r"`features` \(Conv2d\) takes 3 channels, got 2 \(an input of shape"):
        conv.predict(np.zeros((1, 2, 5, 5)).tolist())


def test_a_network_with_no_recorded_signature_refuses_nan_unless_a_signature_allows_it():
    """NaN, None and infinity are refused (a network answers NaN for them); a recorded signature that
    allows them decides instead."""
    model = TinyNet()
    for bad in ([[0.0, None, 2.0, 3.0]], [[0.0, math.nan, 2.0, 3.0]], [[math.inf, 1.0, 2.0, 3.0]]):
        with pytest.raises(DataError, match=r"1 NaN, None or infinite value\(s\) of 4; a network answers NaN"):
            model.predict(bad)
    model.input_signature = dict(SIGNATURE, nonfinite="allow")
    assert np.isnan(model.predict([[0.0, math.nan, 2.0, 3.0]])).all()


def _booster(framework: str, X: np.ndarray, y: np.ndarray) -> Any:
    """A model of ``framework`` whose booster was trained here, in code (no signature recorded)."""
    if framework == "xgboost":
        import xgboost

        class Trees(rm.RayXGBoostModel):
            def setup(self, config):
                self.params = {"objective": "binary:logistic"}

        model = Trees()
        model.ensure_setup()
        model.booster = xgboost.train(model.params, xgboost.DMatrix(X, y), num_boost_round=2)
        return model
    import lightgbm

    class LightTrees(rm.RayLightGBMModel):
        def setup(self, config):
            self.params = {"objective": "binary", "verbosity": -1, "min_data_in_leaf": 1}

    model = LightTrees()
    model.ensure_setup()
    model.booster = lightgbm.train(model.params, lightgbm.Dataset(X, y), num_boost_round=2)
    return model


@pytest.mark.parametrize("framework", ["xgboost", "lightgbm"])
def test_a_booster_with_no_recorded_signature_checks_its_width(tiny, framework):
    X, y = tiny
    model = _booster(framework, X, y)
    assert len(model.predict(X[:2].tolist())) == 2
    with pytest.raises(DataError, match="^expected rows of 4 values, got 3$"):
        model.predict([[0.0, 1.0, 2.0]])


@pytest.mark.parametrize("framework", ["xgboost", "lightgbm"])
def test_a_booster_with_no_recorded_signature_takes_nan_as_a_missing_value(tiny, framework):
    X, y = tiny
    assert len(_booster(framework, X, y).predict([[0.0, math.nan, 2.0, 3.0]])) == 1  # trees handle it


def test_a_keras_model_with_no_recorded_signature_checks_its_input_shape():
    sys.path.insert(0, str(Path(TESTS).parent / "examples"))
    from keras_iris import KerasIris

    model = KerasIris()
    assert len(model.predict([[0.1, 0.2, 0.3, 0.4]])) == 1
    with pytest.raises(DataError, match="^expected rows of 4 values, got 3$"):
        model.predict([[0.1, 0.2, 0.3]])
    with pytest.raises(DataError, match="a network answers NaN"):
        model.predict([[0.1, math.nan, 0.3, 0.4]])


def test_a_declared_input_schema_wins_over_the_signature():
    class Declared(TinyNet):
        input_schema = {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}

        def preprocess(self, payload):
            return torch.tensor(payload, dtype=torch.float32)[:, :4]  # takes wider rows and cuts them

    model = Declared()
    model.ensure_setup()
    model.input_signature = dict(SIGNATURE)
    assert len(model.predict([[0.0] * 6])) == 1
    plain = TinyNet()
    plain.ensure_setup()
    plain.input_signature = dict(SIGNATURE)
    with pytest.raises(DataError, match="expected rows of 4 values, got 6"):
        plain.predict([[0.0] * 6])


# ----------------------------------------------------------------------- 4. absurd settings
def _numeric_settings() -> list[tuple[type, str]]:
    found = []
    for cls in (rm.TrainSettings, rm.TuneSettings, rm.ServeSettings):
        for field in dataclasses.fields(cls):
            if re.search(r"\b(int|float)\b", str(field.type)) or field.name in ("num_replicas", "ray_actor_options"):
                found.append((cls, field.name))
    return found


@pytest.mark.parametrize("cls,name", _numeric_settings(), ids=lambda v: getattr(v, "__name__", v))
def test_every_numeric_setting_has_an_upper_bound_that_the_error_names(cls, name):
    inside = {"resources_per_worker": "CPU", "ray_actor_options": "num_cpus"}  # resource dicts: each amount
    for absurd in (10**30, 1e30):
        with pytest.raises(SettingsError) as info:
            cls(**{name: {inside[name]: absurd} if name in inside else absurd})
        bound = re.search(rf"`{name}(?:\['\w+'\])?` must be .*?(?:to|<=) (\d+)", str(info.value))
        assert bound, str(info.value)
        assert int(bound.group(1)) == int(LIMITS.get(name, MAX_RESOURCE if name in inside else bound.group(1)))


def test_the_bounds_leave_real_use_alone():
    rm.TrainSettings(num_epochs=100_000, batch_size=65_536, priority=-5, resource_wait_s=3600, num_workers=(2, 512))
    rm.ServeSettings(max_body_bytes=1 << 30, num_replicas=64, batch_wait_timeout_s=0.5)
    rm.TuneSettings(num_samples=10_000, time_budget_s=30 * 86_400)
    with pytest.raises(SettingsError, match=r"`num_workers` as a range must be `\(min, max\)` with 1 <= min <= max"):
        rm.TrainSettings(num_workers=(1, 10**6))
    with pytest.raises(SettingsError, match="`priority` must be an int from -1000000 to 1000000"):
        rm.TrainSettings(priority=-(10**9))
