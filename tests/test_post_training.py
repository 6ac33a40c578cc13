"""Post-training a causal LM from the same class (``TrainSettings(method=rm.GRPO(...) | rm.DPO(...))``): TRL's
``GRPOTrainer`` and ``DPOTrainer`` on Ray Train workers of the training server's pools, rows with TRL's
figures and a held-out one, and what is refused before any worker starts."""

from __future__ import annotations

import dataclasses
import sys

import pandas as pd
import pytest
from conformance import CrashOnce
from hf_models import Sentiment, Sevens, sum_prompts

import raymodel as rm
from raymodel.exceptions import DataError, MissingDependencyError, ModelDefinitionError, SettingsError
from raymodel.train import prepare

GRPO = rm.GRPO(num_generations=4, beta=0.04, max_completion_length=6)
G4 = {"method": GRPO, "batch_size": 4}


def sevens(model: Sevens, prompts: list[str]) -> float:
    """The share of sevens in the model's greedy completions of ``prompts`` (what its reward scores)."""
    texts = [model.predict({"prompt": p, "max_new_tokens": 6})["text"] for p in prompts]
    return sum(model.reward(prompts, texts, None)) / len(texts)


def preferences(n: int, start: int) -> dict[str, list[str]]:
    """Pairs whose preferred answer has sevens and whose other has none."""
    return {"prompt": sum_prompts(n, start)["prompt"], "chosen": ["77"] * n, "rejected": ["12"] * n}


# ------------------------------------------------------------------ refused first
class NoReward(Sevens):
    reward = None


class Counted(Sevens):
    def reward(self, prompts, completions, answer, **columns):
        return [1.0]


class Worded(Sevens):
    def reward(self, prompts, completions, answer, **columns):
        return [0.5, "high"][: len(completions)]


class Weighed(Sevens):
    """Two rewards: the sevens, and a constant ``bonus`` (the same for every completion of a group, so it
    moves nothing; the weighted sum shows in ``reward``)."""

    def bonus(self, prompts, completions, **columns):
        return [1.0] * len(completions)


WEIGHED = rm.GRPO(num_generations=4, beta=0.04, max_completion_length=6, rewards={"reward": 1.0, "bonus": 0.5})


@pytest.mark.parametrize(
    ("model", "settings", "data", "error", "says"),
    [
        (NoReward(), G4, sum_prompts(8), ModelDefinitionError, "must define `reward"),
        (Counted(), G4, sum_prompts(8), ModelDefinitionError, "returned 1 rewards for 2"),
        (Worded(), G4, sum_prompts(8), ModelDefinitionError, "first bad value is 'high'"),
        (Sevens(), G4, {"text": ["1+2→"] * 8}, DataError, "no `prompt` column"),
        (Sevens(), {"method": GRPO, "batch_size": 3, "num_workers": 2}, sum_prompts(8), SettingsError,
         "`batch_size=3` per worker x 2 worker"),
        (Sevens(), {"method": rm.DPO()}, sum_prompts(8), DataError, "no `chosen`, `rejected` column"),
        (Sentiment(), G4, sum_prompts(8), ModelDefinitionError, "a causal language"),
        (Sevens(), {"method": WEIGHED, "batch_size": 4}, sum_prompts(8), ModelDefinitionError,
         "names `bonus`, which `Sevens` does not define"),
        (NoReward(), {"method": rm.GRPO(rewards={"bonus": 1.0}), "batch_size": 8}, sum_prompts(8),
         ModelDefinitionError, "names `bonus`"),
    ],
)  # fmt: skip
def test_what_cannot_post_train_is_refused_before_any_worker_starts(no_ray, model, settings, data, error, says):
    with pytest.raises(error, match=says):
        prepare(model, settings, data)


@pytest.mark.parametrize(
    ("rewards", "says"),
    [({}, "names the class's reward methods"), ({"a b": 1.0}, "keys are the names"),
     ({"bonus": "1"}, r"`rewards\['bonus'\]` is a weight"), ({"bonus": float("nan")}, "a finite number")],
)  # fmt: skip
def test_rewards_that_name_no_method_with_a_weight_are_refused(rewards, says):
    with pytest.raises(SettingsError, match=says):
        rm.GRPO(rewards=rewards)


def test_a_config_gives_the_run_its_beta_and_group_size_checked_as_the_methods_own(no_ray):
    settings, _ = prepare(Sevens(config={"beta": 0.5, "num_generations": 8}), {**G4, "batch_size": 8}, sum_prompts(8))
    assert (settings.method.beta, settings.method.num_generations) == (0.5, 8)
    with pytest.raises(SettingsError, match="`num_generations=3` times"):
        prepare(Sevens(config={"num_generations": 3}), {**G4, "num_workers": 2}, sum_prompts(8))


def test_a_method_is_refused_for_a_model_that_is_not_a_language_model(no_ray):
    from models import TinyNet

    with pytest.raises(SettingsError, match="post-trains a language model"):
        prepare(TinyNet(), {"method": GRPO, "batch_size": 4}, {"train": {}})


def test_without_trl_the_error_names_the_extra(no_ray, monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # an import of it fails, as where it is not installed
    with pytest.raises(MissingDependencyError, match=r"raymodel\[llm\]"):
        prepare(Sevens(), G4, sum_prompts(8))


# ------------------------------------------------------------------ on Ray
VALID = sum_prompts(16, 200)
SETTINGS = rm.TrainSettings(num_workers=2, num_epochs=3, batch_size=4, method=WEIGHED, seed=1, progress=False)
DATA = {"train": sum_prompts(16), "valid": VALID}


@pytest.fixture(scope="module")
def weighed(ray_session, tmp_path_factory):
    """GRPO from a registered parent (the untrained ``Weighed``, its adapter at zero) on a pool of 2 workers:
    ``(registry, parent, share of sevens before, the trained model, its TrainResult)``."""
    registry = rm.registry.open(str(tmp_path_factory.mktemp("registry")))
    parent = registry.put(Weighed(), "sevens")
    model = registry.get(parent)
    before = sevens(model, VALID["prompt"])
    return registry, parent, before, model, model.train(SETTINGS, data=DATA)


@pytest.mark.integration
def test_grpo_on_two_workers_moves_the_model_toward_its_rewards_with_their_weights(weighed):
    """A reward no data teaches (sevens in the completions) and a constant one weighed 0.5: GRPO raises the
    held-out greedy share of sevens from the parent's. Each epoch's row holds TRL's figures (the weighted
    ``reward``, each reward's own) and the held-out ``val_reward``."""
    _, _, before, model, result = weighed
    rows = result.history
    assert [row["epoch"] for row in rows] == [1, 2, 3]
    for row in rows:
        for figure in ("loss", "reward", "reward_std", "frac_reward_zero_std", "kl", "completion_length"):
            assert figure in row, (figure, row)
        assert row["reward_bonus"] == 1.0 and row["reward"] == pytest.approx(row["reward_reward"] + 0.5, abs=1e-4)
        assert row["val_reward"] == pytest.approx(row["val_reward_reward"] + 0.5, abs=1e-6), row
    last = rows[-1]["val_reward_reward"]
    assert last >= 0.2 and last > before + 0.15, (before, rows)
    assert sevens(model, VALID["prompt"]) == pytest.approx(last, abs=0.05)  # the instance holds the adapter


@pytest.mark.integration
def test_each_step_of_a_grpo_run_has_its_row(weighed):
    """16 prompts, 2 a step (8 completions over 2 workers, groups of 4): 8 steps an epoch, each with TRL's
    figures; an epoch's row is the mean of its steps'."""
    *_, result = weighed
    steps = result.steps()
    assert [s["step"] for s in steps] == list(range(1, 25))
    assert [s["epoch"] for s in steps] == [1] * 8 + [2] * 8 + [3] * 8
    for epoch, row in enumerate(result.history, start=1):
        mine = [s for s in steps if s["epoch"] == epoch]
        assert row["reward"] == pytest.approx(sum(s["reward"] for s in mine) / 8, abs=1e-6)
        assert row["loss"] == pytest.approx(sum(s["loss"] for s in mine) / 8, abs=1e-6)
        assert all("kl" in s and "reward_bonus" in s for s in mine)


@pytest.mark.integration
def test_a_post_trained_version_names_its_parent_and_the_base_it_shares(weighed):
    """Registered, the trained adapter's lineage names the version it was trained from, and the same base
    fingerprint as that version's: a key's adapter versions route serves them side by side."""
    registry, parent, _, _, result = weighed
    child = registry.show(registry.put(result, "sevens"))
    assert child.lineage["parent"] == str(parent)
    assert child.lineage["adapter_of"] == registry.show(parent).lineage["adapter_of"]


@pytest.mark.integration
def test_a_grpo_run_that_loses_a_worker_resumes_as_if_it_had_not(weighed, tmp_path):
    """Rank 1 exits in epoch 2; Ray Train restarts the group from epoch 1's checkpoint (the adapter, the
    optimizer, each worker's generator): every step's figures are the uninterrupted run's, none run twice."""
    registry, parent, _, _, uninterrupted = weighed
    crash = CrashOnce(str(tmp_path / "crashed"), rank=1, epoch=2)
    settings = dataclasses.replace(SETTINGS, max_failures=1, callbacks=[crash])
    result = registry.get(parent).train(settings, data=DATA)
    assert (tmp_path / "crashed").exists()
    assert [s["step"] for s in result.steps()] == list(range(1, 25))
    for mine, theirs in zip(result.steps(), uninterrupted.steps()):
        assert mine == pytest.approx(theirs, abs=1e-5), (mine, theirs)
    assert result.history[-1]["val_reward"] == pytest.approx(uninterrupted.history[-1]["val_reward"], abs=1e-6)


@pytest.mark.integration
def test_a_grpo_job_takes_a_new_lr_at_the_next_epoch(weighed):
    registry, parent, *_ = weighed
    job = registry.get(parent).train(SETTINGS, data=DATA, wait=False)
    assert next(iter(job.stream()))["epoch"] == 1
    job.update(config={"lr": 1e-4})
    result = job.wait(timeout=300)
    changed = [row for row in result.history if row.get("changes")]
    assert changed and changed[0]["changes"] == {"lr": 1e-4} and job.status == "SUCCEEDED"


@pytest.mark.integration
def test_asha_searches_grpos_beta_and_group_size_on_val_reward(weighed):
    """The config's ``beta`` and ``num_generations`` are the run's (a tune samples them as it does ``lr``):
    the trial with ``beta > 0`` reports the KL to the reference, the other none."""
    registry, parent, *_ = weighed
    train = dataclasses.replace(SETTINGS, num_epochs=2, resources_per_worker={"CPU": 0.95})  # and the trial's share
    settings = rm.TuneSettings(num_samples=1, max_epochs=2, metric="val_reward", mode="max", train=train)
    space = {"beta": rm.tune.grid_search([0.0, 0.04]), "num_generations": 2}
    result = registry.get(parent).tune(space, settings=settings, data=DATA)
    frame = result.dataframe().set_index("config/beta")
    assert result.num_trials == 2 and "val_reward" in frame and frame["val_reward"].notna().all()
    assert pd.isna(frame.loc[0.0].get("kl")) and frame.loc[0.04, "kl"] >= 0
    assert result.best_config["num_generations"] == 2 and "val_reward" in result.best_metrics


@pytest.mark.integration
def test_dpo_on_two_workers_prefers_the_chosen_answers_of_held_out_pairs(ray_session):
    """With the adapter at zero the policy is its reference: every pair's margin is 0. DPO on 2 workers
    makes the held-out chosen answers the likelier ones."""
    model = Sevens()
    result = model.train(
        rm.TrainSettings(num_workers=2, num_epochs=2, batch_size=4, method=rm.DPO(beta=0.1), progress=False),
        data={"train": preferences(32, 0), "valid": preferences(16, 200)},
    )
    last = result.history[-1]
    for figure in ("loss", "reward_chosen", "reward_rejected", "reward_accuracy", "reward_margin", "val_loss"):
        assert figure in last, (figure, last)
    assert last["val_reward_accuracy"] >= 0.9 and last["val_reward_margin"] > 0.1, last
