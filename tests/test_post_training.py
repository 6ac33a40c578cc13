"""Post-training a causal LM from the same class (``TrainSettings(method=rm.GRPO(...) | rm.DPO(...))``): TRL's
``GRPOTrainer`` and ``DPOTrainer`` on Ray Train workers of the training server's pools, rows with TRL's
figures and a held-out one, and what is refused before any worker starts."""

from __future__ import annotations

import sys

import pytest
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
    ],
)  # fmt: skip
def test_what_cannot_post_train_is_refused_before_any_worker_starts(no_ray, model, settings, data, error, says):
    with pytest.raises(error, match=says):
        prepare(model, settings, data)


def test_a_method_is_refused_for_a_model_that_is_not_a_language_model(no_ray):
    from models import TinyNet

    with pytest.raises(SettingsError, match="post-trains a language model"):
        prepare(TinyNet(), {"method": GRPO, "batch_size": 4}, {"train": {}})


def test_without_trl_the_error_names_the_extra(no_ray, monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # an import of it fails, as where it is not installed
    with pytest.raises(MissingDependencyError, match=r"raymodel\[llm\]"):
        prepare(Sevens(), G4, sum_prompts(8))


# ------------------------------------------------------------------ on Ray
@pytest.mark.integration
def test_grpo_on_two_workers_moves_the_model_toward_its_reward_and_reports_trls_figures(ray_session):
    """A reward no data teaches (sevens in the completions): on a pool of 2 workers GRPO raises the held-out
    greedy reward from the untrained model's; each row holds TRL's figures and ``val_reward``."""
    valid = sum_prompts(16, 200)
    model = Sevens()
    model.ensure_setup()
    before = sevens(model, valid["prompt"])
    result = model.train(
        rm.TrainSettings(num_workers=2, num_epochs=3, batch_size=4, method=GRPO, seed=1, progress=False),
        data={"train": sum_prompts(16), "valid": valid},
    )
    rows = result.history
    assert [row["epoch"] for row in rows] == [1, 2, 3]
    for row in rows:
        for figure in ("loss", "reward", "reward_std", "frac_reward_zero_std", "kl", "completion_length", "val_reward"):
            assert figure in row, (figure, row)
    assert rows[-1]["val_reward"] >= 0.2 and rows[-1]["val_reward"] > before + 0.15, (before, rows)
    after = sevens(model, valid["prompt"])  # the instance holds the trained adapter
    assert after == pytest.approx(rows[-1]["val_reward"], abs=0.05), (after, rows[-1])


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
