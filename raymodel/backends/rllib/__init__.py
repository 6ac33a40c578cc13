"""Reinforcement learning: ``RayRLlibModel`` on RLlib's new API stack.

The user's class holds its own torch networks; raymodel builds the ``AlgorithmConfig`` (the env from
``make_env``, an ``RLModule`` that wraps the networks, ``ValueFunctionAPI`` for ``value``, the config
keys RLlib's ``training()`` takes), trains one ``algo.train()`` per epoch in an actor of its own, and
checkpoints the networks beside RLlib's own state of the Algorithm.

Hooks: every hook of ``raymodel.hooks`` but the batch and validation ones (an epoch is one training
iteration: RLlib samples and updates inside it; there is no validation split). An epoch's row holds
``episode_return_mean``, ``episode_len_mean``, ``env_steps``, the learner's losses and ``time_s``.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raymodel._internal.deps import require
from raymodel.backends.torch.backend import TorchBackend, TorchInference
from raymodel.contract import Model, OwnRuns, RunPlan, TrainingRun, WarmUp, rows_of
from raymodel.exceptions import ModelDefinitionError, SettingsError
from raymodel.model import RayModel

if TYPE_CHECKING:
    import torch

#: Algorithms whose RLModule raymodel builds from ``forward`` (and ``value``), and whether they need ``value``.
SUPPORTED = {"PPO": True, "IMPALA": True}
#: Keeps RLlib from importing TensorFlow (seconds and hundreds of MB per process) where it is installed.
NO_TF = ("RLLIB_TEST_NO_TF_IMPORT", "1")
#: RLlib's other new-stack algorithms: they need networks of another shape (Q-functions, target networks).
OTHERS = ("APPO", "BC", "CQL", "DQN", "DreamerV3", "IQL", "MARWIL", "SAC")


def learner_resources(use_gpu: bool) -> dict[str, float]:
    """What the Algorithm's process holds for its one learner (``num_learners=0``): a CPU, and a GPU with
    ``use_gpu``; its env runners hold a CPU each besides."""
    return {"CPU": 1.0, **({"GPU": 1.0} if use_gpu else {})}


def warm_algorithm_actor() -> None:
    """In a job's runner, ahead of its next job (``--warm rllib``): an Algorithm actor started on its
    node, importing what building an Algorithm imports, kept for the runner's next RLlib run."""
    from raymodel.backends.rllib._run import warm_kept

    warm_kept({NO_TF[0]: NO_TF[1]})


class PolicyInference(TorchInference):
    """A policy's answers: observations in (``{"obs": [...]}`` or rows), its greedy action out."""

    def forward(self, model: Model, x: Any) -> Any:
        raise ModelDefinitionError(
            f"`{type(model).__name__}` must define `forward(self, obs)` returning the action-distribution "
            "inputs (logits for a discrete action space; means and log-stds for a Box)."
        )

    def preprocess(self, model: Model, payload: Any) -> Any:
        import torch

        if isinstance(payload, dict):
            if "obs" not in payload:
                raise ValueError(f"expected {{'obs': [[...], ...]}}, got keys {sorted(payload)}")
            payload = payload["obs"]
        return torch.as_tensor(rows_of(payload))

    def postprocess(self, model: Model, output: Any) -> Any:
        """The greedy action: argmax for a discrete space, the mean for a Box (clipped to its bounds)."""
        return {"action": greedy(spaces_of(model)["action"], output).tolist()}

    def batch_output(self, model: Model, output: Any) -> dict[str, np.ndarray]:
        """``predict_batch``'s column: the greedy action of each row, as ``predict`` answers it."""
        return {"action": greedy(spaces_of(model)["action"], output)}


class AlgorithmRuns(OwnRuns):
    """RLlib's runs: an ``AlgorithmRun`` (``rllib/_run.py``), the plan's ``WorkerRun`` in an actor holding
    the learner; a Tune trial of it placed as RLlib's ``Algorithm.default_resource_request`` places it."""

    def make_run(self, plan: RunPlan) -> TrainingRun:
        from raymodel.backends.rllib._run import AlgorithmRun

        return AlgorithmRun(plan, learner_resources(plan.use_gpu), env={NO_TF[0]: NO_TF[1]})

    def trial_bundles(self, num_workers: int, use_gpu: bool) -> list[dict[str, float]]:
        """With ``num_learners=0``: the Algorithm's process with its learner's CPU (and GPU), then one CPU
        per env runner, each env runner in the bundle of its index."""
        return [learner_resources(use_gpu)] + [{"CPU": 1.0} for _ in range(int(num_workers))]


class RLlibBackend(TorchBackend):
    name = "rllib"
    extra = "rllib"
    imports = ("torch", "gymnasium", "ray.rllib")
    pool = None  # its runs are an Algorithm in an actor of its own: never on a pool
    warm_up = WarmUp(runner_call="raymodel.backends.rllib:warm_algorithm_actor")  # `--warm rllib`: its process
    packages = ("torch", "gymnasium")
    training = AlgorithmRuns("raymodel.backends.rllib._loop:RLlibLoop")  # not a Ray Train run
    inference = PolicyInference()
    accepts = ()
    needs_data = False
    epoch_unit = "iteration"
    default_metric = ("episode_return_mean", "max")
    required_methods = ("setup", "make_env", "forward")
    hook_notes = {
        "before_batch": "no (RLlib batches inside an iteration)",
        "after_batch": "no (RLlib batches inside an iteration)",
        "before_validation": "no (no validation split)",
        "after_validation": "no (no validation split)",
    }
    state_keys = ("modules", "algorithm", "spaces")
    gradient_steps = False
    elastic = False
    strategies = ()  # one learner in the Algorithm's process: no strategy spreads it

    def import_framework(self) -> None:
        """torch and gymnasium (the checks build the env and the networks); RLlib is looked for, not
        imported (a second of a job's start): only the Algorithm's actor imports it."""
        os.environ.setdefault(*NO_TF)  # RLlib imports TensorFlow when it is installed; raymodel's RLlib is torch
        logging.getLogger("ray.rllib.utils.framework").setLevel(logging.ERROR)  # "Not importing TensorFlow"
        require("torch", self.extra)
        require("gymnasium", self.extra)
        if importlib.util.find_spec("ray.rllib") is None or importlib.util.find_spec("tree") is None:
            require("ray.rllib", self.extra)  # raises, naming the extra

    # ------------------------------------------------------------- checking
    def validate_model(self, model: Model) -> None:
        super().validate_model(model)
        name = _algorithm_name(model)
        if SUPPORTED[name] and not model.has_value:  # type: ignore[attr-defined]
            raise ModelDefinitionError(
                f"`{type(model).__name__}` trains with {name}, an actor-critic algorithm: define "
                "`value(self, obs)` returning one value per observation, e.g. `self.vf(obs).squeeze(-1)`."
            )
        spaces_of(model, check=True)

    def input_signature(self, model: Model, spec: Any) -> dict[str, Any] | None:
        """The env's observation space; a non-finite observation is refused (no env makes one)."""
        return {**spaces_of(model)["observation"], "nonfinite": "error"}

    # ---------------------------------------------------------------- state
    def get_state(self, model: Model) -> dict[str, Any]:
        return {"modules": {k: m.state_dict() for k, m in self.modules(model).items()}, "spaces": spaces_of(model)}

    def write_state(self, model: Model, state: dict[str, Any], directory: Path) -> None:
        import torch

        torch.save({"modules": state["modules"]}, directory / "model.pt")  # torch's own format
        (directory / "spaces.json").write_text(json.dumps(state.get("spaces")))
        for name, data in (state.get("algorithm") or {}).items():  # RLlib's own checkpoint of the Algorithm
            target = directory / "algorithm" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

    def read_state(self, model: Model, directory: Path) -> dict[str, Any]:
        import torch

        state = torch.load(directory / "model.pt", map_location="cpu", weights_only=False)
        spaces = directory / "spaces.json"
        if spaces.exists():
            state["spaces"] = json.loads(spaces.read_text())
        algorithm = directory / "algorithm"
        if algorithm.is_dir():
            state["algorithm"] = {
                p.relative_to(algorithm).as_posix(): p.read_bytes() for p in algorithm.rglob("*") if p.is_file()
            }
        return state

    def set_state(self, model: Model, state: dict[str, Any]) -> None:
        super().set_state(model, {"modules": state.get("modules", {})})
        if state.get("spaces"):
            model._spaces = state["spaces"]  # type: ignore[attr-defined]


def greedy(action: dict[str, Any], output: torch.Tensor) -> np.ndarray:
    """The greedy action of action-distribution inputs ``output`` for ``action`` (``spaces_of``)."""
    values = output.detach().cpu().numpy()
    if action["kind"] == "discrete":
        return values.argmax(-1)
    dim = int(np.prod(action["shape"]))
    mean = values[..., :dim].reshape(values.shape[:-1] + tuple(action["shape"]))
    return np.clip(mean, np.asarray(action["low"]), np.asarray(action["high"]))


def spaces_of(model: Any, check: bool = False) -> dict[str, Any]:
    """``{"observation": signature, "action": {...}}`` of the model's env: from its checkpoint when it
    has one, else from ``make_env``. With ``check``, ``forward`` (and ``value``) run on one zero
    observation and their shapes are checked against the spaces."""
    known = getattr(model, "_spaces", None)
    if known is not None and not check:
        return known
    import gymnasium as gym

    env = model.make_env(dict(model.config))
    try:
        obs_space, act_space = env.observation_space, env.action_space
    finally:
        env.close()
    where = f"`{type(model).__name__}.make_env`"
    if not isinstance(obs_space, gym.spaces.Box):
        raise ModelDefinitionError(f"{where} gives an observation space {obs_space}; raymodel takes a Box.")
    if isinstance(act_space, gym.spaces.Discrete):
        action: dict[str, Any] = {"kind": "discrete", "n": int(act_space.n)}
        wanted = int(act_space.n)
    elif isinstance(act_space, gym.spaces.Box):
        action = {
            "kind": "box",
            "shape": [int(n) for n in act_space.shape],
            "low": act_space.low.tolist(),
            "high": act_space.high.tolist(),
        }
        wanted = 2 * int(np.prod(act_space.shape))  # a diagonal Gaussian's means and log-stds
    else:
        raise ModelDefinitionError(
            f"{where} gives an action space {act_space}; raymodel takes Discrete or Box (multi-agent and "
            "composite spaces: use RLlib directly)."
        )
    spaces = {"observation": {"shape": [int(n) for n in obs_space.shape], "dtype": "float32"}, "action": action}
    if check:
        _check_shapes(model, spaces, wanted, where)
    model._spaces = spaces
    return spaces


def _check_shapes(model: Any, spaces: dict[str, Any], wanted: int, where: str) -> None:
    import torch

    probe = type(model)(config=model.config)
    probe.ensure_setup()
    obs = torch.zeros((1, *spaces["observation"]["shape"]), dtype=torch.float32)
    with torch.no_grad():
        try:
            out = probe.forward(obs)
        except Exception as exc:
            raise ModelDefinitionError(
                f"`{type(model).__name__}.forward` fails on an observation of the env's shape "
                f"{tuple(obs.shape)}: {type(exc).__name__}: {exc}"
            ) from exc
        if tuple(out.shape) != (1, wanted):
            kind = "logits, one per action" if spaces["action"]["kind"] == "discrete" else "means and log-stds"
            raise ModelDefinitionError(
                f"`{type(model).__name__}.forward` returns shape {tuple(out.shape)} for one observation, but "
                f"{where}'s action space {spaces['action']} needs (1, {wanted}) ({kind})."
            )
        if model.has_value:
            value = probe.value(obs)
            if tuple(value.shape) != (1,):
                raise ModelDefinitionError(
                    f"`{type(model).__name__}.value` returns shape {tuple(value.shape)} for one observation; "
                    "it must return one value per observation, shape (1,) (e.g. `self.vf(obs).squeeze(-1)`)."
                )


def _algorithm_name(model: Any) -> str:
    algorithm = model.algorithm
    name = algorithm if isinstance(algorithm, str) else getattr(algorithm, "__name__", repr(algorithm))
    if name in SUPPORTED:
        return name
    if name in OTHERS:
        raise SettingsError(
            f"`algorithm = {name!r}`: its RLlib module needs networks of another shape than `forward`/`value` "
            f"(Q-functions, target networks). RayRLlibModel builds modules for {', '.join(SUPPORTED)}."
        )
    close = difflib.get_close_matches(name, [*SUPPORTED, *OTHERS], n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise SettingsError(f"`algorithm = {name!r}` is not an RLlib algorithm.{hint} Supported: {', '.join(SUPPORTED)}.")


class RayRLlibModel(RayModel):
    """A reinforcement-learning policy of the user's own torch networks, trained with RLlib.

    Set ``algorithm`` ("PPO" by default, or "IMPALA", or the algorithm's class), define
    ``make_env(config)`` (a gymnasium env), ``setup(config)`` (assign ``torch.nn`` modules to
    attributes), ``forward(obs)`` (action-distribution inputs: logits for a Discrete action space,
    means and log-stds for a Box) and ``value(obs)`` (one value per observation). Config keys that
    RLlib's ``training()`` takes (``lr``, ``gamma``, ``train_batch_size_per_learner``, ...) go to it;
    ``rllib_config`` adjusts anything else. ``num_workers`` is the number of env runners (0: sample
    in the learner's process); an epoch is one training iteration.

    Example:
        >>> class Balancer(rm.RayRLlibModel):
        ...     algorithm = "PPO"
        ...     default_config = {"lr": 3e-4}
        ...     def make_env(self, config):
        ...         return gym.make("CartPole-v1")
        ...     def setup(self, config):
        ...         self.pi = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))
        ...         self.vf = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 1))
        ...     def forward(self, obs):
        ...         return self.pi(obs)
        ...     def value(self, obs):
        ...         return self.vf(obs).squeeze(-1)
        >>> Balancer().train({"num_workers": 1, "num_epochs": 20})
        >>> model.predict({"obs": [[0.0, 0.1, 0.02, -0.1]]})
        {'action': [0]}
    """

    backend = RLlibBackend()
    #: The RLlib algorithm: "PPO", "IMPALA", or its class.
    algorithm: Any = "PPO"

    def make_env(self, config: dict[str, Any]) -> Any:
        """A gymnasium env for ``config``: built on every env runner, and once to read its spaces."""
        raise ModelDefinitionError(f"`{type(self).__name__}` must define `make_env(self, config)`.")

    def value(self, obs: Any) -> Any:
        """The value of each observation (actor-critic algorithms), shape ``(N,)``."""
        raise ModelDefinitionError(f"`{type(self).__name__}` must define `value(self, obs)`.")

    @property
    def has_value(self) -> bool:
        """Whether the class defines ``value``."""
        return type(self).value is not RayRLlibModel.value

    def rllib_config(self, algo_config: Any) -> Any:
        """Adjust RLlib's ``AlgorithmConfig`` before the Algorithm is built (learners, GPUs, rollout
        lengths, exploration): return the adjusted config (``algo_config.training(...)`` returns it)."""
        return algo_config


__all__ = ["RayRLlibModel", "RLlibBackend"]
