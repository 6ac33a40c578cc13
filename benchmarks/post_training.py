"""Post-training on 2 Ray Train workers: Ray's hand-written pattern (TRL's trainer inside a ``TorchTrainer``
loop, ``prepare_trainer``, Ray's report callback) against raymodel's ``TrainSettings(method=...)``, the
same model, adapter, data, group size and seed, in one run; then a worker's peak memory with a KL term
to the reference (``beta > 0``) against none (``beta = 0``), raymodel against raymodel.

The model is a GPT-2 built from a config (``--embd``, ``--layers``) over the sums' byte-level BPE tokenizer
of ``examples/llm_grpo.py``, saved once as a transformers folder that every side loads, with a LoRA
adapter (rank 8, alpha 16, on ``c_attn``). GRPO: ``--prompts`` sums, groups of 4, ``--batch`` completions a
worker a step, ``--length`` tokens a completion, rewarded for the share of sevens in it. DPO: as many
prompts, with a chosen and a rejected answer. No held-out split on either side (raymodel's ``val_reward``
is a figure the hand-written loop does not compute).

- **hand-written**: a cold run (Ray Train starts its worker group); TRL's ``GRPOTrainer``/``DPOTrainer``
  with a checkpoint each epoch (Ray's ``RayTrainReportCallback`` reports when the trainer saves).
- **raymodel, cold**: the first job of its kind on the training server (its pool starts); **warm**: the
  same job again, on that pool.

Seconds per step: the median time between the ends of consecutive epochs on rank 0, taken the same way on
each side, over the steps of an epoch. Memory: one-off runs (``pool=False``: fresh workers) of one GRPO
epoch, each worker's peak RSS above its RSS before ``setup`` built the model. With a LoRA adapter TRL's
reference is the base with the adapter off, so ``beta > 0`` holds no second copy of the model.

    python benchmarks/post_training.py [--epochs 3] [--prompts 32] [--batch 8] [--length 16] [--embd 512] [--layers 8]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from hf_trainer import _epochs  # the same per-epoch clock as the HF Trainer benchmark's (and its examples path)
from llm_grpo import gpt2, prompts_data, sums, sums_tokenizer  # examples/ (on the path: hf_trainer)
from lora import Memory  # a worker's peak RSS above its RSS before setup

import raymodel as rm

LORA = {"r": 8, "alpha": 16, "target_modules": ("c_attn",)}
SEED, LR, GROUP, BETA = 42, 1e-3, 4, 0.04


def sevens(prompts, completions, **columns):
    return [sum(ch == "7" for ch in c) / max(len(c), 1) for c in completions]


def preferences(n: int) -> dict[str, list[str]]:
    data = prompts_data(sums(n))
    return {"prompt": data["prompt"], "chosen": data["answer"], "rejected": [a[::-1] + "7" for a in data["answer"]]}


def make_base(folder: Path, embd: int, layers: int, length: int) -> int:
    """The base's folder (weights and tokenizer); returns its number of parameters."""
    from transformers import GPT2LMHeadModel

    tokenizer = sums_tokenizer()
    tokenizer.model_max_length = length + 16
    model = gpt2(tokenizer, seed=0, n_positions=length + 16, n_embd=embd, n_head=8)
    model.config.n_layer = layers
    model = GPT2LMHeadModel(model.config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


class Tuned(rm.RayTransformersModel):
    lora = rm.LoRA(**LORA)
    default_config = {"lr": LR, "base": None}

    def setup(self, config):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(config["base"])
        self.model = AutoModelForCausalLM.from_pretrained(config["base"])

    def reward(self, prompts, completions, **columns):
        return sevens(prompts, completions)


def method_of(kind: str, args, beta: float = BETA):
    if kind == "grpo":
        return rm.GRPO(num_generations=GROUP, beta=beta, max_completion_length=args.length, temperature=1.0)
    return rm.DPO(beta=0.1, max_length=args.length + 16)


def _hand_written_loop(config: dict) -> None:
    import datasets
    import transformers
    import trl
    from peft import LoraConfig, get_peft_model
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    class EpochClock(transformers.TrainerCallback):
        def on_save(self, args, state, control, **kwargs):  # after the epoch's checkpoint
            if state.is_world_process_zero:
                with open(config["clock"], "a") as fh:
                    fh.write(f"{time.time()}\n")

    base = transformers.AutoModelForCausalLM.from_pretrained(config["base"])
    adapter = LoraConfig(
        r=LORA["r"],
        lora_alpha=LORA["alpha"],
        target_modules=list(LORA["target_modules"]),
        lora_dropout=0.0,
        fan_in_fan_out=True,  # GPT-2's Conv1D
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, adapter)
    tokenizer = transformers.AutoTokenizer.from_pretrained(config["base"])
    common = {
        "output_dir": tempfile.mkdtemp(),
        "num_train_epochs": config["epochs"],
        "per_device_train_batch_size": config["batch"],
        "learning_rate": LR,
        "seed": SEED,
        # as raymodel runs it: no clipping unless asked, each worker's loss its own batch's mean, a log each step
        "max_grad_norm": 0.0,
        "average_tokens_across_devices": False,
        "logging_steps": 1,
        "save_strategy": "epoch",
        "save_total_limit": 1,
        "use_cpu": True,
        "bf16": False,
        "report_to": "none",
        "disable_tqdm": True,
    }
    train = datasets.Dataset.from_dict(config["data"])
    callbacks = [RayTrainReportCallback(), EpochClock()]
    if config["kind"] == "grpo":
        args = trl.GRPOConfig(
            **common,
            num_generations=GROUP,
            beta=BETA,
            max_completion_length=config["length"],
            temperature=1.0,
            log_completions=False,
        )
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=[sevens],
            args=args,
            train_dataset=train,
            processing_class=tokenizer,
            callbacks=callbacks,
        )
    else:
        args = trl.DPOConfig(**common, beta=0.1, max_length=config["length"] + 16)
        trainer = trl.DPOTrainer(
            model=model, args=args, train_dataset=train, processing_class=tokenizer, callbacks=callbacks
        )
    prepare_trainer(trainer).train()


def hand_written(kind: str, data, args, base: str, folder: str) -> dict[str, float]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    clock = os.path.join(folder, f"hand-{kind}.clock")
    start, began = time.perf_counter(), time.time()
    config = {"data": data, "epochs": args.epochs, "batch": args.batch, "clock": clock, "base": base}
    TorchTrainer(
        _hand_written_loop,
        train_loop_config={**config, "kind": kind, "length": args.length},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=folder, name=f"hand-{kind}"),
    ).fit()
    return {**_epochs(clock, began), "total_s": time.perf_counter() - start}


def through_raymodel(kind: str, data, args, base: str, folder: str, name: str) -> dict[str, float]:
    class EpochClock(rm.Callback):
        def after_epoch(self, epoch, metrics):
            if self.context.rank == 0:
                with open(clock, "a") as fh:
                    fh.write(f"{time.time()}\n")

    clock = os.path.join(folder, f"{name}.clock")
    settings = rm.TrainSettings(
        num_workers=2,
        batch_size=args.batch,
        num_epochs=args.epochs,
        seed=SEED,
        method=method_of(kind, args),
        callbacks=[EpochClock()],
        progress=False,
    )
    start, began = time.perf_counter(), time.time()
    Tuned(config={"base": base}).train(settings, data=data)
    return {**_epochs(clock, began), "total_s": time.perf_counter() - start}


def memory(beta: float, data, args, base: str, out: str) -> float:
    os.makedirs(out)
    settings = rm.TrainSettings(
        num_workers=2,
        num_epochs=1,
        batch_size=args.batch,
        seed=SEED,
        method=method_of("grpo", args, beta=beta),
        pool=False,
        storage_path=out,
        progress=False,
        callbacks=[Memory(out)],
    )
    Tuned(config={"base": base}).train(settings, data=data)
    return max(json.loads(Path(out, f"{r}.json").read_text())["peak_mib"] for r in range(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--embd", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"

    import datasets

    datasets.disable_progress_bars()
    rm.init(num_cpus=2, warm="none")
    rm.jobs.server()  # running, as in a session that trains more than once; no pool yet
    steps = {
        "grpo": args.prompts * GROUP // (2 * args.batch),  # completions of a step: batch x 2 workers
        "dpo": -(-args.prompts // (2 * args.batch)),
    }
    runs: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as root:
        base = str(Path(root) / "base")
        params = make_base(Path(base), args.embd, args.layers, args.length)
        for kind, data in (
            ("grpo", {"prompt": prompts_data(sums(args.prompts))["prompt"]}),
            ("dpo", preferences(args.prompts)),
        ):
            runs[kind] = {
                "hand": hand_written(kind, data, args, base, root),
                "cold": through_raymodel(kind, data, args, base, root, f"raymodel-{kind}-cold"),
                "warm": through_raymodel(kind, data, args, base, root, f"raymodel-{kind}-warm"),
            }
        rm.jobs.release_pools()  # the one-off runs have the CPUs
        grpo_data = {"prompt": prompts_data(sums(args.prompts))["prompt"]}
        peaks = {
            beta: memory(beta, grpo_data, args, base, os.path.join(root, f"memory-{beta}")) for beta in (0.0, BETA)
        }

    print(f"\nA GPT-2 of {params / 1e6:.1f}M parameters with a LoRA adapter (r=8 on c_attn), 2 workers")
    print(f"{'':36} {'s per step':>11} {'1st epoch end s':>16} {'total s':>9}")
    ratios = {}
    for kind, sides in runs.items():
        for label, side in (
            (f"{kind.upper()} hand-written (cold)", "hand"),
            (f"{kind.upper()} raymodel, cold (new pool)", "cold"),
            (f"{kind.upper()} raymodel, warm pool", "warm"),
        ):
            r = sides[side]
            print(
                f"{label:36} {r['per_epoch_s'] / steps[kind]:11.3f} {r['first_epoch_end_s']:16.2f} {r['total_s']:9.2f}"
            )
        ratios[f"{kind.upper()} s per step, raymodel warm / hand-written (goal <= 1.05)"] = (
            sides["warm"]["per_epoch_s"] / sides["hand"]["per_epoch_s"]
        )
    print(f"\nraymodel against raymodel: a worker's peak MiB in one GRPO epoch: {peaks}")
    ratios["peak worker memory, beta > 0 / beta = 0 (raymodel vs raymodel; goal <= 1.1)"] = peaks[BETA] / peaks[0.0]
    for label, ratio in ratios.items():
        print(f"{label}: {ratio:.3f}x")
    print(json.dumps({"params": params, "steps": steps, "runs": runs, "peaks": peaks, "ratios": ratios}))


if __name__ == "__main__":
    main()
