"""The worker side of ``RayTransformersModel``: Hugging Face's ``Trainer`` drives ``WorkerRun``'s phases.

The ``Trainer`` owns its loop, so a ``TrainerCallback`` maps its points onto the run's phase
methods (the order is checked there): ``on_epoch_begin`` -> ``begin_epoch``; ``on_epoch_end`` ->
``begin_validation`` (the ``Trainer`` evaluates next); ``on_log`` carries the epoch's mean training
loss (gathered over the workers by the ``Trainer``); ``on_evaluate`` the evaluation's metrics;
``on_save``, after the ``Trainer`` wrote its own checkpoint, ``end_validation`` and ``end_epoch``
(the row, the stop vote, raymodel's checkpoint of that folder). ``Trainer.train`` runs in a thread;
the callbacks reach the run's event loop with ``run.sync``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import transformers

from raymodel._internal import tmp
from raymodel.backends.torch.loop import TorchLoop
from raymodel.backends.torch.optim import set_hyperparameters
from raymodel.backends.transformers import _lora, _post
from raymodel.backends.transformers._data import task_of
from raymodel.data import TorchDataset
from raymodel.exceptions import ModelDefinitionError

if TYPE_CHECKING:
    from raymodel.contract import RunOnWorker

#: Entries of the Trainer's evaluation that are not metrics of the model.
_EVAL_NOISE = ("runtime", "samples_per_second", "steps_per_second", "epoch", "model_preparation_time")


class TrainerLoop(TorchLoop):
    """Builds the ``Trainer``; resumes with ``Trainer.train(resume_from_checkpoint=...)``."""

    def __init__(self, run: RunOnWorker) -> None:
        super().__init__(run)
        self.trainer: Any = None
        self.resume: str | None = None
        self.pending_config: dict[str, Any] = {}  # config changes before the optimizer exists
        self.output_dir = tmp.make("hf-run")

    def build(self) -> None:
        """The ``Trainer`` creates the optimizer and scheduler itself, inside ``train``."""
        self.model._optimizers, self.model._scheduler_configs, self.model._schedulers = [], [], []

    def ready(self) -> None:
        """DDP is the ``Trainer``'s (accelerate's) job."""

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state({k: v for k, v in state.items() if k != "transformers_copy"})  # the weights; kept
        folder = state.get("transformers")
        if folder and (Path(folder) / transformers.trainer.TRAINER_STATE_NAME).is_file():
            self.resume = folder  # the rest (optimizer, scheduler, step): the Trainer restores it

    def apply_config(self, changes: dict[str, Any]) -> None:
        """On the ``Trainer``'s optimizer and the LR scheduler's base, which it scales each step; before
        the optimizer exists (a change made while the job was queued), once it does."""
        if self.trainer is not None and self.trainer.optimizer is not None:
            _set_hyperparameters(self.trainer, changes)
        else:
            self.pending_config = {**self.pending_config, **changes}

    def get_state(self) -> dict[str, Any]:
        """A copy of the ``Trainer``'s checkpoint folder of this epoch (rank 0's holds the model and
        optimizer); the folder itself stays, for a ``Trainer`` that goes on from it."""
        if self.run.rank != 0:
            return {}
        folder = self._checkpoint_folder()
        if not folder.is_dir():
            raise RuntimeError(f"the Trainer wrote no checkpoint at {folder}")
        copy = tmp.make("hf-state")
        shutil.copytree(folder, copy, dirs_exist_ok=True)
        if _lora.is_adapted(self.model.model):  # the Trainer saved the adapter: note the base it fits
            _lora.note_base(self.model, copy)
        return {"transformers": str(copy)}

    def _forget_resume(self) -> None:
        """Remove ``read_state``'s copy of the checkpoint this run resumed from (not a folder of its own)."""
        if self.resume is not None and not self.resume.startswith(str(self.output_dir)):
            shutil.rmtree(self.resume, ignore_errors=True)
        self.resume = None

    def _checkpoint_folder(self) -> Path:
        step = self.trainer.state.global_step
        return Path(self.output_dir) / f"{transformers.trainer_utils.PREFIX_CHECKPOINT_DIR}-{step}"

    def step_rows(self) -> list[dict[str, float]]:
        """Each step's figures so far (post-training: TRL's), from the ``Trainer``'s log, which its checkpoint
        keeps: a resumed run has the steps before its restart, none twice."""
        state = getattr(self.trainer, "state", None)
        if state is None or self.run.settings.method is None:
            return []
        return [step_row(entry, self.run.settings.method) for entry in state.log_history if "loss" in entry]

    def batches_per_epoch(self) -> int | None:
        state = getattr(self.trainer, "state", None)
        if state is None or not state.max_steps or not state.num_train_epochs:
            return None
        return max(1, state.max_steps // int(state.num_train_epochs))

    def close(self) -> None:
        self.trainer = None
        self._forget_resume()
        shutil.rmtree(self.output_dir, ignore_errors=True)
        try:  # accelerate's process-wide state: the next job on a pool's worker builds its own
            from accelerate.state import AcceleratorState

            AcceleratorState._reset_state(reset_partial_state=False)
        except Exception:  # noqa: BLE001 - an older accelerate: nothing kept
            pass

    async def run_epochs(self, first: int, last: int) -> None:
        """``Trainer.train`` to ``run.num_epochs``. The ``Trainer`` fixes its number of epochs (and its LR
        schedule) when it starts, so when ``job.update`` raises ``num_epochs`` mid-run a new ``Trainer``
        goes on from the last one's newest checkpoint, its schedule stretched to the new end."""
        bridge = _TrainerPhases(self.run, self, first)
        if self.run.rank == 0 and _lora.is_adapted(self.model.model):
            _lora.base_fingerprint(self.model.model)  # once, before the first epoch: each checkpoint notes it
        if self.resume is not None:
            _keep_rng_state(self.resume, self.run.rank, self.run.world)
        while True:
            target = self.run.num_epochs
            self.trainer = self._trainer(target, bridge)
            await asyncio.to_thread(self._train)
            if bridge.stopped or bridge.epoch >= self.run.num_epochs or bridge.epoch < target:
                return
            shared = self._shared_checkpoint()  # num_epochs grew: go on from here
            self._forget_resume()
            self.resume = shared

    async def score(self) -> dict[str, float]:
        """The ``Trainer``'s ``evaluate`` over the validation split (its ``compute_metrics`` too); a GRPO
        run's: the mean reward of greedy completions (``val_reward``)."""
        method = self.run.settings.method
        if method is not None and method.kind == "grpo":
            return await asyncio.to_thread(_post.val_reward, self)
        if method is not None:
            self.trainer = self.trainer or self._trainer(1, _TrainerPhases(self.run, self, 1))
            return _post.renamed(_figures(await asyncio.to_thread(self.trainer.evaluate)))
        trainer = transformers.Trainer(
            model=self.model.model,
            args=self.arguments(1, validate=True),
            eval_dataset=_dataset(self.run.splits["valid"]),
            processing_class=self.model.tokenizer,
            data_collator=self.collator(),
            compute_metrics=self.metrics_function(),
        )
        trainer.remove_callback(transformers.PrinterCallback)  # the figures are the run's to report
        if self.run.session.in_worker_group:
            from ray.train.huggingface.transformers import prepare_trainer

            trainer = prepare_trainer(trainer)
        from raymodel.backends.transformers._data import quiet

        with quiet():
            figures = await asyncio.to_thread(trainer.evaluate)
        return _figures(figures)

    def _shared_checkpoint(self) -> str:
        """The newest ``Trainer`` checkpoint on every worker: rank 0 wrote the model, optimizer and state
        into its own folder (the others only their RNG state), so they get its files (a collective)."""
        folder = self._checkpoint_folder()
        files = None
        if self.run.rank == 0:
            files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        shared = self.run.all_gather(files)[0]
        if self.run.rank != 0:
            for rel, data in shared.items():
                if not (folder / rel).exists():  # this worker's own RNG state stays
                    (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                    (folder / rel).write_bytes(data)
        return str(folder)

    def _trainer(self, last: int, bridge: _TrainerPhases) -> Any:
        run, model = self.run, self.model
        train = _dataset(run.splits["train"])
        valid = _dataset(run.splits["valid"]) if self.has_validation else None
        if run.settings.method is not None:  # TRL's trainer (rewards, preferences)
            arguments = self.arguments(last, validate=valid is not None)
            trainer = _post.trainer(self, arguments, train, valid, [bridge], done=bridge.epoch)
            if run.session.in_worker_group:
                from ray.train.huggingface.transformers import prepare_trainer

                trainer = prepare_trainer(trainer)
            return trainer
        trainer = transformers.Trainer(
            model=model.model,
            args=self.arguments(last, validate=valid is not None),
            train_dataset=train,
            eval_dataset=valid,
            processing_class=model.tokenizer,
            data_collator=self.collator(),
            compute_metrics=self.metrics_function() if valid is not None else None,
            callbacks=[bridge],
        )
        if run.session.in_worker_group:
            from ray.train.huggingface.transformers import prepare_trainer

            trainer = prepare_trainer(trainer)
        return trainer

    def _train(self) -> None:
        from raymodel.backends.transformers._data import quiet

        with quiet():
            self.trainer.train(resume_from_checkpoint=self.resume)

    def arguments(self, last: int, *, validate: bool) -> Any:
        """``TrainingArguments`` from the settings and config, then the model's ``training_args``, then
        what the bridge needs (an epoch's evaluation, log and checkpoint; the number of epochs)."""
        s, config = self.run.settings, self.model.config
        args = transformers.TrainingArguments(
            output_dir=str(self.output_dir),
            per_device_train_batch_size=s.batch_size,
            per_device_eval_batch_size=s.batch_size,
            learning_rate=float(config.get("lr", 5e-5)),
            weight_decay=float(config.get("weight_decay", 0.0)),
            seed=int(s.seed),
            gradient_accumulation_steps=s.accumulate_grad_batches,
            max_grad_norm=float(s.grad_clip_norm) if s.grad_clip_norm is not None else 0.0,
            bf16=s.precision == "bf16-mixed",
            fp16=s.precision == "16-mixed",
            use_cpu=not s.use_gpu,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        adjusted = self.model.training_args(args)
        if not isinstance(adjusted, transformers.TrainingArguments):
            raise ModelDefinitionError(
                f"`{type(self.model).__name__}.training_args` must return the `TrainingArguments` it was given "
                f"(adjusted); it returned {type(adjusted).__name__}."
            )
        return dataclasses.replace(
            adjusted,
            output_dir=str(self.output_dir),
            num_train_epochs=last,
            max_steps=-1,
            eval_strategy="epoch" if validate else "no",
            # post-training: each step's log is that step's figures (the run's step rows), the epoch's their mean
            logging_strategy="epoch" if self.run.settings.method is None else "steps",
            logging_steps=1,
            save_strategy="epoch",
            save_total_limit=1,
            load_best_model_at_end=False,
            # DDP's mean of the workers' gradients, each worker's loss its own batch's mean (with True the
            # Trainer scales every loss, and its logged value, by the number of workers)
            average_tokens_across_devices=False,
            push_to_hub=False,
            report_to="none",
        )

    def collator(self) -> Any:
        """The model's ``data_collator``, else for a causal LM: its ``labels`` padded with -100 where the data
        has them (prompt/completion and chat data), language modelling labels where it has not."""
        collator = self.model.data_collator()
        if collator is None and task_of(self.model.model) == "causal_lm":
            tokenizer = self.model.tokenizer
            if getattr(tokenizer, "pad_token", None) is None and getattr(tokenizer, "eos_token", None) is not None:
                tokenizer.pad_token = tokenizer.eos_token  # padding is masked: any token does (GPT-2 has none)
            if "labels" in _dataset(self.run.splits["train"]).column_names:
                return transformers.DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100)
            return transformers.DataCollatorForLanguageModeling(tokenizer, mlm=False)
        return collator

    def metrics_function(self) -> Any:
        model = self.model
        base = _base_class(model)  # RayTransformersModel
        if task_of(model.model) != "classification" and type(model).compute_metrics is base.compute_metrics:
            return None  # a causal LM's logits over the vocabulary would be gathered for nothing
        return lambda prediction: model.compute_metrics(prediction.predictions, prediction.label_ids)


def _base_class(model: Any) -> Any:
    return next(k for k in reversed(type(model).__mro__) if "backend" in vars(k))


def _dataset(split: Any) -> Any:
    if not isinstance(split, TorchDataset):
        raise TypeError(f"Unsupported split {type(split).__name__}")
    return split.dataset


def _set_hyperparameters(trainer: Any, changes: dict[str, Any]) -> None:
    """``job.update``'s changes on the optimizer; ``lr`` also on the scheduler's base, so its next step
    scales the new rate (the default schedule is linear decay) rather than putting the old one back."""
    set_hyperparameters([trainer.optimizer], changes)
    scheduler = trainer.lr_scheduler
    if "lr" in changes and scheduler is not None and hasattr(scheduler, "base_lrs"):
        scheduler.base_lrs = [float(changes["lr"])] * len(scheduler.base_lrs)
        lambdas = getattr(scheduler, "lr_lambdas", None)
        if lambdas:
            for group, fn in zip(trainer.optimizer.param_groups, lambdas):
                group["lr"] = float(changes["lr"]) * fn(scheduler.last_epoch)


class _TrainerPhases(transformers.TrainerCallback):
    """The ``Trainer``'s callback points -> ``WorkerRun``'s phases."""

    def __init__(self, run: RunOnWorker, loop: TrainerLoop, first: int) -> None:
        self.run, self.loop = run, loop
        self.epoch = first - 1
        self.loss: float | None = None
        self.steps: list[dict[str, float]] = []  # post-training: this epoch's step rows
        self.metrics: dict[str, Any] = {}
        self.step = 0
        self.stopped = False  # the run's stop vote (or job.stop) ended it

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.loop.pending_config:  # after the Trainer restored its checkpoint: the change wins
            _set_hyperparameters(self.loop.trainer, self.loop.pending_config)
            self.loop.pending_config = {}

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.epoch += 1
        done = int(round(state.epoch or 0))  # the Trainer's own count (its checkpoint's, after a resume)
        if done != self.epoch - 1:
            raise RuntimeError(
                f"the Trainer begins its epoch {done + 1} where raymodel's run is at epoch {self.epoch}: its "
                "checkpoint and the run's disagree (were `num_train_epochs` or the data changed by `training_args`?)"
            )
        self.loss, self.metrics, self.step, self.steps = None, {}, 0, []
        self.run.sync(self.run.begin_epoch(self.epoch))

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        clip = self.run.settings.grad_clip_value
        if clip is not None:  # HF clips by norm only (max_grad_norm)
            torch.nn.utils.clip_grad_value_(self.loop.model.model.parameters(), clip)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        post = self.run.settings.method is not None  # its step's figures come with its log, next
        if not post and (self.run.hooks.has("after_batch") or self.run.progress is not None):
            self.run.sync(self.run.after_batch(self.step, None))
        self.step += 1

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.loop.has_validation:
            self.run.sync(self.run.begin_validation())

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or "loss" not in logs:
            return
        method = self.run.settings.method
        if method is None:  # the epoch's log: its mean loss
            self.loss = float(logs["loss"])
            return
        row = step_row({**logs, "step": state.global_step}, method)
        self.steps.append(row)  # one step's figures (TRL's, over every worker): the epoch's row is their mean
        if self.run.hooks.has("after_batch") or self.run.progress is not None:
            self.run.sync(self.run.after_batch(self.step - 1, row))

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None, **_: Any) -> None:
        self.metrics = dict(metrics or {})

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        metrics: dict[str, Any] = {} if self.loss is None else {"loss": self.loss}
        if self.steps:  # post-training: each figure's mean over the epoch's steps
            metrics = _means(self.steps)
        method = self.run.settings.method
        if self.loop.has_validation and method is not None and method.kind == "grpo":
            self.metrics = _post.val_reward(self.loop)  # greedy completions of the held-out prompts
        if self.loop.has_validation:
            figures = _figures(self.metrics) if method is None else _post.renamed(_figures(self.metrics))
            metrics.update(self.run.sync(self.run.end_validation(figures)))
        self.stopped = self.run.sync(self.run.end_epoch(self.epoch, metrics))
        if self.stopped or self.epoch >= self.run.num_epochs:
            control.should_training_stop = True


def step_row(entry: dict[str, Any], method: Any) -> dict[str, float]:
    """A step's row from the ``Trainer``'s log entry: its number, its loss and TRL's figures."""
    epoch = math.ceil(round(float(entry.get("epoch", 0)), 6))  # the Trainer's is fractional: 1.5 is in epoch 2
    return {"step": int(entry["step"]), "epoch": epoch, "loss": float(entry["loss"]), **_post.figures(entry, method)}


def _means(rows: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's mean over the step rows that have it (the step's number and epoch left out)."""
    names = dict.fromkeys(k for row in rows for k in row if k not in ("step", "epoch"))
    return {k: sum(r[k] for r in rows if k in r) / sum(1 for r in rows if k in r) for k in names}


def _figures(evaluated: dict[str, Any]) -> dict[str, Any]:
    """The model's figures of a ``Trainer`` evaluation, without its ``eval_`` prefix and its timings."""
    return {
        k.removeprefix("eval_"): v
        for k, v in evaluated.items()
        if isinstance(v, (int, float)) and k.removeprefix("eval_") not in _EVAL_NOISE
    }


def _keep_rng_state(folder: str, rank: int, world: int) -> None:
    """This worker's random generators, as raymodel restored them from the checkpoint, in the ``Trainer``'s
    own file in the folder it resumes from, unless the folder has one: the checkpoint holds rank 0's
    ``Trainer`` folder only, and a ``Trainer`` that finds no file for its process reseeds with
    ``args.seed`` (so rank 1's dropout would differ from the uninterrupted run's)."""
    import random

    import numpy as np
    import torch

    path = Path(folder) / ("rng_state.pth" if world <= 1 else f"rng_state_{rank}.pth")
    if path.exists():
        return
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.random.get_rng_state_all() if world > 1 else torch.cuda.random.get_rng_state()
    torch.save(states, path)
