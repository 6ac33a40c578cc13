"""`WorkerRun`, the one lifecycle: run in-process where the logic allows, on Ray where it takes workers.

In-process runs use the real `WorkerRun` and the real torch loop with a session that stores
checkpoints the way Ray Train does (a copy under the run's folder), so the resume logic is tested
without a cluster; the integration tests stop real worker groups. A real worker killed and resumed,
with dropout, Adam and a learning-rate schedule restored whole, is the conformance suite's
(`conformance.py`, on `examples/torch_digits.py` and every other backend).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conformance import Counter, attempts, recorded
from in_process import StoringSession, run_in_process
from models import Recorder, TinyNet

import raymodel as rm
from raymodel.backends.torch import TorchBackend
from raymodel.backends.torch.loop import TorchLoop


class StopAt(rm.Callback):
    def __init__(self, epoch: int, rank: int = 0) -> None:
        self.epoch, self.rank = epoch, rank

    def after_epoch(self, epoch, metrics):
        if epoch == self.epoch and self.context.rank == self.rank:
            self.context.should_stop = True


def test_should_stop_ends_the_run_normally_with_a_final_checkpoint(tmp_path, tiny):
    X, y = tiny
    session = StoringSession(tmp_path)
    result = run_in_process(
        TinyNet(),
        {"num_epochs": 5, "checkpoint_every": 10, "batch_size": 4, "callbacks": [StopAt(2)]},
        rm.data.from_numpy(X, y),
        session,
        tmp_path,
    )
    assert [row["epoch"] for row in result["history"]] == [1, 2]
    assert [(m["epoch"], has_ckpt) for m, has_ckpt in session.reports] == [(1, False), (2, True)]
    manifest = json.loads((tmp_path / "checkpoint_epoch_000002" / "raymodel.json").read_text())
    assert manifest["epoch"] == 2


def test_resume_takes_the_newest_complete_checkpoint_not_the_one_ray_handed_back(tmp_path, tiny):
    X, y = tiny
    data = rm.data.from_numpy(X, y)
    log = tmp_path / "counter.jsonl"
    first = run_in_process(
        TinyNet(),
        {"num_epochs": 3, "batch_size": 4, "callbacks": [Counter(str(log))]},
        data,
        StoringSession(tmp_path),
        tmp_path,
    )
    # Epoch 3's upload was cut short (a file is missing); Ray's controller only saw epoch 1.
    (tmp_path / "checkpoint_epoch_000003" / "state" / "model.pt").unlink()
    session = StoringSession(tmp_path, handed_back=str(tmp_path / "checkpoint_epoch_000001"))
    calls = tmp_path / "calls"
    calls.mkdir()
    second = run_in_process(
        TinyNet(),
        {"num_epochs": 4, "batch_size": 4, "callbacks": [Counter(str(log)), Recorder(str(calls))]},
        data,
        session,
        tmp_path,
    )
    again = attempts(recorded(calls, 0))[0]
    assert again[:5] == ["before_setup", "after_setup", "on_load_checkpoint", "before_fit", "before_epoch(3)"]
    assert [row["epoch"] for row in second["history"]] == [1, 2, 3, 4]
    assert second["history"][:2] == first["history"][:2]  # the first two epochs came from the manifest
    # The callback's count continued from the checkpoint of epoch 2.
    assert [json.loads(line) for line in log.read_text().splitlines()] == [[1, 1], [2, 2], [3, 3], [3, 3], [4, 4]]


def test_a_backend_that_breaks_the_phase_order_is_stopped(tmp_path, tiny):
    class SkipsBeginEpoch(TorchLoop):
        async def run_epochs(self, first, last):
            await self.run.end_epoch(first, {"loss": 0.0})

    class Backend(TorchBackend):
        training = dataclasses.replace(TorchBackend.training, loop=SkipsBeginEpoch)

    class Net(TinyNet):
        backend = Backend()

    X, y = tiny
    with pytest.raises(RuntimeError, match="moved from `fit` to `epoch_end`"):
        run_in_process(Net(), {"num_epochs": 1}, rm.data.from_numpy(X, y), StoringSession(tmp_path), tmp_path)


@pytest.mark.integration
def test_any_worker_can_stop_the_run_and_all_stop_together(ray_session, tmp_path, tiny):
    X, y = tiny
    calls = tmp_path / "calls"
    calls.mkdir()
    result = TinyNet().train(
        {
            "num_workers": 2,
            "num_epochs": 6,
            "batch_size": 2,
            "checkpoint_every": 10,
            "progress": False,
            "callbacks": [StopAt(2, rank=1), Recorder(str(calls))],
        },
        data=rm.data.from_numpy(X, y),
    )
    assert [row["epoch"] for row in result.history] == [1, 2]
    assert result.checkpoint.endswith("checkpoint_epoch_000002")
    for rank in (0, 1):
        names = [call[0] for call in recorded(calls, rank)]
        assert names.count("before_epoch") == 2 and names[-1] == "after_fit", rank
    assert np.isfinite(result.metrics["loss"])
    # A local instance has no node to drain: Train V2 started no preemption watcher (`runtime.init`).
    from ray.util.state import list_actors

    assert not [a for a in list_actors(limit=10_000) if "PreemptionWatcher" in a.class_name]


def test_an_epochs_barrier_goes_through_the_frameworks_collective_when_it_has_one():
    """At a checkpoint's epoch end every rank waits for rank 0's upload: over torch.distributed where the
    run has it (a gather of nothing), not a round trip from every rank to Ray Train's synchronization actor."""
    from raymodel.train import Collective

    calls: list = []
    collective = Collective(None, 0, 2, broadcast=lambda value: value, barrier=lambda: calls.append("session"))
    collective.barrier()
    assert calls == ["session"]  # no collective of the framework's (XGBoost, Keras...): the session's barrier
    collective.native = lambda value: calls.append(("native", value)) or [value, value]
    collective.barrier()
    assert calls == ["session", ("native", None)]  # torch: every rank's nothing gathered, the session untouched
    alone = Collective(None, 0, 1, broadcast=lambda value: value, barrier=lambda: calls.append("session"))
    alone.barrier()
    assert len(calls) == 2  # one worker: nothing to wait for
