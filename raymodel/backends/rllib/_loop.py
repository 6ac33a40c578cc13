"""``RLlibLoop``: one RLlib training iteration per epoch, for ``WorkerRun``.

The loop builds the ``AlgorithmConfig`` from the model (``algo_config``), builds the Algorithm in this
process (its learner is local; ``num_workers`` env runners sample in actors of their own), and trains
one ``algo.train()`` per epoch. A checkpoint holds the user's networks (``modules``, what
``predict``/``serve`` load) and RLlib's own state of the Algorithm (``algorithm``: the learner's
optimizer, the env runners' connectors, the counters), which a resumed run restores whole.
"""

from __future__ import annotations

import inspect
import math
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raymodel._internal import serialization, tmp
from raymodel.backends.rllib import NO_TF
from raymodel.contract import WorkerLoop

os.environ.setdefault(*NO_TF)  # a Tune trial's process, where RLlib is imported next

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm import Algorithm

#: What each iteration's history row takes from RLlib's result (row key -> path in the result).
ROW_KEYS = {
    "episode_return_mean": ("env_runners", "episode_return_mean"),
    "episode_len_mean": ("env_runners", "episode_len_mean"),
    "env_steps": ("env_runners", "num_env_steps_sampled"),
    "env_steps_total": ("num_env_steps_sampled_lifetime",),
}
#: The learner's figures kept in the row (those the algorithm reports; its ``total_loss`` is the row's ``loss``).
LEARNER_KEYS = ("policy_loss", "vf_loss", "entropy", "mean_kl_loss")


def algorithm_class(name_or_class: Any) -> type[Algorithm]:
    """The RLlib algorithm class of ``RayRLlibModel.algorithm`` (a name or the class itself)."""
    if isinstance(name_or_class, type):
        return name_or_class
    from ray.rllib.algorithms.registry import ALGORITHMS

    found: type[Algorithm] = ALGORITHMS[name_or_class]()[0]
    return found


def algo_config(model: Any, settings: Any, env_name: str) -> Any:
    """The ``AlgorithmConfig`` of ``model``: its env, the RLModule of its networks, the config keys RLlib's
    ``training()`` takes, the settings (env runners, seed), then the model's ``rllib_config`` hook."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from raymodel.backends.rllib._module import UserNetworks

    cls = algorithm_class(model.algorithm)
    blob = serialization.dumps((type(model), dict(model.config)), type(model))
    config = cls.get_default_config()
    trainable = training_keys(config)
    config = (
        config.environment(env_name, env_config={"raymodel": blob})
        .env_runners(num_env_runners=int(settings.num_workers))
        .learners(num_learners=0, num_gpus_per_learner=1 if settings.use_gpu else 0)
        .training(**{k: v for k, v in model.config.items() if k in trainable})
        .rl_module(
            rl_module_spec=RLModuleSpec(
                module_class=UserNetworks, model_config={"raymodel": blob, "has_value": model.has_value}
            )
        )
        .fault_tolerance(restart_failed_env_runners=True)
        .debugging(seed=int(settings.seed), log_level="ERROR")
    )
    adjusted = model.rllib_config(config)
    return config if adjusted is None else adjusted


def training_keys(config: Any) -> set[str]:
    """The keyword arguments of the algorithm's ``AlgorithmConfig.training()`` (its own and its bases')."""
    keys: set[str] = set()
    for cls in type(config).__mro__:
        if "training" in vars(cls):
            keys |= {p for p in inspect.signature(vars(cls)["training"]).parameters if p not in ("self", "kwargs")}
    return keys


def env_name(model: Any) -> str:
    """The name the model's env is registered under with Ray Tune's registry (RLlib resolves it there)."""
    from ray.tune.registry import register_env

    from raymodel.backends.rllib._module import make_env

    name = f"raymodel-{type(model).__module__}.{type(model).__qualname__}"
    register_env(name, make_env)
    return name


class RLlibLoop(WorkerLoop):
    """Builds the Algorithm after ``setup`` and trains one iteration per epoch."""

    #: The user's model: its networks, optimizers or booster are attributes that its ``setup`` and this loop set.
    model: Any

    def __init__(self, run: Any) -> None:
        super().__init__(run)
        self.algo: Any = None
        self.restored = False  # from RLlib's own checkpoint of the Algorithm (not just the networks)

    #: Scored on evaluation episodes of its env (``score``), not on a validation split.
    evaluates_without_data = True

    @property
    def has_validation(self) -> bool:
        return False

    def seed(self, seed: int) -> None:
        import torch

        torch.manual_seed(seed)  # the user's networks, built next (RLlib seeds its own from the config)

    def build(self) -> None:
        self.algo = algo_config(self.model, self.run.settings, env_name(self.model)).build_algo()

    def ready(self) -> None:
        """The instance's networks (its own init, or the weights it came with: a registry version trained
        further) are the learner's starting point, unless the Algorithm was restored whole."""
        if not self.restored:
            self._copy_in(self.model.backend.get_state(self.model)["modules"])

    async def train_epoch(self, epoch: int) -> dict[str, float]:
        started = time.perf_counter()
        result = self.algo.train()
        self._copy_out()
        return iteration_row(result, time.perf_counter() - started, module_id(self.algo))

    async def score(self) -> dict[str, float]:
        """RLlib's own evaluation (``Algorithm.evaluate``): episodes of the env with exploration off,
        ``evaluation_duration`` of them (10, unless the model's ``rllib_config`` sets it); their mean
        return and length (``val_episode_return_mean``, ``val_episode_len_mean``)."""
        result = self.algo.evaluate()
        runners = result.get("env_runners") or (result.get("evaluation") or {}).get("env_runners") or {}
        keys = ("episode_return_mean", "episode_len_mean")
        return {k: float(runners[k]) for k in keys if isinstance(runners.get(k), (int, float))}

    def apply_config(self, changes: dict[str, Any]) -> None:
        if "lr" in changes:
            set_lr(self.learner(), module_id(self.algo), float(changes["lr"]))

    def learner(self) -> Any:
        """The Algorithm's one Learner (``num_learners=0``: it lives in this process)."""
        (learner,) = [result.get() for result in self.algo.learner_group.foreach_learner(lambda learner: learner)]
        return learner

    def learner_module(self) -> Any:
        """The learner's RLModule (the one trained; the env runners get copies of its weights)."""
        return self.learner().module[module_id(self.algo)]

    # ---------------------------------------------------------------- state
    def get_state(self) -> dict[str, Any]:
        state = self.model.backend.get_state(self.model)
        staging = tmp.make("rllib")
        self.algo.save_to_path(str(staging))
        state["algorithm"] = _files(staging)
        shutil.rmtree(staging, ignore_errors=True)
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        files = state.get("algorithm")
        if files:
            with tmp.tempdir("rllib") as staging:
                for name, data in files.items():
                    (staging / name).parent.mkdir(parents=True, exist_ok=True)
                    (staging / name).write_bytes(data)
                self.algo.restore_from_path(str(staging))
            self.restored = True
            self._copy_out()
        else:  # only the networks
            self._copy_in(state.get("modules", {}))

    def _copy_in(self, modules: dict[str, Any]) -> None:
        """Networks' weights into the learner's module and the instance, then out to the env runners."""
        learner_module = self.learner_module()
        for name, sd in modules.items():
            getattr(learner_module, name).load_state_dict(sd)
        self.algo.env_runner_group.sync_weights(from_worker_or_learner_group=self.algo.learner_group)
        self._copy_out()

    def close(self) -> None:
        if self.algo is not None:
            self.algo.stop()
            self.algo = None

    def _copy_out(self) -> None:
        """The learner's networks into the user's instance (which checkpoints and ``after_fit`` see)."""
        trained = self.learner_module()
        for name, module in self.model.backend.modules(self.model).items():
            module.load_state_dict(getattr(trained, name).state_dict())


def module_id(algo: Any) -> str:
    """The id of the model's one RLModule, as the Algorithm's config names it (a single-agent config has
    one policy: RLlib's default id)."""
    (only,) = algo.config.policies
    return str(only)


def iteration_row(result: dict[str, Any], seconds: float, module: str) -> dict[str, float]:
    """One history row of an RLlib result: returns, lengths, env steps, the learner's losses (those of
    the RLModule ``module``), ``time_s``."""
    row: dict[str, float] = {}
    for key, path in ROW_KEYS.items():
        value: Any = result
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, (int, float)):
            row[key] = float(value)
    learner = (result.get("learners") or {}).get(module) or {}
    for key in LEARNER_KEYS:
        if isinstance(learner.get(key), (int, float)):
            row[key] = float(learner[key])
    if isinstance(learner.get("default_optimizer_learning_rate"), (int, float)):
        row["lr"] = float(learner["default_optimizer_learning_rate"])  # job.update's lr shows here
    total = learner.get("total_loss")
    row["loss"] = float(total) if isinstance(total, (int, float)) else math.nan
    row["time_s"] = float(seconds)
    return row


def set_lr(learner: Any, module: str, lr: float) -> None:
    """Every optimizer of the RLModule ``module`` at ``lr`` from now on: set through RLlib's public
    ``get_optimizers_for_module`` and torch's ``param_groups``; RLlib would set it back from its schedule
    after the next update, so the schedule is replaced too (``_private.py``: no public API does that)."""
    from raymodel.backends.rllib._private import replace_lr_schedule

    for _, optimizer in learner.get_optimizers_for_module(module):
        for group in optimizer.param_groups:
            group["lr"] = lr
        replace_lr_schedule(learner, optimizer, lr)


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
