"""Batch inference over Ray Data: `model.predict_batch`, `rm.predict_batch(ref, ...)`, `raymodel predict`.

The equality of `predict_batch` and `predict` on every backend is in the conformance suite
(`conformance.py`); here: order, one load per actor, the input forms, references, the CLI, errors.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pandas as pd
import pytest
from models import Scaler

import raymodel as rm
from raymodel.cli import main as cli
from raymodel.contract import columns_of, features_of
from raymodel.exceptions import DataError

ACTOR = {"num_cpus": 0.25}


@pytest.mark.integration
def test_rows_keep_their_order_and_each_actor_loads_the_model_once(ray_session, tmp_path):
    log = tmp_path / "setups.log"
    # The first block's first batches sleep: the other actor finishes the later blocks first.
    model = Scaler(config={"log": str(log), "slow_below": 40})
    ids = np.arange(600)
    blocks = [
        pd.DataFrame({"id": ids[i : i + 100], "x": ids[i : i + 100] * 1.0, "noise": np.ones(100)})
        for i in range(0, 600, 100)
    ]
    import ray.data

    predictions = model.predict_batch(
        ray.data.from_pandas(blocks), batch_size=20, concurrency=2, keep_columns=["id"], **ACTOR
    )
    assert isinstance(predictions, ray.data.Dataset) and isinstance(predictions, rm.Predictions)
    out = predictions.to_pandas()
    assert out["id"].tolist() == ids.tolist()  # in the input's order, the kept column beside the predictions
    np.testing.assert_allclose(out["double"], 2.0 * ids)
    assert sorted(out.columns) == ["double", "id"]
    # 30 batches, 2 actors: each actor set the model up once (the driver once, to snapshot it).
    pids = [line for line in log.read_text().split() if line != str(os.getpid())]
    assert 1 <= len(set(pids)) <= 2 and len(pids) == len(set(pids)), pids


@pytest.mark.integration
def test_input_forms_references_and_the_cli(ray_session, tmp_path, registry, capsys):
    readers_before = _footer_readers()
    rows = np.column_stack([np.arange(40.0), np.zeros(40)]).astype(np.float32)
    doubler, tripler = Scaler(), Scaler(config={"factor": 3.0})
    expected = 2.0 * rows[:, 0]
    np.testing.assert_allclose(doubler.predict_batch(rows, **ACTOR).to_numpy("double"), expected)
    frame = pd.DataFrame({"id": np.arange(40) + 1000, "x": rows[:, 0], "noise": rows[:, 1]})
    np.testing.assert_allclose(
        doubler.predict_batch(frame, feature_columns=["x", "noise"], **ACTOR).to_numpy("double"), expected
    )
    folder = tmp_path / "features"
    folder.mkdir()
    frame.iloc[:25].to_parquet(folder / "part-0.parquet")
    frame.iloc[25:].to_parquet(folder / "part-1.parquet")
    frame.drop(columns="id").to_csv(tmp_path / "features.csv", index=False)

    # A registry alias is resolved once, when predict_batch is called: moving it later changes nothing.
    registry.put(doubler, key="scaler", alias="production")
    registry.put(tripler, key="scaler")
    lazy = rm.predict_batch("scaler@production", str(folder), keep_columns=["id"], **ACTOR)
    registry.set_alias("scaler", "production", 2)
    out = lazy.to_pandas().sort_values("id")
    np.testing.assert_allclose(out["double"], expected)
    np.testing.assert_allclose(
        rm.predict_batch("scaler", str(tmp_path / "features.csv"), **ACTOR).to_numpy("double"), 3.0 * rows[:, 0]
    )  # the newest version
    checkpoint = tripler.save(tmp_path / "checkpoint")
    np.testing.assert_allclose(rm.predict_batch(checkpoint, rows, **ACTOR).to_numpy("double"), 3.0 * rows[:, 0])
    # With a signature (rows of two, as training records it), rows of three are refused before `forward`:
    # a model instance's before any actor starts (from the data's schema), ...
    tripler.input_signature = {"shape": [2], "dtype": "float32", "nonfinite": "warn"}
    refused = r"`predict_batch` of `Scaler` \(columns .*\): expected rows of 2 values, got 3"
    with pytest.raises(DataError, match=refused):
        tripler.predict_batch(pd.DataFrame({"x": rows[:, 0], "noise": rows[:, 1], "more": rows[:, 1]}), **ACTOR)
    # ... and a checkpoint's (or a registry version's) by each actor, on its first batch
    signed = tripler.save(tmp_path / "signed")
    with pytest.raises(Exception, match=refused):
        rm.predict_batch(signed, np.zeros((8, 3), np.float32), **ACTOR).materialize()
    gc.collect()  # the failed execution's actor (0.25 CPU) ends when its exception's cycle is collected

    # The CLI: a registry version over a folder of Parquet files, to a new folder of Parquet files.
    target = tmp_path / "scores"
    assert (
        cli(
            [
                "predict",
                "scaler@production",
                "--input",
                str(folder),
                "--output",
                str(target),
                "--keep",
                "id",
                "--num-cpus",
                "0.25",
                "--batch-size",
                "16",
            ]
        )
        == 0
    )
    assert "wrote 40 predictions of scaler@production" in capsys.readouterr().out
    written = pd.read_parquet(target).sort_values("id")
    np.testing.assert_allclose(written["double"], 3.0 * rows[:, 0])  # production is version 2 now
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".raymodel-predict")]  # staging renamed away
    assert cli(["predict", "scaler", "--input", str(folder), "--output", str(target)]) == 1  # never overwrites
    assert "already exists and is not empty" in capsys.readouterr().err
    # Ray Data read the Parquet folder's footers (twice: `predict_batch`, the CLI) on 2 actors a read, not
    # its default 32 (each a process): `rm.init`'s local instance says so (`_RAY_DEFAULTS`).
    assert 0 < _footer_readers() - readers_before <= 4, _footer_readers() - readers_before


def _footer_readers() -> int:
    """How many of Ray Data's Parquet footer-reading actors this session's Ray has made, ended ones too."""
    from ray.util.state import list_actors

    made = list_actors(filters=[("class_name", "=", "FooterReader")], limit=10_000, raise_on_missing_output=False)
    return len(made)


def test_bad_input_is_refused_before_anything_starts(tmp_path, registry):
    model = Scaler()
    rows = np.ones((4, 2), dtype=np.float32)
    cases = [
        (dict(batch_size=0), rm.SettingsError, "`batch_size` must be"),
        (dict(concurrency=(3, 1)), rm.SettingsError, "`concurrency` must be"),
        (dict(num_cpus=-1), rm.SettingsError, "`num_cpus` must be"),
        (dict(num_cpus=0), rm.SettingsError, "needs some resource"),
        (dict(keep_columns="id"), rm.SettingsError, "`keep_columns` must be a list"),
        (dict(feature_columns=["x"], keep_columns=["x"]), rm.SettingsError, "in both"),
    ]
    for options, error, message in cases:
        with pytest.raises(error, match=message):
            model.predict_batch(rows, **options)
    with pytest.raises(rm.DataError, match="must be a ray.data.Dataset, a numpy array"):
        model.predict_batch([[1.0, 2.0]])
    with pytest.raises(rm.DataError, match="does not exist"):
        model.predict_batch(str(tmp_path / "nowhere.parquet"))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("x")
    with pytest.raises(rm.DataError, match="must hold .parquet or .csv files"):
        model.predict_batch(str(tmp_path / "notes"))
    with pytest.raises(rm.RegistryError, match="scaler"):
        rm.predict_batch("scaler@production", rows)
    with pytest.raises(rm.CheckpointError):
        rm.predict_batch(str(tmp_path / "notes"), rows)  # a path, but not a checkpoint
    with pytest.raises(rm.SettingsError, match="takes a model, a registry reference"):
        rm.predict_batch(42, rows)


def test_the_array_defaults():
    batch = {"a": np.arange(3), "b": np.ones((3, 2))}
    np.testing.assert_array_equal(features_of(batch), [[0, 1, 1], [1, 1, 1], [2, 1, 1]])
    image = {"pixels": np.zeros((3, 8, 8))}
    assert features_of(image).shape == (3, 8, 8)  # one tensor column keeps its shape
    with pytest.raises(rm.DataError, match="Column 'name' holds .* not numbers.*feature_columns"):
        features_of({"name": np.array(["a", "b"]), "x": np.ones(2)})
    assert set(columns_of({"p": np.ones(2), "q": [1, 2]})) == {"p", "q"}
    import torch

    assert columns_of(torch.ones(2, 3))["prediction"].shape == (2, 3)
