"""Reinforcement learning on CartPole-v1: PPO with your own torch networks, from one class.

Trains on RLlib's new API stack (1 env runner) until the mean return reaches 150, plots the return
curve, plays the trained policy greedily with the instance's own networks, and serves it over HTTP.

python examples/rl_cartpole.py
"""

from __future__ import annotations

import gymnasium as gym
import requests
import torch.nn as nn

import raymodel as rm

TARGET = 150.0


class Balancer(rm.RayRLlibModel):
    algorithm = "PPO"
    default_config = {"lr": 3e-4, "train_batch_size_per_learner": 2000, "num_epochs": 6, "minibatch_size": 128}

    def make_env(self, config):
        return gym.make("CartPole-v1")

    def setup(self, config):
        self.pi = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))  # action logits
        self.vf = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 1))  # state value

    def forward(self, obs):
        return self.pi(obs)

    def value(self, obs):
        return self.vf(obs).squeeze(-1)

    def hyperparameter_space(self):
        return {"lr": rm.tune.choice([3e-4, 1e-3])}


class StopAt(rm.Callback):
    """Ends the run (with a checkpoint) once the mean return reaches ``target``."""

    def __init__(self, target: float) -> None:
        self.target = target

    def after_epoch(self, epoch, metrics):
        if metrics.get("episode_return_mean", 0.0) >= self.target:
            self.context.should_stop = True


def play(model, episodes: int = 3) -> float:
    """The mean return of the model's greedy actions over a few episodes."""
    env, total = model.make_env(model.config), 0.0
    for seed in range(episodes):
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            action = model.predict({"obs": [obs.tolist()]})["action"][0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
    return total / episodes


if __name__ == "__main__":
    rm.init(num_cpus=2)
    model = Balancer()
    result = model.train({"num_workers": 1, "num_epochs": 30, "callbacks": [StopAt(TARGET)]})
    result.plot("demo-output/rl_cartpole.png")
    print(f"mean return {result.metrics['episode_return_mean']:.1f} after {len(result.history)} iterations")
    print(f"the trained network plays greedily: mean return {play(model):.1f}")
    served = model.serve("/balance")
    answer = requests.post(served.url, json={"obs": [[0.0, 0.1, 0.02, -0.1]]}, timeout=30).json()
    print(f"POST {served.url} {{'obs': [[0.0, 0.1, 0.02, -0.1]]}} -> {answer}")
    served.shutdown()
