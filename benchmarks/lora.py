"""LoRA on 2 Ray Train workers: Ray's hand-written pattern against ``rm.LoRA``, the same base, data and
adapter in one run; then each worker's peak memory with LoRA against full fine-tuning.

The base is a GPT-2 of about 50M parameters built from a config (``--embd`` 512, ``--layers`` 16) over
a byte-level BPE tokenizer trained in code, saved once as a transformers folder that every side
loads. The data is ``--rows`` generated prompt/completion pairs of accented words, tokenized by
raymodel's own prompt/completion tokenizer (the answers' tokens labelled) once on the driver; the
hand-written side gets those tokenized rows. The adapter: rank 8, alpha 16, on ``c_attn``.

- **hand-written** (Ray's pattern: ``TorchTrainer``, peft's ``get_peft_model``, HF's ``Trainer``,
  ``prepare_trainer``, ``RayTrainReportCallback``): a cold run (Ray Train starts its worker group).
- **raymodel, cold**: ``Assistant().train(...)``, the first job of the training server (its pool
  starts); **raymodel, warm**: the same job again, on that pool.

Both sides: an evaluation and a ``Trainer`` checkpoint each epoch, ``--batch`` rows per worker a step,
lr 1e-3, seed 42 (the same shuffles: a batch is padded to its longest row, so another order is other
work). Per-epoch wall is the median time between the ends of consecutive epochs, taken on rank 0
the same way on each side. Then raymodel against raymodel (labelled so): the same job with ``lora``
and with every weight trained (``lora = None``), one epoch each as one-off runs (``pool=False``: fresh
worker processes), each worker's peak RSS above its RSS before ``setup`` built the model; and the
bytes of the adapter's checkpoint against the full model's weights.

    python benchmarks/lora.py [--epochs 3] [--rows 64] [--batch 8] [--embd 512] [--layers 16]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

from hf_trainer import _epochs  # the same per-epoch clock as the HF Trainer benchmark's (and its examples path)

import raymodel as rm

WORDS = "crème brûlée café naïve façade château über schön smörgåsbord Zürich piñata jalapeño déjà entrée soufflé 🙂 🎉"
SETTINGS = {"num_workers": 2, "lr": 1e-3, "seed": 42}  # one seed: the same shuffles, so the same padded batches
LORA = {"r": 8, "alpha": 16, "target_modules": ("c_attn",)}


def pairs(n: int, seed: int = 0) -> dict[str, list[str]]:
    rng = random.Random(seed)
    words = WORDS.split()
    prompts = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 6))) + " ?" for _ in range(n)]
    return {"prompt": prompts, "completion": [" " + " ".join(reversed(p.split()[:-1])) for p in prompts]}


def make_base(folder: Path, embd: int, layers: int) -> int:
    """The base's folder (weights and tokenizer); returns its number of parameters."""
    from llm_lora import make_tokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = make_tokenizer([WORDS] * 8, vocab_size=320)  # the example's, on this benchmark's words
    eos = tokenizer.eos_token_id
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=64,
        n_embd=embd,
        n_layer=layers,
        n_head=8,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    model = GPT2LMHeadModel(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


class Assistant(rm.RayTransformersModel):
    lora = rm.LoRA(**LORA)
    default_config = {"lr": SETTINGS["lr"], "base": None}

    def setup(self, config):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(config["base"])
        self.model = AutoModelForCausalLM.from_pretrained(config["base"])


class FullAssistant(Assistant):
    lora = None


def _hand_written_loop(config: dict) -> None:
    import transformers
    from peft import LoraConfig, get_peft_model
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    class EpochClock(transformers.TrainerCallback):
        def on_save(self, args, state, control, **kwargs):  # after the epoch's evaluation and checkpoint
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
    tokenizer.pad_token = tokenizer.eos_token
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        num_train_epochs=config["epochs"],
        per_device_train_batch_size=config["batch"],
        per_device_eval_batch_size=config["batch"],
        learning_rate=SETTINGS["lr"],
        seed=SETTINGS["seed"],
        weight_decay=0.0,
        max_grad_norm=0.0,
        eval_strategy="epoch",
        logging_strategy="epoch",
        save_strategy="epoch",
        save_total_limit=1,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        average_tokens_across_devices=False,
    )
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=config["data"]["train"],
        eval_dataset=config["data"]["valid"],
        processing_class=tokenizer,
        data_collator=transformers.DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100),
        callbacks=[RayTrainReportCallback(), EpochClock()],
    )
    prepare_trainer(trainer).train()


def hand_written(data, args, base: str, folder: str) -> dict[str, float]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    clock = os.path.join(folder, "hand-written.clock")
    start, began = time.perf_counter(), time.time()
    result = TorchTrainer(
        _hand_written_loop,
        train_loop_config={"data": data, "epochs": args.epochs, "batch": args.batch, "clock": clock, "base": base},
        scaling_config=ScalingConfig(num_workers=SETTINGS["num_workers"]),
        run_config=RunConfig(storage_path=folder, name="hand-written"),
    ).fit()
    total = time.perf_counter() - start
    return {**_epochs(clock, began), "total_s": total, "val_loss": float(result.metrics["eval_loss"])}


def through_raymodel(data, args, base: str, folder: str, name: str) -> dict[str, float]:
    class EpochClock(rm.Callback):
        def after_epoch(self, epoch, metrics):
            if self.context.rank == 0:
                with open(clock, "a") as fh:
                    fh.write(f"{time.time()}\n")

    clock = os.path.join(folder, f"{name}.clock")
    settings = {
        "num_workers": SETTINGS["num_workers"],
        "batch_size": args.batch,
        "num_epochs": args.epochs,
        "seed": SETTINGS["seed"],
        "callbacks": [EpochClock()],
        "progress": False,
    }
    start, began = time.perf_counter(), time.time()
    result = Assistant(config={"base": base}).train(settings, data=data)
    total = time.perf_counter() - start
    return {**_epochs(clock, began), "total_s": total, "val_loss": float(result.metrics["val_loss"])}


# -------------------------------------------------------------- memory, raymodel against raymodel
def _status_mib(field: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


class Memory(rm.Callback):
    """Each worker's peak RSS above its RSS before ``setup`` built the model, into ``<out>/<rank>.json``."""

    def __init__(self, out: str) -> None:
        self.out, self.start = out, 0.0

    def before_setup(self):
        with open("/proc/self/clear_refs", "w") as fh:  # the peak starts again from now
            fh.write("5")
        self.start = _status_mib("VmRSS")

    def after_epoch(self, epoch, metrics):
        trainable = sum(p.numel() for p in self.model.model.parameters() if p.requires_grad)
        row = {"peak_mib": _status_mib("VmHWM") - self.start, "trainable": trainable}
        Path(self.out, f"{self.context.rank}.json").write_text(json.dumps(row))


def memory(model_class: type, data, args, base: str, out: str) -> dict[str, float]:
    os.makedirs(out)
    settings = {
        "num_workers": 2,
        "num_epochs": 1,
        "batch_size": args.batch,
        "pool": False,
        "storage_path": out,
        "progress": False,
        "callbacks": [Memory(out)],
    }
    result = model_class(config={"base": base}).train(settings, data=data)
    ranks = [json.loads(Path(out, f"{r}.json").read_text()) for r in range(2)]
    state = Path(result.checkpoint) / "state" / "hf"
    weights = sum(p.stat().st_size for p in state.glob("*.safetensors"))
    folder = sum(p.stat().st_size for p in Path(result.checkpoint).rglob("*") if p.is_file())
    return {
        "peak_mib": max(r["peak_mib"] for r in ranks),
        "trainable": ranks[0]["trainable"],
        "weights_bytes": weights,
        "checkpoint_bytes": folder,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--embd", type=int, default=512)
    parser.add_argument("--layers", type=int, default=16)
    args = parser.parse_args()

    import datasets

    datasets.disable_progress_bars()
    rm.init(num_cpus=2, warm="none")
    rm.jobs.server()  # running, as in a session that trains more than once; no pool yet
    with tempfile.TemporaryDirectory() as root:
        base = str(Path(root) / "base")
        params = make_base(Path(base), args.embd, args.layers)
        raw = {"train": pairs(args.rows), "valid": pairs(max(8, args.rows // 4), seed=1)}
        tokenizer_of = Assistant(config={"base": base})
        tokenizer_of.ensure_setup()
        tokenized = {k: datasets.Dataset.from_dict(dict(tokenizer_of.tokenize(v))) for k, v in raw.items()}
        runs = {}
        runs["hand"] = hand_written(tokenized, args, base, root)
        runs["cold"] = through_raymodel(raw, args, base, root, "raymodel-cold")
        runs["warm"] = through_raymodel(raw, args, base, root, "raymodel-warm")
        rm.jobs.release_pools()  # the one-off runs have the CPUs
        lora = memory(Assistant, raw, args, base, os.path.join(root, "memory-lora"))
        full = memory(FullAssistant, raw, args, base, os.path.join(root, "memory-full"))

    print(f"\nLoRA (r=8 on c_attn) of a GPT-2 of {params / 1e6:.1f}M parameters, {args.rows} pairs, 2 workers")
    print(f"{'':34} {'per epoch s':>12} {'1st epoch end s':>16} {'total s':>9} {'val_loss':>9}")
    for label, side in (
        ("hand-written (Ray's pattern, cold)", "hand"),
        ("raymodel, cold (new pool)", "cold"),
        ("raymodel, warm pool", "warm"),
    ):
        r = runs[side]
        times = f"{r['per_epoch_s']:12.2f} {r['first_epoch_end_s']:16.2f} {r['total_s']:9.2f}"
        print(f"{label:34} {times} {r['val_loss']:9.3f}")
    print("\nraymodel against raymodel: one epoch, one-off runs (fresh workers)")
    print(f"{'':18} {'trainable':>12} {'peak MiB/worker':>16} {'checkpoint weights':>19} {'checkpoint folder':>18}")
    for label, r in (("LoRA r=8", lora), ("full fine-tuning", full)):
        print(
            f"{label:18} {r['trainable']:12,d} {r['peak_mib']:16.0f} {r['weights_bytes'] / 2**20:17.2f}Mi "
            f"{r['checkpoint_bytes'] / 2**20:16.2f}Mi"
        )
    ratios = {
        "per-epoch wall, raymodel warm / hand-written (goal <= 1.05)": runs["warm"]["per_epoch_s"]
        / runs["hand"]["per_epoch_s"],
        "per-epoch wall, raymodel cold / hand-written": runs["cold"]["per_epoch_s"] / runs["hand"]["per_epoch_s"],
        "adapter weights / full model weights (goal <= 0.05)": lora["weights_bytes"] / full["weights_bytes"],
        "adapter checkpoint folder / full model weights": lora["checkpoint_bytes"] / full["weights_bytes"],
        "peak worker memory, LoRA / full fine-tuning (raymodel vs raymodel; goal <= 0.6)": lora["peak_mib"]
        / full["peak_mib"],
    }
    for label, ratio in ratios.items():
        print(f"{label}: {ratio:.3f}x")
    print(json.dumps({"params": params, "runs": runs, "lora": lora, "full": full, "ratios": ratios}))


if __name__ == "__main__":
    main()
