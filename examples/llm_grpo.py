"""Post-train a small language model with rewards (GRPO): supervised first, then rewarded for right answers.

A two-layer GPT-2 is built from a config over a byte-level BPE tokenizer trained in code (nothing is
downloaded; the arrow of ``12+34→46`` is three bytes, merged into one token). It learns two-digit sums
supervised, on two Ray Train workers, to partial accuracy: that version is registered (``adder:1``).
Then, from that version, GRPO (TRL's ``GRPOTrainer`` on the same two workers) rewards each sampled answer
1.0 when it is the sum and 0.0 when not. A control run starts from the same version with the same
settings, but its rewards are shuffled across the completions of each step: the same rewards on average,
with no information in which answer earned them. Each runs with three seeds.

It prints the held-out exact-match (greedy answers to 200 sums no run trained on) before and after each
run, and the spread over seeds; draws the step rewards and the held-out accuracy of both runs
(``llm_grpo.png``); registers the first seed's GRPO model as ``adder:2`` (its lineage names ``adder:1``)
and serves both versions with OpenAI's API, called with the ``openai`` client.

python examples/llm_grpo.py   (about 6 minutes on 2 cores)
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time

import raymodel as rm

SEEDS = (1, 2, 3)
HELD_OUT = 200  # sums no run trains on: the first of the shuffled pairs


def sums(n: int, start: int = 0) -> list[tuple[int, int]]:
    """``n`` pairs of two-digit numbers, from ``start`` in one fixed shuffle of all 8,100."""
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(0).shuffle(pairs)
    return pairs[start : start + n]


def bpe_tokenizer(texts, vocab_size: int, max_length: int = 64):
    """A byte-level BPE tokenizer (GPT-2's kind) trained in code on ``texts``; its one special token,
    ``<|endoftext|>``, ends a text and pads."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>", model_max_length=max_length
    )


def sums_tokenizer():
    """Digits one token each (a vocabulary of bytes and the arrow's two merges): a sum is learned digit by
    digit, where merged digit pairs would make each number a word of its own."""
    return bpe_tokenizer([f"{a}+{b}→{a + b}" for a, b in sums(400, HELD_OUT)], vocab_size=259, max_length=16)


def gpt2(tokenizer, *, seed: int, n_positions: int = 16, n_embd: int = 64, n_head: int = 4):
    """A two-layer GPT-2 from a config over ``tokenizer``'s vocabulary (its own token ids: GPT2Config's
    defaults are GPT-2's), its weights seeded."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    eos = tokenizer.eos_token_id
    return GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(tokenizer),
            n_positions=n_positions,
            n_embd=n_embd,
            n_layer=2,
            n_head=n_head,
            bos_token_id=eos,
            eos_token_id=eos,
            pad_token_id=eos,
        )
    )


class Until(rm.Callback):
    """Stops the run at the end of the first epoch whose ``metric`` reaches ``target`` (every worker has
    the same figures, so they all stop there)."""

    def __init__(self, metric: str, target: float) -> None:
        self.metric, self.target = metric, target

    def after_epoch(self, epoch, metrics):
        if metrics.get(self.metric, 0.0) >= self.target:
            self.context.should_stop = True


class Adder(rm.RayTransformersModel):
    """Answers ``12+34→`` with ``46``. Its reward: 1.0 for the right sum, 0.0 for anything else; with
    ``config["control"]``, the same rewards shuffled across a step's completions."""

    default_config = {"lr": 3e-3, "seed": 0, "control": False}

    def setup(self, config):
        self.tokenizer = sums_tokenizer()
        self.model = gpt2(self.tokenizer, seed=config["seed"])
        self.shuffler = random.Random(config["seed"])

    def compute_metrics(self, predictions, labels):
        """``exact_match``: answers whose every token (the end too) is the likeliest after the ones before,
        which is the greedy answer being the sum."""
        import numpy as np

        guessed, wanted = np.asarray(predictions).argmax(-1)[:, :-1], np.asarray(labels)[:, 1:]
        scored = wanted != -100  # the answers' tokens (the prompt and the padding are -100)
        return {"exact_match": float(((guessed == wanted) | ~scored).all(axis=1).mean())}

    def reward(self, prompts, completions, answer, **columns):
        rewards = [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]
        if self.config["control"]:
            self.shuffler.shuffle(rewards)  # the mean stays: a held-out mean is the accuracy still
        return rewards


def pairs_data(pairs):
    return {"prompt": [f"{a}+{b}→" for a, b in pairs], "completion": [str(a + b) for a, b in pairs]}


def prompts_data(pairs):
    return {"prompt": [f"{a}+{b}→" for a, b in pairs], "answer": [str(a + b) for a, b in pairs]}


def exact_match(model, pairs) -> float:
    """The share of ``pairs`` whose greedy answer is their sum."""
    data = prompts_data(pairs)
    texts = [model.predict({"prompt": p, "max_new_tokens": 4})["text"] for p in data["prompt"]]
    return sum(model.reward(data["prompt"], texts, data["answer"])) / len(texts)


def main() -> None:
    start = time.monotonic()
    held_out = sums(HELD_OUT)
    two = {"num_workers": 2, "progress": False}

    # 1. Supervised, to partial accuracy: epochs of 1,600 sums, 32 a worker a step (a loss on the answers only),
    #    until the held-out exact-match passes 0.4.
    adder = Adder()
    supervised = {"train": pairs_data(sums(1600, HELD_OUT)), "valid": pairs_data(held_out)}
    sft = adder.train(
        {**two, "num_epochs": 40, "batch_size": 32, "callbacks": [Until("val_exact_match", 0.4)]}, data=supervised
    )
    print("supervised: held-out exact-match by epoch", [round(r["val_exact_match"], 3) for r in sft.history])
    before = exact_match(adder, held_out)
    parent = rm.registry.put(adder, key="adder")
    print(f"supervised: held-out exact-match {before:.3f} ({parent}, {time.monotonic() - start:.0f} s)")

    # 2. GRPO from that version, and the control, three seeds each: 6 epochs of 200 prompts, 4 prompts a step
    #    (16 completions a worker, groups of 8), so 300 steps; held-out exact-match after each epoch.
    grpo = rm.GRPO(num_generations=8, max_completion_length=4, temperature=0.7, beta=0.0)
    settings = rm.TrainSettings(**two, num_epochs=6, batch_size=16, method=grpo)
    data = {"train": prompts_data(sums(200, HELD_OUT + 1600)), "valid": prompts_data(held_out)}
    runs: dict[str, list] = {"GRPO": [], "control": []}
    for seed in SEEDS:
        for name, control in (("GRPO", False), ("control", True)):
            model = rm.registry.get(parent, config={"lr": 3e-4, "control": control})
            result = model.train(dataclasses.replace(settings, seed=seed), data=data)
            after = result.history[-1]["val_reward"]
            runs[name].append((seed, model, result, after))
            print(f"{name:8s} seed {seed}: held-out exact-match {before:.3f} -> {after:.3f}")
    for name, done in runs.items():
        gains = [after - before for *_, after in done]
        print(
            f"{name:8s} gain over the supervised model: mean {statistics.mean(gains):+.3f}, "
            f"spread {min(gains):+.3f} .. {max(gains):+.3f}"
        )
    worst_grpo, best_control = min(d[3] for d in runs["GRPO"]), max(d[3] for d in runs["control"])
    print(f"every GRPO seed's gain above every control seed's: {worst_grpo > best_control}")
    picture(runs, before)

    # 3. The first seed's GRPO model is version 2, its lineage naming its parent; both served over OpenAI's API.
    _, model, result, _ = runs["GRPO"][0]
    child = rm.registry.put(result, key="adder")
    print(f"registered {child}: parent {rm.registry.show(child).lineage['parent']}")
    serve_both(parent, child, held_out[:50])
    print(f"done in {time.monotonic() - start:.0f} s")


def picture(runs, before: float, path: str = "llm_grpo.png") -> None:
    """The step rewards (a moving mean of 10 steps) and the held-out exact-match after each epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    colors = {"GRPO": "tab:blue", "control": "tab:gray"}
    for name, done in runs.items():
        for i, (_, _, result, _) in enumerate(done):
            steps = result.steps()
            rewards = [row["reward"] for row in steps]
            smooth = [statistics.mean(rewards[max(0, j - 9) : j + 1]) for j in range(len(rewards))]
            label = name if i == 0 else None
            left.plot([row["step"] for row in steps], smooth, color=colors[name], alpha=0.8, label=label)
            per_epoch = len(steps) // len(result.history)
            xs = [0] + [row["epoch"] * per_epoch for row in result.history]
            ys = [before] + [row["val_reward"] for row in result.history]
            right.plot(xs, ys, marker="o", color=colors[name], alpha=0.8, label=label)
    left.set(title="reward of sampled answers (T=0.7), 10-step mean", xlabel="step", ylabel="reward")
    right.set(title="held-out exact-match (greedy)", xlabel="step", ylabel="exact-match")
    for ax in (left, right):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"the picture: {path}")


def serve_both(parent, child, pairs) -> None:
    """Both versions of ``adder`` on one OpenAI route (a request's ``model`` names one): each answers
    ``pairs`` through the ``openai`` client, greedy."""
    import openai

    app = rm.Servable("adder@*", "/v1", settings=rm.ServeSettings(api="openai")).deploy()
    try:
        client = openai.OpenAI(base_url=app.url, api_key="unused")
        print("served models:", [m.id for m in client.models.list()])
        for ref in (parent, child):
            answers = [
                client.completions.create(model=str(ref), prompt=f"{a}+{b}→", max_tokens=4, temperature=0)
                .choices[0]
                .text
                for a, b in pairs
            ]
            right = sum(answer.strip() == str(a + b) for answer, (a, b) in zip(answers, pairs))
            shown = ", ".join(f"{a}+{b}→{answer}" for answer, (a, b) in list(zip(answers, pairs))[:3])
            print(f"{ref} over OpenAI's API: {right} of {len(pairs)} held-out sums right ({shown}, ...)")
    finally:
        app.shutdown()


if __name__ == "__main__":
    main()
