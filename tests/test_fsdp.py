"""``strategy="fsdp"``: sharded weights, sharded checkpoints that resume on any number of workers,
whole models where whole ones are needed (issue 29). Real Ray Train workers, gloo, no mocks."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import requests
import torch
import torch.nn as nn
import torch.nn.functional as F
from conformance import CrashOnce
from models import ManualNet, TinyNet

import raymodel as rm
from raymodel._internal import tmp
from raymodel.backends.torch.fsdp import shard_units
from raymodel.exceptions import ModelDefinitionError, SettingsError

#: Two workers, Adam (optimizer state to shard), gradient accumulation and clipping on.
BASE = {
    "num_workers": 2,
    "batch_size": 4,
    "num_epochs": 4,
    "accumulate_grad_batches": 2,
    "grad_clip_norm": 0.5,
    "shuffle": True,
    "progress": False,
}


class AdamNet(TinyNet):
    default_config = {**TinyNet.default_config, "hidden": 16, "lr": 0.02}

    def configure_optimizers(self):
        return torch.optim.Adam(self.net.parameters(), lr=self.config["lr"])


class Shares(rm.Callback):
    """Each worker writes the parameters it holds and the whole model's count (`<folder>/<rank>.json`)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def after_fit(self, result):
        from torch.distributed.tensor import DTensor

        params = list(self.model.net.parameters())
        held = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params)
        row = {"held": held, "total": sum(p.numel() for p in params), "dtensor": isinstance(params[0], DTensor)}
        with open(os.path.join(self.folder, f"{self.context.rank}.json"), "w") as fh:
            json.dump(row, fh)


def _losses(result, key="loss"):
    return [row[key] for row in result.history]


# ------------------------------------------------------------------ no cluster
def test_fsdp_settings_are_checked_before_ray(tiny_data):
    with pytest.raises(SettingsError, match="strategy"):
        rm.TrainSettings(strategy="zero3")
    with pytest.raises(SettingsError, match="num_workers=1"):
        rm.TrainSettings(strategy="fsdp", num_workers=0)
    with pytest.raises(SettingsError, match="bf16-mixed"):
        rm.TrainSettings(strategy="fsdp", precision="16-mixed", use_gpu=True)
    with pytest.raises(SettingsError, match="one-worker trial"):
        rm.TuneSettings(train={"strategy": "fsdp", "num_workers": 1})
    import raymodel.backends.xgboost as xgb

    class Trees(xgb.RayXGBoostModel):
        def setup(self, config):
            self.params = {"objective": "binary:logistic"}

    with pytest.raises(SettingsError, match="torch and lightning"):
        Trees().train({"strategy": "fsdp", "num_workers": 2}, data=tiny_data, wait=False)


def test_shard_units_default_to_the_children_that_hold_parameters():
    net = TinyNet()
    net.ensure_setup()
    modules = {"net": net.net}
    assert shard_units(net, modules) == [net.net[0], net.net[2]]  # the ReLU holds nothing


def test_shard_units_a_model_names_must_be_submodules_of_its_modules():
    class Named(TinyNet):
        def shard_modules(self):
            return [self.net[0], nn.Linear(2, 2)]

    named = Named()
    named.ensure_setup()
    with pytest.raises(ModelDefinitionError, match="submodules of the modules"):
        shard_units(named, {"net": named.net})


# ------------------------------------------------------------------ real Ray
# First of the runs: on the idle Lightning pool test_data.py's last test leaves (the torch runs below
# share one of their own).
@pytest.mark.integration
def test_lightning_fsdp_trains_on_two_workers_and_resumes_after_a_kill(ray_session, tiny, tmp_path):
    import pytorch_lightning as pl

    shares = tmp_path / "shares"
    shares.mkdir()

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))

        def on_train_start(self):  # what this worker holds of the 114 parameters, under which strategy
            held = sum(p.numel() for p in self.trainer.strategy.model.parameters())
            row = {"strategy": type(self.trainer.strategy).__name__, "held": held}
            (shares / f"{self.global_rank}.json").write_text(json.dumps(row))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.02)

    class LitNet(rm.RayLightningModel):
        def setup(self, config):
            return Module()

        def shard_modules(self):
            return [self.module.net[0], self.module.net[2]]

    X, y = tiny
    data = (np.tile(X, (4, 1)), np.tile(y, 4))
    settings = {**BASE, "accumulate_grad_batches": 1, "grad_clip_norm": None, "strategy": "fsdp"}
    whole = LitNet()
    plain = whole.train(settings, data=data)
    crash = CrashOnce(str(tmp_path / "crash"), rank=1, epoch=3)
    model = LitNet()
    resumed = model.train({**settings, "max_failures": 1, "callbacks": [crash]}, data=data)
    assert (tmp_path / "crash").exists()
    assert [row["epoch"] for row in resumed.history] == [1, 2, 3, 4]
    np.testing.assert_allclose(_losses(resumed), _losses(plain), rtol=1e-5)
    for rank in (0, 1):
        row = json.loads((shares / f"{rank}.json").read_text())
        assert row["strategy"] == "_RayFSDP" and row["held"] <= 0.6 * 114, row
    np.testing.assert_allclose(model.predict(X), whole.predict(X), atol=1e-5)


@pytest.fixture(scope="module")
def runs(ray_session, tiny_data, tmp_path_factory):
    """On one pool: DDP, FSDP (each worker's share noted), DDP again; manual optimization both ways."""
    shares = tmp_path_factory.mktemp("shares")
    out = {}
    for name, cls, settings in [
        ("ddp", AdamNet, {}),
        ("fsdp", AdamNet, {"strategy": "fsdp", "callbacks": [Shares(str(shares))]}),
        ("ddp_after", AdamNet, {}),
        ("manual_ddp", ManualNet, {"accumulate_grad_batches": 1}),
        ("manual_fsdp", ManualNet, {"accumulate_grad_batches": 1, "strategy": "fsdp"}),
    ]:
        model = cls()
        out[name] = (model, model.train({**BASE, **settings}, data=tiny_data))
    out["shares"] = [json.loads((shares / f"{rank}.json").read_text()) for rank in (0, 1)]
    return out


@pytest.mark.integration
def test_fsdp_holds_half_on_each_worker_and_trains_like_ddp(runs):
    for share in runs["shares"]:
        assert share["dtensor"] and share["held"] <= 0.6 * share["total"]
    assert sum(s["held"] for s in runs["shares"]) == runs["shares"][0]["total"]
    ddp, fsdp = runs["ddp"][1], runs["fsdp"][1]
    np.testing.assert_allclose(_losses(fsdp), _losses(ddp), rtol=1e-5)  # accumulation and clipping too
    np.testing.assert_allclose(_losses(fsdp, "val_loss"), _losses(ddp, "val_loss"), rtol=1e-5)
    np.testing.assert_allclose(_losses(runs["manual_fsdp"][1]), _losses(runs["manual_ddp"][1]), rtol=1e-5)
    assert runs["ddp_after"][1].history == ddp.history  # the pool's FSDP job left nothing behind
    assert len([p for p in rm.jobs.pools() if p.backend == "torch" and p.num_workers == 2]) == 1


@pytest.mark.integration
def test_bf16_mixed_fsdp_trains_and_keeps_float32_weights(ray_session, tiny_data):
    model = AdamNet()
    result = model.train({**BASE, "strategy": "fsdp", "precision": "bf16-mixed", "num_epochs": 3}, data=tiny_data)
    losses = _losses(result)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    manifest = json.loads(open(os.path.join(result.checkpoint, "raymodel.json")).read())
    saved = torch.load(tmp.root() / "whole" / f"{manifest['manifest_sha256']}.pt", weights_only=True)
    assert saved and all(t.dtype == torch.float32 for t in saved.values())  # the shards themselves, as written


@pytest.mark.integration
def test_a_sharded_run_resumes_on_one_worker_and_back_on_two_like_ddp(ray_session, tiny_data):
    """2 -> 1 -> 2 workers under one run name: DCP reshards weights and Adam's state on load; each
    leg continues exactly as DDP does from its (whole) checkpoint."""
    histories = {}
    for workers, epochs in ((2, 2), (1, 3), (2, 4)):  # both runs leg by leg: two pool switches, not five
        for strategy in ("ddp", "fsdp"):
            settings = {**BASE, "strategy": strategy, "num_workers": workers, "num_epochs": epochs}
            histories[strategy] = AdamNet().train({**settings, "name": f"resize-{strategy}"}, data=tiny_data).history
    assert [row["epoch"] for row in histories["fsdp"]] == [1, 2, 3, 4]
    np.testing.assert_allclose(_losses_of(histories["fsdp"]), _losses_of(histories["ddp"]), rtol=1e-5)


def _losses_of(history):
    return [row["loss"] for row in history]


# From here on, work that ends the idle pool (a one-off run, Ray Data's actors, a replica): after the
# tests that train on it, each cold start of a pool is ~10 s on 2 cores.
@pytest.mark.integration
def test_a_killed_worker_resumes_to_the_uninterrupted_model(runs, tiny_data, tiny, tmp_path):
    """A one-off Ray Train run (``pool=False``): Ray Train restarts the group, the shards reload."""
    X, _ = tiny
    crash = CrashOnce(str(tmp_path / "crash"), rank=1, epoch=3)
    model = AdamNet()
    settings = {**BASE, "strategy": "fsdp", "pool": False, "max_failures": 1, "callbacks": [crash]}
    result = model.train(settings, data=tiny_data)
    assert (tmp_path / "crash").exists()
    assert [row["epoch"] for row in result.history] == [1, 2, 3, 4]
    np.testing.assert_allclose(model.predict(X), runs["fsdp"][0].predict(X), atol=1e-6)


@pytest.mark.integration
def test_a_sharded_checkpoint_lists_every_shard_and_loads_whole_once(runs, tiny, registry):
    X, _ = tiny
    model, result = runs["fsdp"]
    files = json.loads(open(os.path.join(result.checkpoint, "raymodel.json")).read())["files"]
    assert {"state/sharded/__0_0.distcp", "state/sharded/__1_0.distcp", "state/sharded/.metadata"} <= set(files)
    assert not os.path.exists(os.path.join(result.path, ".shards"))  # the shards' way to rank 0, cleared
    expected = runs["ddp"][0].predict(X)
    np.testing.assert_allclose(model.predict(X), expected, atol=1e-5)  # the driver's instance, loaded whole
    manifest = json.loads(open(os.path.join(result.checkpoint, "raymodel.json")).read())
    cache = tmp.root() / "whole" / f"{manifest['manifest_sha256']}.pt"
    assert cache.is_file()
    written = cache.stat().st_mtime_ns
    np.testing.assert_allclose(rm.RayModel.from_checkpoint(result.checkpoint).predict(X), expected, atol=1e-5)
    assert cache.stat().st_mtime_ns == written  # consolidated once, then read
    rm.registry.put(result, key="sharded")  # the sharded checkpoint itself, copied
    np.testing.assert_allclose(rm.registry.get("sharded").predict(X), expected, atol=1e-5)
    scored = rm.predict_batch("sharded", X, num_cpus=0.25).to_numpy("prediction")  # a Ray Data actor loads it
    by_first = lambda a: a[np.argsort(a[:, 0])]  # noqa: E731 - blocks may come back in any order
    np.testing.assert_allclose(by_first(np.asarray(scored)), by_first(np.asarray(expected)), atol=1e-5)
    app = model.serve("/fsdp", settings={"ray_actor_options": {"num_cpus": 0.25}})
    try:
        answer = requests.post(app.url, json=X[:4].tolist(), timeout=60)
        assert answer.status_code == 200
        np.testing.assert_allclose(answer.json(), expected[:4], atol=1e-5)
    finally:
        app.shutdown()
