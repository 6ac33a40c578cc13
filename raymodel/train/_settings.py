"""``TrainSettings``: how much, and how, to train."""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

from raymodel._internal.settings import (
    LIMITS,
    MAX_SEED,
    SettingsBase,
    check_choice,
    check_int,
    check_name,
    check_number,
    check_resources,
    check_type,
    collect,
    settings_class,
)
from raymodel.contract import worker_resources  # noqa: F401 - re-exported: what one worker holds
from raymodel.train._methods import check_method

#: The training step's float precision (Lightning's names).
PRECISIONS = ("32", "bf16-mixed", "16-mixed")
#: Settings of the training step that only loop-driven gradient backends (torch, Lightning) honour.
#: How a model is spread over the workers (torch and Lightning).
STRATEGIES = ("ddp", "fsdp")
STEP_SETTINGS = {"precision": "32", "accumulate_grad_batches": 1, "grad_clip_norm": None, "grad_clip_value": None}


@settings_class
class TrainSettings(SettingsBase):
    """How to run ``model.train()``. Keyword-only; a plain dict is accepted too.

    The fields come in six groups (``TrainSettings.GROUPS``); each is still a
    keyword of its own (``TrainSettings(num_workers=2, priority=5)``):

    - **run**, what is trained and where its files go: ``num_epochs``, ``batch_size``,
      ``shuffle``, ``seed``, ``name``, ``storage_path``, ``method``;
    - **placement**, the workers and how a model is spread over them: ``num_workers``,
      ``use_gpu``, ``resources_per_worker``, ``strategy``, ``reshard_after_forward``,
      ``elastic_resize_s``, ``elastic_wait_s``;
    - **checkpoints**, what is kept and what a failure resumes from: ``checkpoint_every``,
      ``keep_checkpoints``, ``metric``, ``mode``, ``max_failures``;
    - **step**, the training step of torch and Lightning: ``precision``,
      ``accumulate_grad_batches``, ``grad_clip_norm``, ``grad_clip_value``;
    - **scheduling**, on the training server: ``pool``, ``priority``, ``preemptible``,
      ``resource_wait_s``;
    - **output**, what is printed, called and checked along the way: ``progress``,
      ``verbose``, ``callbacks``, ``nonfinite``.

    Attributes:
        num_epochs: Epochs (boosting rounds for tree backends). Counted from 1.
        batch_size: Rows per batch *on each worker*.
        shuffle: Reshuffle the training rows every epoch.
        seed: Seed for the shuffle and ``torch.manual_seed`` on every worker (0 to 2**32 - 1).
        name: Run name (one folder name under ``storage_path``: letters, digits, ``_-.``);
            default: class name + time. A run started again under the same name
            resumes from that run's newest complete checkpoint (Ray Train's behaviour).
        storage_path: Where runs are written; default ``$RAYMODEL_HOME/runs``.
            Any ``pyarrow.fs`` URI works (``s3://bucket/runs``).
        method: How a language model is trained: ``None`` (supervised), ``rm.GRPO(...)`` (with the
            class's rewards) or ``rm.DPO(...)`` (with preference pairs); a ``RayTransformersModel``'s.
        num_workers: Ray Train workers (one model replica each, DDP for torch).
            ``0`` runs the loop in this process (Ray Train's local mode), for debugging.
            ``(min, max)`` is an elastic run (Ray Train V2's elastic ``ScalingConfig``;
            torch and Lightning): it starts on as many workers as fit, up to ``max``,
            continues on fewer (down to ``min``) when a node is lost, from its newest
            checkpoint, and grows back when nodes join (see ``elastic_resize_s``).
        use_gpu: One GPU per worker; torch then uses NCCL instead of gloo.
        resources_per_worker: Ray resources of each worker, e.g. ``{"CPU": 2}``.
        strategy: How the torch and Lightning backends spread a model over the
            workers: ``"ddp"`` (default: a whole copy on every worker, gradients
            averaged) or ``"fsdp"`` (fully sharded data parallel: each worker holds
            its share of the weights, gradients and optimizer state; checkpoints are
            sharded). See "Big models" in the training guide.
        reshard_after_forward: With ``strategy="fsdp"`` (torch): free each unit's
            gathered weights after its forward and gather them again for the
            backward (default, the least memory), or keep them until the backward
            (one all-gather fewer per step, more memory).
        elastic_resize_s: How often a running elastic run looks for room to grow
            (Ray Train's ``elastic_resize_monitor_interval_s``); growing restarts the
            workers from the newest checkpoint.
        elastic_wait_s: How long an elastic run that lost a node waits for a worker
            group of its size before it continues on fewer workers (default 60 s;
            Ray Train's ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S``, for this run only).
        checkpoint_every: Write a checkpoint every this many epochs (the last
            epoch is always checkpointed).
        keep_checkpoints: How many checkpoints to keep (``None`` keeps all). With
            ``metric`` set, the best ones are kept.
        metric: Metric that ranks checkpoints for ``TrainResult.best_checkpoint``
            (e.g. ``"val_loss"``).
        mode: ``"min"`` or ``"max"``: whether a lower or higher ``metric`` is better.
        max_failures: Worker failures to recover from, from the latest checkpoint
            (Ray's ``FailureConfig``); ``-1`` retries forever.
        precision: ``"32"`` (default), ``"bf16-mixed"`` (bfloat16 autocast; works on
            CPU) or ``"16-mixed"`` (float16 autocast with a gradient scaler; needs
            ``use_gpu=True``). Torch and Lightning backends.
        accumulate_grad_batches: Step the optimizers every this many batches, on
            the summed gradients of the loss divided by it (a batch of ``batch_size``
            times this many, in memory for one). Torch and Lightning.
        grad_clip_norm: Clip the gradients' total 2-norm to this before each step.
        grad_clip_value: Clip each gradient element to ``[-value, value]`` before
            each step (one of the two clips at a time). Torch and Lightning.
        pool: Run on a resident worker group ("pool") of the training server
            (default): the workers' start-up is paid once per pool, not per run.
            ``False`` runs a one-off Ray Train run from this process.
        priority: The training server's queue order: higher first, first in first
            out among equals. A job that cannot fit may preempt running
            ``preemptible`` jobs of lower priority.
        preemptible: Whether a higher-priority job may preempt this one: it ends its
            epoch, writes a checkpoint, gives its workers back and waits (PENDING,
            "preempted by <id>"), then resumes from that checkpoint.
        resource_wait_s: How long a job of the training server waits for lost
            resources (a node gone) before it fails with an error naming what was
            missing; ``None`` (default) waits, as Ray does.
        progress: Print one line per epoch on the driver.
        verbose: Show Ray's own logs. Progress lines are printed either way
            unless ``progress=False``.
        callbacks: ``raymodel.Callback`` objects that receive every hook.
        nonfinite: What NaN or infinite values in array data do: ``"warn"`` (a
            warning naming the array), ``"error"`` (a ``DataError``) or ``"allow"``.
    """

    GROUPS: ClassVar[dict[str, tuple[str, ...]]] = {
        "run": ("num_epochs", "batch_size", "shuffle", "seed", "name", "storage_path", "method"),
        "placement": (
            "num_workers",
            "use_gpu",
            "resources_per_worker",
            "strategy",
            "reshard_after_forward",
            "elastic_resize_s",
            "elastic_wait_s",
        ),
        "checkpoints": ("checkpoint_every", "keep_checkpoints", "metric", "mode", "max_failures"),
        "step": ("precision", "accumulate_grad_batches", "grad_clip_norm", "grad_clip_value"),
        "scheduling": ("pool", "priority", "preemptible", "resource_wait_s"),
        "output": ("progress", "verbose", "callbacks", "nonfinite"),
    }

    # run: what is trained and where its files go
    num_epochs: int = 1
    batch_size: int = 32
    shuffle: bool = True
    seed: int = 0
    name: str | None = None
    storage_path: str | None = None
    method: Any = None
    # placement: the workers and how a model is spread over them
    num_workers: int | tuple[int, int] = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    strategy: str = "ddp"
    reshard_after_forward: bool = True
    elastic_resize_s: float = 60.0
    elastic_wait_s: float = 60.0
    # checkpoints: what is kept and what a failure resumes from
    checkpoint_every: int = 1
    keep_checkpoints: int | None = None
    metric: str | None = None
    mode: str = "min"
    max_failures: int = 0
    # step: the training step of torch and Lightning
    precision: str = "32"
    accumulate_grad_batches: int = 1
    grad_clip_norm: float | None = None
    grad_clip_value: float | None = None
    # scheduling: on the training server
    pool: bool = True
    priority: int = 0
    preemptible: bool = True
    resource_wait_s: float | None = None
    # output: what is printed, called and checked along the way
    progress: bool = True
    verbose: bool = False
    callbacks: Sequence[Any] = ()
    nonfinite: str = "warn"

    @property
    def elastic(self) -> bool:
        """Whether ``num_workers`` is an elastic ``(min, max)`` range."""
        return isinstance(self.num_workers, tuple)

    @property
    def on_pool(self) -> bool:
        """Whether a run of these settings goes to a pool of the training server: the one rule, for
        ``train``, ``tune``'s trials and the server's jobs. ``pool=True`` and a fixed number of workers;
        an elastic range and ``num_workers=0`` (this process) run one-off."""
        return self.pool and not isinstance(self.num_workers, tuple) and self.num_workers > 0

    @property
    def min_workers(self) -> int:
        return self.num_workers[0] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def max_workers(self) -> int:
        return self.num_workers[1] if isinstance(self.num_workers, tuple) else self.num_workers

    def _validate(self) -> list[str]:
        from raymodel.hooks import Callback

        if isinstance(self.callbacks, list):
            object.__setattr__(self, "callbacks", tuple(self.callbacks))  # frozen all the way down
        if isinstance(self.num_workers, list):
            object.__setattr__(self, "num_workers", tuple(self.num_workers))
        problems = collect(
            _check_workers(self.num_workers),
            check_int("priority", self.priority),
            check_type("preemptible", self.preemptible, (bool,), "True or False"),
            check_number("resource_wait_s", self.resource_wait_s, minimum=0, exclusive_min=True, allow_none=True),
            check_number("elastic_resize_s", self.elastic_resize_s, minimum=0, exclusive_min=True),
            check_number("elastic_wait_s", self.elastic_wait_s, minimum=0, exclusive_min=True),
            check_int("num_epochs", self.num_epochs, minimum=1),
            check_int("batch_size", self.batch_size, minimum=1),
            check_type("use_gpu", self.use_gpu, (bool,), "True or False"),
            check_int("max_failures", self.max_failures, minimum=-1),
            check_int("checkpoint_every", self.checkpoint_every, minimum=1),
            check_int("keep_checkpoints", self.keep_checkpoints, minimum=1, allow_none=True),
            check_type("metric", self.metric, (str,), "a metric name such as 'val_loss'", allow_none=True),
            check_choice("mode", self.mode, ("min", "max")),
            check_type("shuffle", self.shuffle, (bool,), "True or False"),
            check_int("seed", self.seed, minimum=0, maximum=MAX_SEED),
            check_name("name", self.name),
            check_type("storage_path", self.storage_path, (str,), "a path or URI string", allow_none=True),
            check_method(self.method),
            check_type("verbose", self.verbose, (bool,), "True or False"),
            check_type("progress", self.progress, (bool,), "True or False"),
            check_type("pool", self.pool, (bool,), "True or False"),
            check_resources("resources_per_worker", self.resources_per_worker),
            check_choice("nonfinite", self.nonfinite, ("warn", "error", "allow")),
            check_choice("precision", self.precision, PRECISIONS),
            check_choice("strategy", self.strategy, STRATEGIES),
            check_type("reshard_after_forward", self.reshard_after_forward, (bool,), "True or False"),
            check_int("accumulate_grad_batches", self.accumulate_grad_batches, minimum=1),
            check_number("grad_clip_norm", self.grad_clip_norm, minimum=0, exclusive_min=True, allow_none=True),
            check_number("grad_clip_value", self.grad_clip_value, minimum=0, exclusive_min=True, allow_none=True),
        )
        method = self.method
        if getattr(method, "kind", None) == "grpo" and not problems:
            step = self.batch_size * max(self.max_workers, 1)
            if step % method.num_generations:
                problems.append(
                    f"GRPO completes each prompt `num_generations={method.num_generations}` times, and a step's "
                    f"completions (`batch_size={self.batch_size}` per worker x {max(self.max_workers, 1)} "
                    f"worker(s) = {step}) must hold whole groups: make them divisible (e.g. `batch_size="
                    f"{method.num_generations}`)."
                )
        if self.grad_clip_norm is not None and self.grad_clip_value is not None:
            problems.append("Set one of `grad_clip_norm` and `grad_clip_value`, not both.")
        if self.precision == "16-mixed" and self.use_gpu is False:
            problems.append(
                "`precision='16-mixed'` needs a GPU (`use_gpu=True`): float16 autocast with a gradient "
                "scaler is a GPU feature. On CPU use `precision='bf16-mixed'`."
            )
        if self.strategy == "fsdp" and self.min_workers == 0:
            problems.append(
                "`strategy='fsdp'` shards the model over Ray Train workers; `num_workers=0` trains in this "
                "process. Use `num_workers=1` or more."
            )
        if self.strategy == "fsdp" and self.precision == "16-mixed":
            problems.append(
                "`strategy='fsdp'` with `precision='16-mixed'` is not supported (its gradient scaler does not "
                "work on sharded gradients); use `precision='bf16-mixed'`."
            )
        if isinstance(self.storage_path, str) and not self.storage_path.strip():
            problems.append("`storage_path` must not be empty (leave it out for `$RAYMODEL_HOME/runs`).")
        if not isinstance(self.callbacks, tuple):
            problems.append(f"`callbacks` must be a list of `raymodel.Callback` (got {self.callbacks!r}).")
        else:
            bad = [cb for cb in self.callbacks if not isinstance(cb, Callback)]
            if bad:
                problems.append(f"`callbacks` must hold `raymodel.Callback` instances (got {bad[0]!r}).")
        return problems


def _check_workers(value: Any) -> str | None:
    if isinstance(value, tuple):
        ok = len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        if ok and 1 <= value[0] <= value[1] <= LIMITS["num_workers"]:
            return None
        return (
            f"`num_workers` as a range must be `(min, max)` with 1 <= min <= max <= {LIMITS['num_workers']}, "
            f"e.g. `(1, 4)` (got {value!r})."
        )
    return check_int("num_workers", value, minimum=0)
