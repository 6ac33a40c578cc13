"""Data adapters: every accepted form trains, shards are disjoint, loading overlaps compute."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch
from models import PairDataset, TinyNet

import raymodel as rm
from raymodel.data import aprefetch, prefetch, shard_indices
from raymodel.data._loading import round_robin


def test_from_numpy_splits_rows_once_and_reproducibly(tiny):
    X, y = tiny
    a, b = rm.data.from_numpy(X, y, valid_fraction=0.25, seed=3), rm.data.from_numpy(X, y, valid_fraction=0.25, seed=3)
    assert len(a.splits["train"]) == 12 and len(a.splits["valid"]) == 4
    np.testing.assert_array_equal(a.splits["valid"].x, b.splits["valid"].x)
    rows = np.concatenate([a.splits["train"].x, a.splits["valid"].x])
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, X.tolist()))
    assert "valid" not in rm.data.from_numpy(X, None, valid_fraction=0).splits


def test_from_pandas_uses_the_label_column(tiny):
    import pandas as pd

    X, y = tiny
    df = pd.DataFrame(X, columns=list("abcd")).assign(target=y)
    spec = rm.data.from_pandas(df, label="target", valid_fraction=0.25)
    assert spec.splits["train"].x.shape == (12, 4)
    with pytest.raises(rm.DataError, match="`label='nope'` is not a column"):
        rm.data.from_pandas(df, label="nope")


@pytest.mark.parametrize("n,world", [(10, 2), (11, 2), (7, 3)])
def test_training_shards_are_equal_sized_and_cover_every_row(n, world):
    shards = [shard_indices(n, r, world, shuffle=True, seed=0, epoch=1, pad=True) for r in range(world)]
    assert len({len(s) for s in shards}) == 1  # DDP needs equal batch counts
    assert set(np.concatenate(shards)) == set(range(n))
    valid = [shard_indices(n, r, world, shuffle=False, seed=0, epoch=0, pad=False) for r in range(world)]
    assert sorted(np.concatenate(valid).tolist()) == list(range(n))  # every row exactly once


def test_round_robin_gives_every_worker_the_same_number_of_batches():
    got = [list(round_robin(range(7), r, 3)) for r in range(3)]
    assert got == [[0, 3], [1, 4], [2, 5]]


def test_prefetch_overlaps_loading_with_compute():
    def slow_source():
        for i in range(8):
            time.sleep(0.05)  # loading
            yield i

    start = time.perf_counter()
    for _ in prefetch(slow_source()):
        time.sleep(0.05)  # compute
    overlapped = time.perf_counter() - start
    assert overlapped < 8 * 0.1 * 0.8, f"took {overlapped:.2f}s: loading did not overlap compute"


def test_prefetch_reraises_errors_of_the_source():
    def broken():
        yield 1
        raise KeyError("row 7")

    with pytest.raises(KeyError, match="row 7"):
        list(prefetch(broken()))


def test_async_prefetch_overlaps_an_async_source_with_async_steps():
    class Source:
        def __aiter__(self):
            return self._gen()

        async def _gen(self):
            for i in range(6):
                await asyncio.sleep(0.05)
                yield i

    async def consume():
        out = []
        async for item in aprefetch(Source()):
            await asyncio.sleep(0.05)
            out.append(item)
        return out

    start = time.perf_counter()
    assert asyncio.run(consume()) == list(range(6))
    assert time.perf_counter() - start < 6 * 0.1 * 0.8


# ------------------------------------------------------------------ adapters
class AsyncBatches:
    def __init__(self, X, y, batch_size=4):
        self.X, self.y, self.bs = torch.tensor(X), torch.tensor(y), batch_size

    def __aiter__(self):
        return self._gen()

    async def _gen(self):
        for i in range(0, len(self.X), self.bs):
            await asyncio.sleep(0)
            yield self.X[i : i + self.bs], self.y[i : i + self.bs]


class TinyDataModule:
    """Builds its splits on the worker, from the model config."""

    def __init__(self, X, y):
        self.X, self.y = X, y

    def setup(self, config):
        assert "hidden" in config
        return {"train": PairDataset(self.X[:12], self.y[:12]), "valid": AsyncBatches(self.X[12:], self.y[12:])}


def _adapters(X, y):
    import pandas as pd

    batches = [(torch.tensor(X[i : i + 4]), torch.tensor(y[i : i + 4])) for i in range(0, 16, 4)]
    df = pd.DataFrame(X, columns=list("abcd")).assign(label=y)
    return {
        "dict_of_tuples": {"train": (X[:12], y[:12]), "valid": (X[12:], y[12:])},
        "from_pandas": rm.data.from_pandas(df, label="label", valid_fraction=0.25),
        "torch_dataset": PairDataset(X, y),
        "list_of_batches": {"train": batches, "valid": batches[:1]},
        "async_iterable": {"train": AsyncBatches(X, y), "valid": AsyncBatches(X[:4], y[:4])},
        "data_module": TinyDataModule(X, y),
    }


@pytest.mark.integration
@pytest.mark.parametrize("kind", list(_adapters(np.zeros((16, 4)), np.zeros(16)).keys()))
def test_each_adapter_trains(ray_session, tiny, kind):
    X, y = tiny
    data = _adapters(X, y)[kind]
    result = TinyNet().train({"num_workers": 0, "num_epochs": 2, "batch_size": 4, "progress": False}, data=data)
    assert [row["epoch"] for row in result.history] == [1, 2]
    assert np.isfinite(result.history[-1]["loss"])
    if kind != "torch_dataset":
        assert "val_acc" in result.history[-1]


@pytest.mark.integration
def test_a_runs_arrays_reach_the_workers_as_one_object_in_rays_store(ray_session, tiny):
    """Every in-memory split goes to Ray's object store in one ``ray.put`` (each costs about a millisecond
    on a small job's path), and each worker gets back exactly the arrays it was given."""
    from raymodel.data._splits import InStore, resolve

    X, y = tiny
    spec = resolve({"train": (X[:12], y[:12]), "valid": (X[12:], y[12:])})
    shipped = spec.for_workers()
    parts = [getattr(split, p) for split in shipped.splits.values() for p in ("x", "y")]
    assert all(isinstance(p, InStore) for p in parts) and len({p.ref for p in parts}) == 1
    back = shipped.materialize({})
    for got, want in zip(
        [getattr(back[n], p) for n in ("train", "valid") for p in ("x", "y")], [X[:12], y[:12], X[12:], y[12:]]
    ):
        np.testing.assert_array_equal(got, want)
    assert shipped.for_workers().splits["train"].x == parts[0]  # already in the store: not put again


@pytest.mark.integration
def test_ray_data_dataset_trains_on_a_worker(ray_session, tiny):
    import ray.data

    X, y = tiny
    ds = ray.data.from_items([{"x": X[i], "y": int(y[i])} for i in range(len(X))])

    class DictNet(TinyNet):
        def train_step(self, batch):
            return torch.nn.functional.cross_entropy(self(batch["x"]), batch["y"])

    result = DictNet().train({"num_workers": 1, "num_epochs": 2, "batch_size": 4}, data={"train": ds})
    assert [row["epoch"] for row in result.history] == [1, 2]


@pytest.mark.parametrize("n,world", [(10, 2), (11, 2), (7, 3)])
def test_one_sharding_policy_for_rows_samplers_and_batches(n, world):
    from raymodel.backends.torch.loop import ShardSampler
    from raymodel.data import worker_rows
    from raymodel.data._loading import worker_batches

    train = [worker_rows(n, r, world, train=True, shuffle=True, seed=1, epoch=2) for r in range(world)]
    assert len({len(t) for t in train}) == 1 and set(np.concatenate(train)) == set(range(n))
    valid = [worker_rows(n, r, world, train=False, shuffle=True, seed=1, epoch=2) for r in range(world)]
    assert sorted(np.concatenate(valid).tolist()) == list(range(n))  # every validation row exactly once
    samplers = [ShardSampler(n, r, world, train=True, shuffle=True, seed=1) for r in range(world)]
    for s in samplers:
        s.set_epoch(2)
    assert [list(s) for s in samplers] == [t.tolist() for t in train]  # the torch Sampler is the same policy
    assert [list(worker_batches(range(n), r, world, train=False)) for r in range(world)] == [
        list(range(r, n, world)) for r in range(world)
    ]


@pytest.mark.parametrize(
    "example,data_kind",
    [
        ("lightning_digits", "async_iterable"),
        ("keras_iris", "torch_dataset"),
        ("xgboost_breast_cancer", "list_of_batches"),
        ("lightgbm_breast_cancer", "torch_dataset"),
    ],
)
def test_every_backend_checks_the_data_form_on_the_driver(monkeypatch, tiny, example, data_kind):
    import importlib
    import sys
    from pathlib import Path

    from raymodel._ray import cluster

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    model = next(
        v
        for v in vars(importlib.import_module(example)).values()
        if isinstance(v, type) and issubclass(v, rm.RayModel) and v.__module__ == example
    )()
    monkeypatch.setattr(cluster, "ensure_ray", lambda *a, **k: pytest.fail("Ray was touched"))
    X, y = tiny
    kind = {"async_iterable": "async batches", "torch_dataset": "torch dataset", "list_of_batches": "batches"}
    with pytest.raises(rm.DataError, match=f"The {model.backend.name} backend does not train on {kind[data_kind]}"):
        model.train({"num_workers": 2}, data=_adapters(X, y)[data_kind])


@pytest.mark.integration
def test_ray_data_dataset_trains_lightning_too(ray_session, tiny):
    import pytorch_lightning as pl
    import ray.data

    X, y = tiny
    train = ray.data.from_items([{"x": X[i], "y": int(y[i])} for i in range(12)])
    valid = ray.data.from_items([{"x": X[i], "y": int(y[i])} for i in range(12, 16)])

    class DictModule(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.cross_entropy(self(batch["x"].float()), batch["y"])

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.nn.functional.cross_entropy(self(batch["x"].float()), batch["y"]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class DictLightning(rm.RayLightningModel):
        def setup(self, config):
            return DictModule()

    result = DictLightning().train(
        {"num_workers": 2, "num_epochs": 2, "batch_size": 4, "progress": False}, data={"train": train, "valid": valid}
    )
    assert [row["epoch"] for row in result.history] == [1, 2]
    assert np.isfinite(result.history[-1]["val_loss"])
