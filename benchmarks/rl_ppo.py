"""PPO on CartPole-v1: RLlib written by hand against ``RayRLlibModel``, in one run, to a mean return of 450.

Both sides train the same PPO configuration (lr 3e-4, ``train_batch_size_per_learner`` 2000, 6 SGD
epochs, minibatch 128, one env runner, the same two-layer tanh policy and value networks, the same seed):

- **hand-written**: ``PPOConfig().environment(...).env_runners(...).training(...)`` with an
  ``RLModuleSpec`` of a ``TorchRLModule`` + ``ValueFunctionAPI``, ``build_algo()``, ``train()`` in a
  loop in this process;
- **raymodel**: ``Balancer().train(...)`` on a running training server (a job; each iteration one
  history row and a checkpoint).

For each: seconds to build and run the first iteration (raymodel: from submitting to the first row),
wall seconds per iteration (the median), iterations to a mean return of 150 and of 450, total wall.
The hand-written first iteration is measured twice: in this process, whose RLlib is imported already,
and as a script a user starts (a fresh interpreter that imports RLlib, joins the same cluster, builds
and trains once), which is what the raymodel job's fresh processes pay too. Ratios are raymodel /
hand-written.

    python benchmarks/rl_ppo.py [--max-iterations 40] [--target 450]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

#: The PPO configuration of both sides (``examples/rl_cartpole.py``'s ``Balancer.default_config``, checked).
PPO = {"lr": 3e-4, "train_batch_size_per_learner": 2000, "num_epochs": 6, "minibatch_size": 128}


def hand_written(max_iterations: int, target: float) -> dict[str, float]:
    import torch
    import torch.nn as nn
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.rl_module.apis import ValueFunctionAPI
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.core.rl_module.torch import TorchRLModule

    class Module(TorchRLModule, ValueFunctionAPI):
        def setup(self):
            self.pi = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))
            self.vf = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 1))

        def _forward(self, batch, **kwargs):
            return {Columns.ACTION_DIST_INPUTS: self.pi(batch[Columns.OBS])}

        def compute_values(self, batch, embeddings=None):
            return self.vf(batch[Columns.OBS]).squeeze(-1)

    torch.set_num_threads(1)  # the learner's share, as Ray gives the raymodel side's actor (1 CPU)
    start = time.perf_counter()
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=1)
        .training(**PPO)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=Module))
        .debugging(seed=0)
    )
    algo = config.build_algo()
    returns, times = [], []
    first = None
    for _ in range(max_iterations):
        began = time.perf_counter()
        result = algo.train()
        times.append(time.perf_counter() - began)
        first = first or time.perf_counter() - start
        returns.append(result["env_runners"].get("episode_return_mean", float("nan")))
        if returns[-1] >= target:
            break
    total = time.perf_counter() - start
    algo.stop()
    return _figures(first, times, returns, total)


def hand_written_script() -> float:
    """Seconds from starting a fresh interpreter to its first ``train()`` result (``--child``)."""
    import ray

    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    started = time.time()
    out = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["done"] - started


def _child() -> None:
    import ray

    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
    hand_written(1, float("inf"))
    print(json.dumps({"done": time.time()}))


def through_raymodel(max_iterations: int, target: float) -> dict[str, float]:
    from rl_cartpole import Balancer

    import raymodel as rm

    class Stop(rm.Callback):
        def after_epoch(self, epoch, metrics):
            if metrics.get("episode_return_mean", 0.0) >= target:
                self.context.should_stop = True

    rm.jobs.server()  # running, as a user's server would be
    start = time.perf_counter()
    job = Balancer().train(
        {"num_workers": 1, "num_epochs": max_iterations, "callbacks": [Stop()], "progress": False}, wait=False
    )
    first = None
    for _row in job.stream():
        first = first or time.perf_counter() - start
    result = job.wait()
    total = time.perf_counter() - start
    rows = result.history
    return _figures(first, [r["time_s"] for r in rows], [r["episode_return_mean"] for r in rows], total)


def _figures(first: float | None, times: list[float], returns: list[float], total: float) -> dict[str, float]:
    def reached(level: float) -> float:
        return next((i + 1 for i, r in enumerate(returns) if r >= level), float("nan"))

    return {
        "first_iteration_s": float(first or float("nan")),
        "s_per_iteration": statistics.median(times),
        "iterations_to_150": reached(150.0),
        "iterations_to_450": reached(450.0),
        "iterations": len(returns),
        "final_return": returns[-1],
        "total_s": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-iterations", type=int, default=40)
    parser.add_argument("--target", type=float, default=450.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child()
        return
    from rl_cartpole import Balancer

    import raymodel as rm

    assert Balancer.default_config == PPO, "the example's PPO configuration changed: update PPO here"
    rm.init(num_cpus=2)
    hand = hand_written(args.max_iterations, args.target)
    cold = hand_written_script()
    ours = through_raymodel(args.max_iterations, args.target)
    print(f"PPO on CartPole-v1 to a mean return of {args.target:g} (max {args.max_iterations} iterations), 2 CPUs")
    print(f"{'figure':<22}{'hand-written':>14}{'raymodel':>12}{'ratio':>8}")
    for key in hand:
        ratio = ours[key] / hand[key] if hand[key] else float("nan")
        print(f"{key:<22}{hand[key]:>14.2f}{ours[key]:>12.2f}{ratio:>8.2f}")
    first = ours["first_iteration_s"]
    print(f"{'first, as a script':<22}{cold:>14.2f}{first:>12.2f}{first / cold:>8.2f}")


if __name__ == "__main__":
    main()
