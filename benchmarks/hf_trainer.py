"""Hugging Face's ``Trainer`` on 2 Ray Train workers: Ray's documented pattern by hand against
``RayTransformersModel``, the same model and data, in one run.

Both sides fine-tune the tiny BERT of ``examples/transformers_sentiment.py`` (built from a config, the
tokenizer made in code) on its generated sentiment set, tokenized once on the driver: 3 epochs, 16 rows
per worker a step, lr 2e-3, an evaluation and a ``Trainer`` checkpoint each epoch.

- **hand-written** (Ray's pattern, ``docs.ray.io`` "Get Started with Hugging Face Transformers"): a
  ``TorchTrainer`` whose ``train_loop_per_worker`` builds the model, ``TrainingArguments`` and a
  ``Trainer`` with ``RayTrainReportCallback``, ``prepare_trainer``, ``trainer.train()``; a cold run
  (Ray Train starts its worker group).
- **raymodel, cold**: ``Sentiment().train(...)`` as the first job of the training server with no pool
  (the pool's worker group starts with it).
- **raymodel, warm**: the same job again, on the pool the first one left.

Per-epoch wall is the median time between the ends of consecutive epochs, taken on rank 0 by a
callback on each side the same way (epoch 2 and 3); total wall is from the call to the result in hand.
Ratios are raymodel / hand-written.

    python benchmarks/hf_trainer.py [--epochs 3] [--rows 2048] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

EXAMPLES = str(Path(__file__).resolve().parent.parent / "examples")
sys.path.insert(0, EXAMPLES)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [EXAMPLES, os.environ.get("PYTHONPATH")]))  # Ray's workers

SETTINGS = {"num_workers": 2, "batch_size": 16, "lr": 2e-3}


def tokenized(rows: int):
    """The example's data, tokenized once with the example's tokenizer (as raymodel does on the driver)."""
    import datasets
    from transformers_sentiment import Sentiment, sentiment_data

    datasets.disable_progress_bars()
    model = Sentiment()
    model.ensure_setup()
    data = sentiment_data(rows, rows // 4)
    return {name: split.map(lambda b: model.tokenize(b), batched=True) for name, split in data.items()}


def _hand_written_loop(config: dict) -> None:
    import numpy as np
    import transformers
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
    from transformers_sentiment import make_tokenizer, tiny_bert

    class EpochClock(transformers.TrainerCallback):
        def on_save(self, args, state, control, **kwargs):  # after the epoch's evaluation and checkpoint
            if state.is_world_process_zero:
                with open(config["clock"], "a") as fh:
                    fh.write(f"{time.time()}\n")

    model = tiny_bert(32)  # the example's model, built from its config
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        num_train_epochs=config["epochs"],
        per_device_train_batch_size=SETTINGS["batch_size"],
        per_device_eval_batch_size=SETTINGS["batch_size"],
        learning_rate=SETTINGS["lr"],
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

    def accuracy(prediction):
        return {"accuracy": float((np.asarray(prediction.predictions).argmax(-1) == prediction.label_ids).mean())}

    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=config["data"]["train"],
        eval_dataset=config["data"]["validation"],
        processing_class=make_tokenizer(),
        compute_metrics=accuracy,
        callbacks=[RayTrainReportCallback(), EpochClock()],
    )
    prepare_trainer(trainer).train()


def hand_written(data, epochs: int, folder: str) -> dict[str, float]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    clock = os.path.join(folder, "hand-written.clock")
    start = time.perf_counter()
    began = time.time()
    result = TorchTrainer(
        _hand_written_loop,
        train_loop_config={"data": data, "epochs": epochs, "clock": clock},
        scaling_config=ScalingConfig(num_workers=SETTINGS["num_workers"]),
        run_config=RunConfig(storage_path=folder, name="hand-written"),
    ).fit()
    total = time.perf_counter() - start
    return {**_epochs(clock, began), "total_s": total, "val_accuracy": float(result.metrics["eval_accuracy"])}


def through_raymodel(data, epochs: int, folder: str, name: str) -> dict[str, float]:
    from transformers_sentiment import Sentiment

    import raymodel as rm

    class EpochClock(rm.Callback):
        def after_epoch(self, epoch, metrics):
            if self.context.rank == 0:
                with open(clock, "a") as fh:
                    fh.write(f"{time.time()}\n")

    clock = os.path.join(folder, f"{name}.clock")
    settings = {
        "num_workers": SETTINGS["num_workers"],
        "batch_size": SETTINGS["batch_size"],
        "num_epochs": epochs,
        "callbacks": [EpochClock()],
        "progress": False,
    }
    model = Sentiment(config={"lr": SETTINGS["lr"]})
    start = time.perf_counter()
    began = time.time()
    result = model.train(settings, data=data)
    total = time.perf_counter() - start
    return {**_epochs(clock, began), "total_s": total, "val_accuracy": float(result.metrics["val_accuracy"])}


def _epochs(clock: str, began: float) -> dict[str, float]:
    ends = [float(line) for line in Path(clock).read_text().split()]
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    return {"first_epoch_end_s": ends[0] - began, "per_epoch_s": statistics.median(gaps) if gaps else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=3, help="repetitions, the sides in turn: medians (ranges)")
    args = parser.parse_args()

    import raymodel as rm

    rm.init(num_cpus=2)
    rm.jobs.server()  # running, as in a session that trains more than once; no pool yet
    data = tokenized(args.rows)
    runs: dict[str, list[dict[str, float]]] = {"hand": [], "cold": [], "warm": []}
    with tempfile.TemporaryDirectory() as root:
        for rep in range(args.reps):
            folder = os.path.join(root, str(rep))
            os.makedirs(folder)
            rm.jobs.release_pools()  # the cold side starts its pool; the hand-written side has the CPUs
            runs["hand"].append(hand_written(data, args.epochs, folder))
            runs["cold"].append(through_raymodel(data, args.epochs, folder, "raymodel-cold"))
            runs["warm"].append(through_raymodel(data, args.epochs, folder, "raymodel-warm"))
            print(f"repetition {rep + 1}/{args.reps} done", flush=True)
    hand, cold, warm = ({k: statistics.median(r[k] for r in runs[side]) for k in runs[side][0]} for side in runs)
    rows = {
        "hand-written (Ray's pattern, cold)": "hand",
        "raymodel, cold (new pool)": "cold",
        "raymodel, warm pool": "warm",
    }
    print(f"\nHF Trainer, tiny BERT, {args.rows} rows, {args.epochs} epochs, 2 workers, this machine")
    print(f"medians of {args.reps} repetitions (ranges)")
    print(f"{'':36} {'per epoch s':>18} {'1st epoch end s':>18} {'total s':>18} {'val_acc':>8}")

    def cell(side: str, key: str) -> str:
        values = [r[key] for r in runs[side]]
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    for label, side in rows.items():
        print(
            f"{label:36} {cell(side, 'per_epoch_s'):>18} {cell(side, 'first_epoch_end_s'):>18} "
            f"{cell(side, 'total_s'):>18} {statistics.median(r['val_accuracy'] for r in runs[side]):8.3f}"
        )
    ratios = {
        "per-epoch wall, raymodel warm / hand-written (goal <= 1.05)": warm["per_epoch_s"] / hand["per_epoch_s"],
        "per-epoch wall, raymodel cold / hand-written": cold["per_epoch_s"] / hand["per_epoch_s"],
        "total wall, raymodel cold / hand-written cold": cold["total_s"] / hand["total_s"],
        "total wall, raymodel warm pool / hand-written cold (goal <= 0.3)": warm["total_s"] / hand["total_s"],
    }
    for label, ratio in ratios.items():
        print(f"{label}: {ratio:.2f}x")
    print(json.dumps({"hand_written": hand, "raymodel_cold": cold, "raymodel_warm": warm, "ratios": ratios}))


if __name__ == "__main__":
    main()
