"""Models shared by the tests (pickled to workers by value, like a user's module)."""

from __future__ import annotations

import asyncio
import json
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import BaseModel

import raymodel as rm


class TinyNet(rm.RayTorchModel):
    default_config = {"hidden": 8, "lr": 0.05, "in_features": 4, "classes": 2}

    def setup(self, config):
        self.net = nn.Sequential(
            nn.Linear(config["in_features"], config["hidden"]),
            nn.ReLU(),
            nn.Linear(config["hidden"], config["classes"]),
        )

    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=self.config["lr"])

    def forward(self, x):
        return self.net(x)

    def train_step(self, batch):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch):
        x, y = batch
        logits = self(x)
        return {"val_loss": F.cross_entropy(logits, y), "val_acc": (logits.argmax(1) == y).float().mean()}


class PairDataset(torch.utils.data.Dataset):
    """A torch ``Dataset`` of ``(x, y)`` pairs."""

    def __init__(self, X, y):
        self.X, self.y = torch.tensor(X), torch.tensor(y)

    def __len__(self):
        return len(self.X)

    def __getitem__(self, i):
        return self.X[i], self.y[i]


class DigitsNet(TinyNet):
    default_config = {"hidden": 64, "lr": 3e-3, "in_features": 64, "classes": 10}

    def configure_optimizers(self):
        return torch.optim.Adam(self.net.parameters(), lr=self.config["lr"])

    def preprocess(self, payload):
        return torch.tensor(payload["pixels"], dtype=torch.float32)

    def postprocess(self, output):
        return {"digit": output.argmax(-1).tolist()}


class Recorder(rm.Callback):
    """Appends every hook call of its worker to `<dir>/rank<r>.jsonl`."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def _log(self, name, *args):
        with open(os.path.join(self.directory, f"rank{self.context.rank}.jsonl"), "a") as fh:
            fh.write(json.dumps([name, *args]) + "\n")

    def before_setup(self):
        self._log("before_setup")

    def after_setup(self):
        self._log("after_setup")

    def before_fit(self):
        self._log("before_fit")

    def before_epoch(self, epoch):
        self._log("before_epoch", epoch)

    def before_batch(self, batch, batch_idx):
        self._log("before_batch", batch_idx)

    def after_batch(self, batch_idx, outputs):
        self._log("after_batch", batch_idx)

    def before_validation(self):
        self._log("before_validation")

    def after_validation(self, metrics):
        self._log("after_validation", sorted(metrics))

    def after_epoch(self, epoch, metrics):
        self._log("after_epoch", epoch, sorted(metrics))

    def on_save_checkpoint(self, state):
        self._log("on_save_checkpoint")

    def on_load_checkpoint(self, state):
        self._log("on_load_checkpoint")

    def after_fit(self, result):
        self._log("after_fit", len(result["history"]))


class RankLossNet(rm.RayTorchModel):
    """Its loss on worker r is exactly r, and its validation metric is r: so the
    history shows whether metrics were averaged over every worker or taken from rank 0."""

    def setup(self, config):
        self.w = nn.Linear(4, 1)
        self.calls = []

    def configure_optimizers(self):
        return torch.optim.SGD(self.w.parameters(), lr=0.0)

    def _rank(self):
        import ray.train

        return float(ray.train.get_context().get_world_rank())

    def train_step(self, batch):
        (x, y) = batch
        return self.w(x).sum() * 0.0 + self._rank()

    def validation_step(self, batch):
        return {"rank": torch.tensor(self._rank())}


class AsyncRankLossNet(RankLossNet):
    """The same, with `async def` steps and hooks."""

    async def train_step(self, batch):
        await asyncio.sleep(0)
        return RankLossNet.train_step(self, batch)

    async def validation_step(self, batch):
        await asyncio.sleep(0)
        return RankLossNet.validation_step(self, batch)

    async def before_epoch(self, epoch):
        await asyncio.sleep(0)


class ManualNet(TinyNet):
    """Manual optimization: the step zeroes, back-propagates and steps itself."""

    automatic_optimization = False

    def train_step(self, batch):
        x, y = batch
        opt = self.optimizers()
        opt.zero_grad()
        loss = F.cross_entropy(self(x), y)
        self.manual_backward(loss)
        opt.step()
        return {"loss": loss}


class WeightsReporter(rm.Callback):
    """Writes each worker's final weights checksum to `<dir>/weights<r>.txt`."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def after_fit(self, result):
        import ray.train

        rank = ray.train.get_context().get_world_rank()
        total = sum(float(p.double().sum()) for p in self.model.net.parameters())
        with open(os.path.join(self.directory, f"weights{rank}.txt"), "w") as fh:
            fh.write(repr(total))


class FailOnce(rm.Callback):
    """Raises in epoch `epoch` of the first attempt (a marker file remembers it)."""

    def __init__(self, marker: str, epoch: int) -> None:
        self.marker, self.epoch = marker, epoch

    def before_epoch(self, epoch):
        if epoch == self.epoch and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            raise RuntimeError("simulated worker crash")


class Scaler(rm.RayTorchModel):
    """`double = factor * x` for the first feature column; notes each setup's pid in `config["log"]`
    and sleeps on the batches whose `x` is below `slow_below` (so the first block finishes last)."""

    default_config = {"factor": 2.0, "log": None, "slow_below": -1.0}

    def setup(self, config):
        self.net = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            self.net.weight.copy_(torch.tensor([[config["factor"], 0.0]]))

    def after_setup(self):
        if self.config["log"]:
            with open(self.config["log"], "a") as fh:
                fh.write(f"{os.getpid()}\n")

    def forward(self, x):
        if float(x[:, 0].min()) < self.config["slow_below"]:
            import time

            time.sleep(1.0)
        return self.net(x)

    def predict_batch_postprocess(self, output):
        return {"double": output[:, 0].numpy()}


class Pixels(BaseModel):
    pixels: list[list[float]]


class Digits(BaseModel):
    digit: list[int]


class TypedDigitsNet(DigitsNet):
    """Declares its request and response bodies with pydantic; a request of 3 rows gets a response that
    breaks the output schema (a stand-in for a bug in postprocess)."""

    input_schema = Pixels
    output_schema = Digits

    def preprocess(self, payload):
        return torch.tensor(payload.pixels, dtype=torch.float32)

    def postprocess(self, output):
        digits = output.argmax(-1).tolist()
        return {"digit": ["seven"] * 3} if len(digits) == 3 else Digits(digit=digits)


class RowsNet(TinyNet):
    """Declares its request body as a JSON Schema dict: rows of exactly 4 numbers."""

    input_schema = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "array", "items": {"type": "number"}, "minItems": 4, "maxItems": 4},
    }


def digits_data():
    """scikit-learn's digits, a fifth held out: the data of jobs by reference (`--data models:digits_data`)."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return rm.data.from_numpy((X / 16.0).astype(np.float32), y, valid_fraction=0.2)


_FITTED: dict[str, torch.Tensor] = {}


def digits_version(seed: int) -> DigitsNet:
    """Version ``seed`` of a registry's `digits`: a DigitsNet fit here for a moment (60 full-batch Adam
    steps, about 1 s), then moved by seeded noise, so versions answer alike mostly but not always; and
    no job that starts from scratch (its config's seed) could give these weights back."""
    model = DigitsNet(config={"seed": 0})
    model.ensure_setup()
    if not _FITTED:
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        x, t = torch.tensor((X / 16.0).astype(np.float32)), torch.tensor(y)
        optimizer = torch.optim.Adam(model.net.parameters(), lr=0.01)
        for _ in range(60):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model.net(x), t).backward()
            optimizer.step()
        _FITTED.update({k: v.detach().clone() for k, v in model.net.state_dict().items()})
    model.net.load_state_dict(_FITTED)
    noise = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.net.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=noise))
    return model


class SlowNet(TinyNet):
    """``TinyNet`` whose every training step sleeps ``step_s`` (default 0.2 s): epochs long enough to
    kill something in the middle of one."""

    default_config = {**TinyNet.default_config, "step_s": 0.2}

    def train_step(self, batch):
        import time

        time.sleep(self.config["step_s"])
        return super().train_step(batch)


class FlakyDigits(DigitsNet):
    """A candidate that fails every third request it answers (its `postprocess` raises: a 500)."""

    calls = 0

    def postprocess(self, output):
        FlakyDigits.calls += 1
        if FlakyDigits.calls % 3 == 0:
            raise RuntimeError("flaky candidate")
        return super().postprocess(output)


class DigitsData:
    """A data module: `setup(config)` runs on each worker and returns the splits (`--data models:DigitsData`
    names the class; raymodel instantiates it, as Lightning does a DataModule)."""

    def setup(self, config):
        return digits_data()


class NoConfigData:
    """A data module whose `setup` takes no config: refused at submit."""

    def setup(self):
        return digits_data()


class PathData(DigitsData):
    """A data module class that needs an argument: `--data models:PathData` cannot instantiate it."""

    def __init__(self, path):
        self.path = path
