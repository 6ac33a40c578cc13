"""The conformance suite: the same promises for every backend, whatever the framework.

A backend joins it with one `Case` in a test module that calls `install(globals(), [case, ...])`
(`test_backends.py` for the built-in seven, `test_sixth_backend.py` for one defined in a test file).
For each case:

* train (on 2 workers: the first job of a fresh pool), recording every hook -> one history row per
  epoch, the case's accuracy, the exact hook order that the backend declares (`Backend.calls`), and
  the run's checkpoint loaded anew predicts what the trained instance does;
* the same run again on that pool, after another job: the same history and model (rtol 1e-6);
* resume, proven by fault injection: a worker (the case's `crash_rank`) exits its process for real
  at the start of epoch 3 of the first attempt (`max_failures=1`, `checkpoint_every=1`); the second
  attempt loads the checkpoint, begins at epoch 3, the history holds every epoch once, a callback's
  state went on from the checkpoint, and the final model equals the uninterrupted run's;
* tune 2 trials with ASHA (one after the other, in one trial actor that Tune reuses), serve: one
  HTTP answer and a 422 for a malformed request, and a registry round trip;
* the run's checkpoint, loaded by `predict_batch`'s Ray Data actors (fresh processes that never
  imported the model's module; several blocks, one actor: `test_predict` checks the order across
  several), predicts what the trained instance does, row by row, in order.

A check that does not apply to a backend is declared in its case (`not_applicable`: the check's
name in `CHECKS`, and why); the test then skips with that reason, in the report. A case that names
a check not in `CHECKS`, or gives no reason, fails on import.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import requests
import shared_runs
from models import Recorder

import raymodel as rm
from raymodel.jobs._request import pool_kind

TRIAL = {"resources_per_worker": {"CPU": 0.95}}
CRASH_EPOCH = 3

#: The checks a case may declare not applicable, each with what it promises.
CHECKS = {
    "used_pool": "a used pool trains exactly as a fresh one",
    "same_model_after_resume": "a resumed run ends with the uninterrupted run's model and last row",
}


def _valid_rows(data: Any, n: int) -> np.ndarray:
    return np.asarray(data.splits["valid"].x[:n], dtype=np.float32)


def _one_feature_short(rows: Any) -> Any:
    return np.asarray(rows)[:, :-1].tolist()


def _blocks(rows: Any) -> Any:
    import ray.data

    return ray.data.from_numpy(np.array_split(np.asarray(rows), 6))  # 6 blocks, 2 actors: order is at stake


@dataclasses.dataclass
class Case:
    """One backend in the suite: how to train its example, score it and ask it over HTTP."""

    backend: str
    train: Callable[..., tuple[Any, Any, Any]]  # train(**settings) -> (model, result, data)
    accuracy: Callable[[Any, Any], float]
    min_accuracy: float
    payload: Callable[[np.ndarray], Any] = lambda rows: rows.tolist()
    numbers: Callable[[Any], Any] = lambda answer: answer
    #: `predict_batch`'s output columns as the numbers `numbers` takes from a `predict` answer.
    batch_numbers: Callable[[dict], Any] = lambda columns: columns["prediction"]
    #: `n` input rows of the case's data (what `payload` and `table` take).
    rows: Callable[[Any, int], Any] = _valid_rows
    #: A request the route must answer with a 422 (made from rows).
    bad_payload: Callable[[Any], Any] = _one_feature_short
    #: The rows as a `ray.data` Dataset of several blocks, for `predict_batch`.
    table: Callable[[Any], Any] = _blocks
    #: The ranks that record hooks, and the one that crashes (a run of one actor: rank 0).
    ranks: tuple[int, ...] = (0, 1)
    crash_rank: int = 1
    #: The backend sets the instance up on the driver (transformers: its tokenizer tokenizes the data),
    #: so every run starts from the instance's weights: `on_load_checkpoint` follows `after_setup`.
    set_up_on_driver: bool = False
    #: How far the figures the final checkpoint is scored with (one worker, the whole validation split)
    #: may be from its last epoch's.
    scored_abs: float = 1e-5
    #: The run the killed-worker test interrupts (``train``'s signature): the case's own unless given, or
    #: a cheaper one of as many epochs where the case's learns more than that test checks.
    train_interrupted: Callable[..., tuple[Any, Any, Any]] | None = None
    #: The model the Tune test tunes: a new instance of the trained model's class unless given.
    tuned: Callable[[], Any] | None = None
    #: The trials' training settings.
    tune_train: dict[str, Any] = dataclasses.field(default_factory=lambda: {**TRIAL, "batch_size": 32})
    #: The job the used-pool test runs in between on the case's pool, when not one of the case's own: another
    #: backend's of the same pool kind (a Lightning job on workers that ran a torch job).
    between: Callable[[], Any] | None = None
    #: Another module checks the same training: the run is kept for it (``shared_runs``, as
    #: ``conformance:<backend>``; only where one reads it, since a kept model keeps what it holds).
    shared: bool = False
    #: Checks of `CHECKS` that do not apply to this backend: name -> why.
    not_applicable: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.not_applicable) - set(CHECKS))
        assert not unknown, f"case {self.backend!r}: {unknown} are not checks of the suite ({sorted(CHECKS)})"
        unexplained = sorted(k for k, why in self.not_applicable.items() if len(why.split()) < 4)
        assert not unexplained, f"case {self.backend!r}: say why {unexplained} do not apply"
        # Another run than the case's own has no uninterrupted twin to end as.
        assert self.train_interrupted is None or "same_model_after_resume" in self.not_applicable, self.backend

    def unless_not_applicable(self, check: str) -> None:
        """Skip the test, with the case's reason, when ``check`` does not apply to this backend."""
        if check in self.not_applicable:
            pytest.skip(f"{self.backend}: {CHECKS[check]}: does not apply: {self.not_applicable[check]}")

    @classmethod
    def example(cls, backend: str, module: str, **kwargs: Any) -> Case:
        """A case from one of `examples/` (`train`, `accuracy`, `MIN_ACCURACY`)."""
        example = importlib.import_module(module)
        return cls(backend, example.train, example.accuracy, example.MIN_ACCURACY, **kwargs)


class CrashOnce(rm.Callback):
    """Rank `rank` exits its process for real (no exception, no cleanup) at `before_epoch(epoch)`
    of the first attempt only: a marker file remembers that it happened."""

    def __init__(self, marker: str, rank: int = 1, epoch: int = CRASH_EPOCH) -> None:
        self.marker, self.rank, self.epoch = marker, rank, epoch

    def before_epoch(self, epoch):
        if epoch == self.epoch and self.context.rank == self.rank and not os.path.exists(self.marker):
            Path(self.marker).touch()
            os._exit(1)


class Counter(rm.Callback):
    """Counts epochs; its count is state that must survive a restart (rank 0 logs `[epoch, count]`)."""

    def __init__(self, log: str) -> None:
        self.log, self.seen = log, 0

    def after_epoch(self, epoch, metrics):
        self.seen += 1
        if self.context.rank == 0:
            with open(self.log, "a") as fh:
                fh.write(json.dumps([epoch, self.seen]) + "\n")

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state):
        self.seen = state["seen"]


def collapsed(calls: list[list]) -> list[str]:
    """Hook names, with each epoch's run of before_batch/after_batch pairs folded into `batches`."""
    out: list[str] = []
    for call in calls:
        name = call[0] if call[0] not in ("before_batch", "after_batch") else "batches"
        if name == "batches" and out and out[-1] == "batches":
            continue
        out.append(f"{name}({call[1]})" if name in ("before_epoch", "after_epoch") else name)
    return out


def attempts(calls: list[list]) -> list[list[str]]:
    """The recorded calls of one worker, split into one list per attempt (each starts with setup)."""
    runs: list[list[list]] = []
    for call in calls:
        if call[0] == "before_setup":
            runs.append([])
        runs[-1].append(call)
    return [collapsed(run) for run in runs]


def expected_hooks(backend: Any, rank: int, last: int, first: int = 1, loads: bool = False) -> list[str]:
    """The documented order, for the hooks this backend declares it calls (``loads``: the run resumes,
    or starts from the instance's weights)."""
    seq = ["before_setup", "after_setup", *(["on_load_checkpoint"] if loads else []), "before_fit"]
    for epoch in range(first, last + 1):
        seq.append(f"before_epoch({epoch})")
        if backend.calls("before_batch") or backend.calls("after_batch"):
            seq.append("batches")
        seq += [h for h in ("before_validation", "after_validation") if backend.calls(h)] + [f"after_epoch({epoch})"]
        if rank == 0:
            seq.append("on_save_checkpoint")
    return seq + ["after_fit"]


def recorded(directory: Path, rank: int) -> list[list]:
    return [json.loads(line) for line in (directory / f"rank{rank}.jsonl").read_text().splitlines()]


def close(case: Case, a: Any, b: Any) -> None:
    np.testing.assert_allclose(
        np.asarray(case.numbers(a), dtype=float), np.asarray(case.numbers(b), dtype=float), rtol=1e-5, atol=1e-6
    )


def install(namespace: dict[str, Any], cases: list[Case]) -> None:
    """Define the suite's fixture and tests in a test module, one parameter per case."""
    by_name = {case.backend: case for case in cases}

    @pytest.fixture(scope="module", params=list(by_name))
    def trained(request, ray_session, tmp_path_factory):
        case = by_name[request.param]
        calls = tmp_path_factory.mktemp(f"hooks-{case.backend}")
        rm.jobs.release_pools()  # this run is the first job of a fresh pool
        model, result, data = case.train(callbacks=[Recorder(str(calls))], progress=False)  # the case's epochs
        if case.shared:
            shared_runs.RUNS[f"conformance:{case.backend}"] = (model, result, data)
        return case, model, result, data, calls

    @pytest.mark.integration
    def test_train_history_hooks_and_accuracy(trained):
        case, model, result, data, calls = trained
        assert model.backend.name == case.backend
        epochs = len(result.history)
        assert epochs >= CRASH_EPOCH and [row["epoch"] for row in result.history] == list(range(1, epochs + 1))
        validates = model.backend.calls("after_validation")  # a backend with no validation split says so
        assert all("loss" in row and ("val_loss" in row or not validates) for row in result.history)
        for rank in case.ranks:
            expected = expected_hooks(model.backend, rank, epochs, loads=case.set_up_on_driver)
            assert collapsed(recorded(calls, rank)) == expected, f"rank {rank}"
        assert not (calls / f"rank{max(case.ranks) + 1}.jsonl").exists(), "a rank the case does not name"
        assert case.accuracy(model, data) >= case.min_accuracy
        payload = case.payload(case.rows(data, 16))  # the checkpoint round trip
        close(case, rm.RayModel.from_checkpoint(result.checkpoint).predict(payload), model.predict(payload))

    @pytest.mark.integration
    def test_a_used_pool_trains_exactly_as_a_fresh_one(trained, tmp_path):
        case, model, result, data, _ = trained
        case.unless_not_applicable("used_pool")
        kind = pool_kind(model.backend)
        (pool,) = [p for p in rm.jobs.pools() if p.backend == kind]
        if case.between is None:
            case.train(seed=11, progress=False)  # another job in between, on the same workers
        else:
            case.between()  # another framework's job on the same workers
        again_model, again, _ = case.train(callbacks=[Recorder(str(tmp_path))], progress=False)
        (used,) = [p for p in rm.jobs.pools() if p.backend == kind]
        assert used.id == pool.id and used.jobs_run == pool.jobs_run + 2, (pool, used)
        assert [row["epoch"] for row in again.history] == [row["epoch"] for row in result.history]
        for fresh_row, used_row in zip(result.history, again.history):
            for key, value in fresh_row.items():
                assert used_row[key] == pytest.approx(value, rel=1e-6, abs=0), (fresh_row["epoch"], key)
        payload = case.payload(case.rows(data, 16))
        np.testing.assert_allclose(
            np.asarray(case.numbers(again_model.predict(payload)), dtype=float),
            np.asarray(case.numbers(model.predict(payload)), dtype=float),
            rtol=1e-6,
            atol=0,
        )

    @pytest.mark.integration
    def test_a_killed_worker_resumes_from_the_newest_checkpoint(trained, tmp_path):
        case, model, result, data, _ = trained
        epochs = len(result.history)
        calls = tmp_path / "calls"
        calls.mkdir()
        counts = tmp_path / "counts.jsonl"
        resumed_model, resumed, _ = (case.train_interrupted or case.train)(
            callbacks=[
                CrashOnce(str(tmp_path / "crashed"), rank=case.crash_rank),
                Recorder(str(calls)),
                Counter(str(counts)),
            ],
            max_failures=1,
            checkpoint_every=1,
            progress=False,
        )
        assert (tmp_path / "crashed").exists(), "the worker never crashed"
        assert [row["epoch"] for row in resumed.history] == list(range(1, epochs + 1))
        # The callback's count came back with the epoch-2 checkpoint: it goes on from 2, not from 0.
        logged = [json.loads(line) for line in counts.read_text().splitlines()]
        assert logged[-(epochs - CRASH_EPOCH + 1) :] == [[e, e] for e in range(CRASH_EPOCH, epochs + 1)], logged
        first, second = attempts(recorded(calls, case.crash_rank))
        started = expected_hooks(model.backend, case.crash_rank, CRASH_EPOCH - 1, loads=case.set_up_on_driver)
        assert first == started[:-1]  # died before epoch 3
        for rank in case.ranks:
            again = attempts(recorded(calls, rank))[-1]
            assert again == expected_hooks(model.backend, rank, epochs, first=CRASH_EPOCH, loads=True), rank
        case.unless_not_applicable("same_model_after_resume")
        # The whole state came back (weights, optimizer, schedulers, RNG): the same model as never stopping.
        payload = case.payload(case.rows(data, 16))
        close(case, resumed_model.predict(payload), model.predict(payload))
        for key, value in result.history[-1].items():
            assert resumed.history[-1][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key

    @pytest.mark.integration
    def test_tune_serve_and_registry(trained):
        case, model, result, data, _ = trained
        tuned_model = case.tuned() if case.tuned else type(model)()
        tuned = tuned_model.tune(
            data=data,
            settings={
                "num_samples": 2,
                "max_epochs": 2,
                "grace_period": 1,
                "reduction_factor": 2,
                # One trial at a time: Tune gives the second the first's actor (its process, its imports).
                "max_concurrent_trials": 1,
                "train": case.tune_train,
                "progress": False,
            },
        )
        assert tuned.num_trials == 2 and len(tuned.dataframe()) == 2
        assert set(tuned_model.hyperparameter_space()) <= set(tuned.best_config)

        rows = case.rows(data, 3)
        payload = case.payload(rows)
        app = tuned_model.serve(f"/conformance-{case.backend}", settings={"ray_actor_options": {"num_cpus": 0.25}})
        try:
            answer = requests.post(app.url, json=payload, timeout=60)
            assert answer.status_code == 200
            close(case, answer.json(), tuned_model.predict(payload))
            wrong = requests.post(app.url, json=case.bad_payload(rows), timeout=60)
            assert wrong.status_code == 422 and wrong.json()["detail"], wrong.text  # what is wrong, said
        finally:
            app.shutdown()

        reg = rm.registry.open(str(Path(result.path).parent.parent / f"registry-{case.backend}"))
        ref = reg.put(tuned, key=case.backend)
        loaded = reg.get(case.backend, ref.version)
        assert type(loaded).__name__ == type(tuned_model).__name__ and loaded.config == tuned.best_config
        close(case, loaded.predict(payload), tuned_model.predict(payload))

    @pytest.mark.integration
    def test_the_runs_checkpoint_is_scored_as_its_last_epoch_validated_it(trained, tmp_path):
        """``WorkerLoop.score`` (a release's gate), in this process: the final checkpoint's figures on
        the validation split are its last epoch's (RLlib's: evaluation episodes' mean return)."""
        case, model, result, data, _ = trained
        scored = score_here(type(model)(config=model.config), result.checkpoint, data, tmp_path)
        expected = {k: v for k, v in result.history[-1].items() if k.startswith("val_")}
        if model.backend.needs_data:
            assert expected and scored == pytest.approx(expected, rel=1e-4, abs=case.scored_abs), (scored, expected)
            if "val_acc" in scored:  # over the whole split, as `accuracy` counts it
                assert scored["val_acc"] == pytest.approx(case.accuracy(model, data), abs=1e-6)
        else:
            assert sorted(scored) == ["val_episode_len_mean", "val_episode_return_mean"], scored
            assert np.isfinite(scored["val_episode_return_mean"]) and scored["val_episode_len_mean"] >= 1

    @pytest.mark.integration
    def test_the_runs_checkpoint_predicts_the_same_in_fresh_actors_row_by_row(trained):
        case, model, result, data, _ = trained
        rows = case.rows(data, 96)
        blocks = case.table(rows)
        columns = rm.predict_batch(result.checkpoint, blocks, batch_size=10, concurrency=1, num_cpus=0.25).to_numpy()
        got = np.asarray(case.batch_numbers(columns), dtype=float)
        assert len(got) == len(rows)
        same = lambda answer, expected: np.testing.assert_allclose(  # noqa: E731
            np.asarray(case.numbers(answer), dtype=float), expected, rtol=1e-5, atol=1e-6
        )
        same(model.predict(case.payload(rows)), got)
        for i in (0, len(rows) // 2, len(rows) - 1):  # and one row at a time
            same(model.predict(case.payload(rows[i : i + 1])), got[i : i + 1])

    namespace.update(
        trained=trained,
        test_train_history_hooks_and_accuracy=test_train_history_hooks_and_accuracy,
        test_a_used_pool_trains_exactly_as_a_fresh_one=test_a_used_pool_trains_exactly_as_a_fresh_one,
        # The tests on the case's idle pool first: Ray Data's actors and Tune's trials end it.
        test_a_killed_worker_resumes_from_the_newest_checkpoint=(
            test_a_killed_worker_resumes_from_the_newest_checkpoint
        ),
        test_the_runs_checkpoint_predicts_the_same_in_fresh_actors_row_by_row=(
            test_the_runs_checkpoint_predicts_the_same_in_fresh_actors_row_by_row
        ),
        test_tune_serve_and_registry=test_tune_serve_and_registry,
        test_the_runs_checkpoint_is_scored_as_its_last_epoch_validated_it=(
            test_the_runs_checkpoint_is_scored_as_its_last_epoch_validated_it
        ),
    )


def score_here(model: Any, checkpoint: str, data: Any, folder: Path) -> dict[str, float]:
    """The figures ``WorkerRun``'s scoring mode gives ``checkpoint``, run in this process as one worker
    (every validation row in one batch; no env runner of its own for RLlib)."""
    from raymodel.train import LocalSession, WorkerRun, prepare
    from raymodel.train._driver import worker_payload

    settings, spec = prepare(model, {"batch_size": 100_000, "num_workers": 0, "progress": False}, data)
    blob = worker_payload(model, settings, {"name": "score", "path": str(folder / "score"), "evaluate": checkpoint})
    scored = WorkerRun({"payload": blob, "data": spec, "hub": None}, session=LocalSession(str(folder / "score"))).run()
    assert scored["history"] == [] and scored["evaluated"] == checkpoint
    return scored["metrics"]
