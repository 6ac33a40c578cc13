"""Post-training a causal LM with TRL's trainers: rewards (``GRPO``, ``GRPOTrainer``) and preferences
(``DPO``, ``DPOTrainer``).

On the driver, ``prepare`` turns the data into ``datasets.Dataset`` splits as TRL reads them (text kept,
not tokenized: TRL tokenizes prompts and completions itself) and checks what would fail on a worker:
TRL installed, the columns each method needs, the class's ``reward`` and what it returns. On a worker,
``trainer`` builds TRL's trainer from the ``TrainingArguments`` the loop made (epochs, batch, seed,
learning rate, the epoch's log and checkpoint), ``figures`` names TRL's logged figures as a row's, and
``val_reward`` scores a GRPO run's held-out prompts with greedy completions.

With a LoRA adapter, TRL computes the reference with the adapter off: the frozen base is the reference,
and no second copy of the model is held.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

from raymodel.data import DataSpec, TorchDataset
from raymodel.exceptions import DataError, ModelDefinitionError

#: TRL's logged figures -> a row's names (the rest of TRL's log is left out).
FIGURES = {
    "reward": "reward",
    "reward_std": "reward_std",
    "frac_reward_zero_std": "frac_reward_zero_std",
    "kl": "kl",
    "completions/mean_length": "completion_length",
    "clip_ratio/region_mean": "clip_ratio",
    "rewards/chosen": "reward_chosen",
    "rewards/rejected": "reward_rejected",
    "rewards/accuracies": "reward_accuracy",
    "rewards/margins": "reward_margin",
}


def prepare(model: Any, data: Any, method: Any) -> DataSpec:
    """``data`` as TRL's text splits for ``method``, checked (columns, rewards) on the driver."""
    from raymodel._internal.deps import require
    from raymodel.backends.transformers._data import named_splits, task_of, to_dataset

    require("trl", "llm")
    model.ensure_setup()
    if task_of(model.model) != "causal_lm" and task_of(getattr(model.model, "base_model", model.model)) != "causal_lm":
        raise ModelDefinitionError(
            f"`{type(method).__name__}` post-trains a causal language model; `{type(model).__name__}.model` is a "
            f"{type(model.model).__name__}."
        )
    splits = {}
    for name, value in named_splits(data).items():
        dataset = to_dataset(value, f"`data[{name!r}]`")
        splits[name] = TorchDataset(_columns(dataset, method, name))
    if method.kind == "grpo":
        check_reward(model, method, splits["train"].dataset)
    return DataSpec(splits)


def _columns(dataset: Any, method: Any, split: str) -> Any:
    columns = list(dataset.column_names)
    if "prompt" not in columns and "messages" in columns:
        dataset = dataset.rename_column("messages", "prompt")  # chat: the conversation so far is the prompt
        columns = list(dataset.column_names)
    needed = ("prompt",) if method.kind == "grpo" else ("prompt", "chosen", "rejected")
    missing = [c for c in needed if c not in columns]
    if missing:
        what = (
            "a `prompt` column (text, or chat `messages`) and the columns its rewards take"
            if method.kind == "grpo"
            else "`prompt`, `chosen` and `rejected` columns (text or chat)"
        )
        raise DataError(
            f"The `{split}` split has no {', '.join(f'`{c}`' for c in missing)} column (columns: {columns}); "
            f"{type(method).__name__} trains on {what}."
        )
    return dataset


def reward_calls(model: Any, method: Any) -> list[RewardCall]:
    """TRL's reward functions: the class's methods ``method.weights`` names, in order."""
    return [RewardCall(model, name) for name in method.weights]


def check_reward(model: Any, method: Any, dataset: Any) -> None:
    """Each reward method on two rows, their prompts standing in for completions: a list of one number
    (or ``None``) per completion, or an error naming what it returned."""
    cls = type(model).__name__
    for name in method.weights:
        if not callable(getattr(type(model), name, None)):
            if method.rewards is None:
                raise ModelDefinitionError(
                    f"GRPO trains on rewards: `{cls}` must define `reward(self, prompts, completions, **columns)` "
                    "returning one float per completion (columns of the data by name; None skips one), or name "
                    "its reward methods in `rm.GRPO(rewards={...})`."
                )
            methods = sorted(n for n in dir(type(model)) if not n.startswith("_") and "reward" in n)
            raise ModelDefinitionError(
                f"`rm.GRPO(rewards=...)` names `{name}`, which `{cls}` does not define (its methods named like "
                f"a reward: {methods}); each name is a method `{name}(self, prompts, completions, **columns)`."
            )
    rows = dataset[: min(2, len(dataset))]
    prompts = rows["prompt"]
    completions = [p if isinstance(p, str) else "" for p in prompts]
    for call in reward_calls(model, method):
        call(prompts=prompts, completions=completions, **_others(rows))  # checks what it returns


class RewardCall:
    """One of TRL's reward functions: a reward method of the class, with the data's columns by name (TRL's
    own keywords left out), its answer checked (one float or ``None`` per completion)."""

    def __init__(self, model: Any, name: str = "reward") -> None:
        self.model, self.name = model, name
        self.__name__ = name  # TRL names the figure `rewards/<name>/mean`

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float | None]:
        given = {
            k: v
            for k, v in columns.items()
            if k not in ("completion_ids", "trainer_state", "log_extra", "log_metric", "environments")
        }
        texts = [_text(c) for c in completions]
        out = getattr(self.model, self.name)(list(prompts), texts, **given)
        name = f"`{type(self.model).__name__}.{self.name}`"
        if isinstance(out, (str, bytes)) or not isinstance(out, Sequence) and not hasattr(out, "tolist"):
            raise ModelDefinitionError(f"{name} must return a list of floats, one per completion; it returned {out!r}.")
        values = list(out.tolist() if hasattr(out, "tolist") else out)
        if len(values) != len(texts):
            raise ModelDefinitionError(
                f"{name} returned {len(values)} rewards for {len(texts)} completions: return one per completion."
            )
        for value in values:
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ModelDefinitionError(
                    f"{name} must return floats (or None to skip one); the first bad value is {value!r} "
                    f"({type(value).__name__})."
                )
        return [None if v is None else float(v) for v in values]


def _others(rows: Mapping[str, Any]) -> dict[str, Any]:
    """The columns of a batch of rows but the prompt: what a reward takes by name."""
    return {k: v for k, v in rows.items() if k != "prompt"}


def _chat(tokenizer: Any, messages: Any) -> str:
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def _text(completion: Any) -> str:
    """A completion as text: TRL hands chat completions as a list of messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], Mapping):
        return str(completion[-1].get("content", ""))
    return str(completion)


# ---------------------------------------------------------------- on a worker
def trainer(loop: Any, args: Any, train: Any, valid: Any, callbacks: list[Any], done: int = 0) -> Any:
    """TRL's trainer of the loop's method, built from the loop's ``TrainingArguments``; ``done``: the epochs
    of the run before this trainer's first (a resumed run's)."""
    import transformers
    import trl

    method, model = loop.run.settings.method, loop.model
    common = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(transformers.TrainingArguments)
        if f.init and not f.name.startswith("_")
    }
    tokenizer = model.tokenizer
    if getattr(tokenizer, "pad_token", None) is None and getattr(tokenizer, "eos_token", None) is not None:
        tokenizer.pad_token = tokenizer.eos_token
    from raymodel.backends.transformers._data import quiet

    with quiet():  # TRL maps its datasets (progress bars)
        built = _trainer(trl, transformers, method, model, tokenizer, common, train, valid, callbacks)
    if done:
        _order_from(built, done)
    return built


def _order_from(built: Any, done: int) -> None:
    """GRPO's prompt order in a run that resumes after ``done`` epochs: the epoch's own, as in a run that
    went on. TRL's sampler draws one permutation an epoch from a generator seeded once, and has no
    ``set_epoch``: a new one would begin again at epoch 1's order. Its generator is moved past the
    ``done`` epochs' permutations (HF's own sampler, DPO's, is seeded by the epoch already)."""
    import torch

    make = built._get_train_sampler

    def sampler(*args: Any, **kwargs: Any) -> Any:
        made = make(*args, **kwargs)
        generator = getattr(made, "generator", None)
        if isinstance(generator, torch.Generator) and hasattr(made, "num_samples"):
            for _ in range(done):
                torch.randperm(made.num_samples, generator=generator)
        return made

    built._get_train_sampler = sampler


def _trainer(
    trl: Any,
    transformers: Any,
    method: Any,
    model: Any,
    tokenizer: Any,
    common: dict[str, Any],
    train: Any,
    valid: Any,
    callbacks: list[Any],
) -> Any:
    if method.kind == "grpo":
        config = trl.GRPOConfig(
            **{
                **common,
                "eval_strategy": "no",  # the held-out figure is raymodel's (`val_reward`)
                "remove_unused_columns": False,  # the rewards' columns reach them
                "num_generations": method.num_generations,
                "beta": float(method.beta),
                "max_completion_length": method.max_completion_length,
                "temperature": float(method.temperature),
                "loss_type": method.loss_type,
                "log_completions": False,
                "reward_weights": list(method.weights.values()),
            }
        )
        built = trl.GRPOTrainer(
            model=model.model,
            reward_funcs=reward_calls(model, method),
            args=config,
            train_dataset=train,
            processing_class=tokenizer,
            callbacks=callbacks,
        )
    else:
        config = trl.DPOConfig(**{**common, "beta": float(method.beta), "max_length": method.max_length})
        built = trl.DPOTrainer(
            model=model.model,
            args=config,
            train_dataset=train,
            eval_dataset=valid,
            processing_class=tokenizer,
            callbacks=callbacks,
        )
    built.remove_callback(transformers.PrinterCallback)
    return built


def figures(logs: Mapping[str, Any], method: Any = None) -> dict[str, float]:
    """TRL's figures of a log, by a row's names; with several reward methods each one's mean too
    (``reward_<name>``)."""
    named = dict(FIGURES)
    if getattr(method, "rewards", None):
        named.update({f"rewards/{name}/mean": f"reward_{name}" for name in method.weights})
    return {
        name: float(logs[key])
        for key, name in named.items()
        if isinstance(logs.get(key), (int, float)) and math.isfinite(float(logs[key]))
    }


#: What TRL's evaluation reports that says nothing of a preference model (token counts, the SFT-style figures).
_EVAL_NOISE = ("num_tokens", "entropy", "mean_token_accuracy")


def renamed(evaluated: Mapping[str, Any]) -> dict[str, Any]:
    """An evaluation's figures (``eval_`` taken off) by a row's names: TRL's known ones renamed, its other
    ``a/b`` figures and token counts left out, the rest (``loss``) as they are."""
    return {
        FIGURES.get(k, k): v for k, v in evaluated.items() if ("/" not in k or k in FIGURES) and k not in _EVAL_NOISE
    }


def val_reward(loop: Any) -> dict[str, float]:
    """The mean reward of greedy completions of the held-out prompts (this worker's share of them, then
    over every worker): the figure a tune searches and a release gates on."""
    import torch

    method, model, run = loop.run.settings.method, loop.model, loop.run
    dataset = loop.run.splits["valid"].dataset
    mine = dataset.select(range(run.rank, len(dataset), max(run.world, 1)))
    net, tokenizer = model.model, model.tokenizer
    calls, weights = reward_calls(model, method), list(method.weights.values())
    total, count = 0.0, 0
    each = {name: (0.0, 0) for name in method.weights}
    was_training = net.training
    net.eval()
    try:
        for start in range(0, len(mine), 16):
            rows = mine[start : start + 16]
            prompts = rows["prompt"]
            texts = [p if isinstance(p, str) else _chat(tokenizer, p) for p in prompts]
            tokenizer.padding_side = "left"
            batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(net.device)
            with torch.no_grad():
                out = net.generate(
                    **batch,
                    max_new_tokens=method.max_completion_length,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id,
                )
            completions = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
            scores = [call(prompts=prompts, completions=completions, **_others(rows)) for call in calls]
            for i in range(len(completions)):
                given = [(w, one[i]) for w, one in zip(weights, scores) if one[i] is not None]
                if given:  # TRL's sum: a None is left out of it, a completion with none at all is skipped
                    total, count = total + sum(w * v for w, v in given), count + 1
                for name, one in zip(method.weights, scores):
                    value = one[i]
                    if value is not None:
                        each[name] = (each[name][0] + value, each[name][1] + 1)
    finally:
        if was_training:
            net.train()
    gathered = run.all_gather((total, count, each)) if run.world > 1 else [(total, count, each)]
    total, count = sum(g[0] for g in gathered), sum(g[1] for g in gathered)
    out = {"reward": total / count} if count else {}
    if method.rewards:
        for name in method.weights:
            t, n = sum(g[2][name][0] for g in gathered), sum(g[2][name][1] for g in gathered)
            if n:
                out[f"reward_{name}"] = t / n
    return out
