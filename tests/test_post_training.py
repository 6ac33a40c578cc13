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
def test_grpo_on_two_workers_moves_the_model_toward_its_rewards_with_their_weights(ray_session, registry):
    """A reward no data teaches (sevens in the completions) and a constant one weighed 0.5: on a pool of 2
    workers GRPO raises the held-out greedy share of sevens from the registered parent's. Each epoch's row
    holds TRL's figures (the weighted ``reward``, each reward's own) and the held-out ``val_reward``; each
    step's row is in ``result.steps()``; the version it registers names its parent and the base it fits."""
    valid = sum_prompts(16, 200)
    parent = registry.put(Weighed(), "sevens")
    model = registry.get(parent)
    before = sevens(model, valid["prompt"])
    result = model.train(
        rm.TrainSettings(num_workers=2, num_epochs=3, batch_size=4, method=WEIGHED, seed=1, progress=False),
        data={"train": sum_prompts(16), "valid": valid},
    )
    rows = result.history
    assert [row["epoch"] for row in rows] == [1, 2, 3]
    for row in rows:
        for figure in ("loss", "reward", "reward_std", "frac_reward_zero_std", "kl", "completion_length"):
            assert figure in row, (figure, row)
        assert row["reward_bonus"] == 1.0 and row["reward"] == pytest.approx(row["reward_reward"] + 0.5, abs=1e-4)
        assert row["val_reward"] == pytest.approx(row["val_reward_reward"] + 0.5, abs=1e-6), row
    last = rows[-1]["val_reward_reward"]
    assert last >= 0.2 and last > before + 0.15, (before, rows)
    assert sevens(model, valid["prompt"]) == pytest.approx(last, abs=0.05)  # the instance holds the adapter

    steps = result.steps()  # 16 prompts, 2 a step (8 completions over 2 workers, groups of 4): 8 an epoch
    assert [s["step"] for s in steps] == list(range(1, 25))
    assert [s["epoch"] for s in steps] == [1] * 8 + [2] * 8 + [3] * 8
    for epoch, row in enumerate(rows, start=1):
        mine = [s for s in steps if s["epoch"] == epoch]
        assert row["reward"] == pytest.approx(sum(s["reward"] for s in mine) / 8, abs=1e-6)
        assert all("kl" in s and "reward_bonus" in s for s in mine)

    child = registry.show(registry.put(result, "sevens"))
    assert child.lineage["parent"] == str(parent)
    assert child.lineage["adapter_of"] == registry.show(parent).lineage["adapter_of"]  # served beside it


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
