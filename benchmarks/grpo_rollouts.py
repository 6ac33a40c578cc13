"""A GRPO step's rollouts: TRL's own generation against raymodel's batched text engine, the same
prompts, group size, lengths and sampling, in one process (one worker's share of a step).

The model is a GPT-2 built from a config (``--embd``, ``--layers``) over the sums' byte-level BPE
tokenizer of ``examples/llm_grpo.py``; its weights are random, so nearly every completion runs to
``--length`` tokens (the lengths are printed: both sides must generate the same number of tokens).

- **TRL**: ``GRPOTrainer._generate`` of a trainer built as raymodel builds it (``num_generations``
  completions of each of ``--prompts`` prompts: ``model.generate`` on the whole batch, then TRL's
  bookkeeping of ids and masks).
- **engine**: raymodel's serving engine (``raymodel.backends.transformers._engine.Engine``) given the
  same completions as requests with ``max_batch_size`` the whole batch: one prefill, one forward a
  step, each row sampled with its own seeded generator and decoded incrementally.

The figure is the median of ``--reps`` timings after one warm-up each. raymodel generates a step's
rollouts with the engine (TRL's ``rollout_func``) only where it is at least 1.3x faster than TRL.

    python benchmarks/grpo_rollouts.py [--prompts 4] [--generations 8] [--length 64] [--embd 128] [--layers 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from llm_grpo import gpt2, sums, sums_tokenizer  # from examples/


def trl_side(model, tokenizer, prompts, args):
    import datasets
    import trl

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    config = trl.GRPOConfig(
        output_dir=str(Path(args.scratch) / "trl"),
        per_device_train_batch_size=len(prompts) * args.generations,
        num_generations=args.generations,
        max_completion_length=args.length,
        temperature=1.0,
        use_cpu=True,
        bf16=False,
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[lambda prompts, completions, **_: [0.0] * len(completions)],
        args=config,
        train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
    )
    batch = [p for p in prompts for _ in range(args.generations)]  # TRL's sampler repeats each prompt

    def once():
        out = trainer._generate(batch)
        return sum(len(ids) for ids in out[1])  # completion ids per row

    return once


def engine_side(model, tokenizer, prompts, args):
    import raymodel as rm
    from raymodel.backends.transformers._engine import Engine
    from raymodel.contract import TextRequest

    class Held(rm.RayTransformersModel):  # the engine serves a model instance: this one holds TRL's model
        def setup(self, config):
            self.model, self.tokenizer = model, tokenizer

    held = Held()
    held.ensure_setup()
    engine = Engine(held, max_batch_size=len(prompts) * args.generations)
    ids = [engine.prompt_ids(p) for p in prompts]

    def once():
        n = len(prompts) * args.generations
        done, counts, failed = threading.Event(), [], []

        def emit(item):  # on the engine's thread
            if isinstance(item, dict):
                counts.append(item["completion_tokens"])
            elif isinstance(item, BaseException):
                failed.append(item)
            if len(counts) + len(failed) == n:
                done.set()

        for i, prompt in enumerate(ids):
            for g in range(args.generations):
                engine.submit(TextRequest(ids=list(prompt), emit=emit, max_tokens=args.length, seed=i * 100 + g))
        if not done.wait(timeout=600) or failed:
            raise RuntimeError(f"the engine did not answer: {failed[:1]}")
        return sum(counts)

    return once, engine


def timed(once, reps):
    once()  # warm-up
    times, tokens = [], 0
    for _ in range(reps):
        start = time.perf_counter()
        tokens = once()
        times.append(time.perf_counter() - start)
    return statistics.median(times), tokens


def main() -> None:
    import tempfile

    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--embd", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as a Ray Train worker of one CPU has it

    tokenizer = sums_tokenizer()
    tokenizer.model_max_length = args.length + 16
    model = gpt2(tokenizer, seed=0, n_positions=args.length + 16, n_embd=args.embd)
    if args.layers != 2:
        from transformers import GPT2LMHeadModel

        config = model.config
        config.n_layer = args.layers
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config)
    model.eval()
    prompts = [f"{a}+{b}→" for a, b in sums(args.prompts)]
    n = args.prompts * args.generations
    print(
        f"{args.prompts} prompts x {args.generations} completions of up to {args.length} tokens; GPT-2 "
        f"{args.layers} layers x {args.embd}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters"
    )
    with tempfile.TemporaryDirectory() as scratch:
        args.scratch = scratch
        trl_s, trl_tokens = timed(trl_side(model, tokenizer, prompts, args), args.reps)
        once, engine = engine_side(model, tokenizer, prompts, args)
        try:
            eng_s, eng_tokens = timed(once, args.reps)
        finally:
            engine.close()
    print(f"TRL's generation:   {trl_s:.3f} s for {n} completions, {trl_tokens} tokens ({trl_tokens / trl_s:.0f}/s)")
    print(f"raymodel's engine:  {eng_s:.3f} s for {n} completions, {eng_tokens} tokens ({eng_tokens / eng_s:.0f}/s)")
    speedup = (trl_tokens / trl_s) and (eng_tokens / eng_s) / (trl_tokens / trl_s)
    print(f"engine / TRL, tokens per second: {speedup:.2f}x (raymodel generates with the engine at >= 1.3x)")


if __name__ == "__main__":
    main()
