"""The hook list, its dispatch, and the exact order on real Ray workers."""

from __future__ import annotations

import asyncio
import json

import pytest
from models import AsyncRankLossNet, RankLossNet, Recorder

import raymodel as rm
from raymodel.exceptions import HookError
from raymodel.hooks import CALLBACK_HOOK_NAMES, HOOK_NAMES, HookRunner, ModelHooks, is_default


def test_every_hook_is_declared_once_as_a_documented_no_op():
    assert len(set(HOOK_NAMES)) == len(HOOK_NAMES)
    for name in HOOK_NAMES:
        fn = getattr(ModelHooks, name)
        assert fn.__doc__, f"{name} has no docstring"
    assert all(n.startswith(("before_", "after_", "on_")) for n in CALLBACK_HOOK_NAMES)


def _plus_one_then_kept(calls: list) -> tuple[rm.RayModel, rm.Callback]:
    """A model whose ``before_batch`` adds 1, and a callback whose ``before_batch`` keeps the batch (``None``)."""

    class Model(rm.RayModel):
        def before_batch(self, batch, batch_idx):
            calls.append(("model", batch))
            return batch + 1

    class Cb(rm.Callback):
        async def before_batch(self, batch, batch_idx):
            calls.append(("cb", batch))
            return None

    return Model(), Cb()


def test_the_runner_skips_the_hooks_nobody_overrode():
    model, cb = _plus_one_then_kept([])
    runner = HookRunner(model, [cb])
    assert runner.has("before_batch") and not runner.has("after_batch")
    assert is_default(model, "after_batch") and not is_default(model, "before_batch")


def test_before_batch_runs_the_model_then_each_callback_whose_none_keeps_the_batch():
    calls: list = []
    model, cb = _plus_one_then_kept(calls)
    runner = HookRunner(model, [cb])
    assert asyncio.run(runner.before_batch(1, 0)) == 2
    assert calls == [("model", 1), ("cb", 2)]
    assert cb.model is model


def test_a_failing_hook_is_wrapped_with_its_name():
    class Cb(rm.Callback):
        def after_epoch(self, epoch, metrics):
            raise RuntimeError("boom")

    runner = HookRunner(rm.RayModel(), [Cb()])
    with pytest.raises(HookError, match=r"Cb\.after_epoch.*RuntimeError: boom") as info:
        asyncio.run(runner.call("after_epoch", 1, {}))
    assert isinstance(info.value.__cause__, RuntimeError)


def _expected(epochs: int, batches: int, rank: int) -> list[list]:
    seq = [["before_setup"], ["after_setup"], ["before_fit"]]
    for epoch in range(1, epochs + 1):
        seq.append(["before_epoch", epoch])
        for i in range(batches):
            seq += [["before_batch", i], ["after_batch", i]]
        seq += [["before_validation"], ["after_validation", ["val_rank"]], ["after_epoch", epoch, ["loss", "val_rank"]]]
        if rank == 0:
            seq.append(["on_save_checkpoint"])
    seq.append(["after_fit", epochs])
    return seq


@pytest.mark.integration
@pytest.mark.parametrize("model_cls", [RankLossNet, AsyncRankLossNet], ids=["sync", "async"])
def test_hook_order_and_metrics_averaged_over_all_workers(ray_session, tmp_path, tiny, model_cls):
    X, y = tiny  # 12 train rows, 4 valid rows; 2 workers x 6 rows = 2 batches of 3 each
    data = rm.data.from_numpy(X, y, valid_fraction=0.25)
    settings = rm.TrainSettings(num_workers=2, num_epochs=2, batch_size=3, callbacks=[Recorder(str(tmp_path))])
    result = model_cls().train(settings, data=data)

    for rank in (0, 1):
        lines = (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in lines] == _expected(2, 2, rank), f"rank {rank}"

    # Worker r's loss is r and its validation metric is r: the history holds the
    # mean over both workers (0.5), not rank 0's value (0.0).
    assert [row["epoch"] for row in result.history] == [1, 2]
    for row in result.history:
        assert row["loss"] == pytest.approx(0.5)
        assert row["val_rank"] == pytest.approx(0.5)
    assert result.metrics == result.history[-1]
