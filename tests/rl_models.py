"""Reinforcement-learning models for the tests (an importable module: Ray's workers load them by name)."""

from __future__ import annotations

import gymnasium as gym
import torch.nn as nn

import raymodel as rm

#: Hand-written PPO's figures on CartPole (the issue's anchor): lr 3e-4, 2000 steps, 6 SGD epochs, minibatch 128.
PPO_CARTPOLE = {"lr": 3e-4, "train_batch_size_per_learner": 2000, "num_epochs": 6, "minibatch_size": 128}


class Balancer(rm.RayRLlibModel):
    """PPO on CartPole-v1 with the user's own policy and value networks."""

    algorithm = "PPO"
    default_config = {"hidden": 64, **PPO_CARTPOLE}

    def make_env(self, config):
        return gym.make("CartPole-v1")

    def setup(self, config):
        self.pi = nn.Sequential(nn.Linear(4, config["hidden"]), nn.Tanh(), nn.Linear(config["hidden"], 2))
        self.vf = nn.Sequential(nn.Linear(4, config["hidden"]), nn.Tanh(), nn.Linear(config["hidden"], 1))

    def forward(self, obs):
        return self.pi(obs)

    def value(self, obs):
        return self.vf(obs).squeeze(-1)


class Swinger(rm.RayRLlibModel):
    """PPO on Pendulum-v1: a Box action, ``forward`` gives its mean and log-std."""

    algorithm = "PPO"
    default_config = {"lr": 1e-3, "train_batch_size_per_learner": 512, "num_epochs": 2, "minibatch_size": 128}

    def make_env(self, config):
        return gym.make("Pendulum-v1")

    def setup(self, config):
        self.pi = nn.Sequential(nn.Linear(3, 32), nn.Tanh(), nn.Linear(32, 2))
        self.vf = nn.Sequential(nn.Linear(3, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, obs):
        return self.pi(obs)

    def value(self, obs):
        return self.vf(obs).squeeze(-1)


class StopAt(rm.Callback):
    """Ends the run (with a checkpoint) once the mean return reaches ``target``."""

    def __init__(self, target: float) -> None:
        self.target = target

    def after_epoch(self, epoch, metrics):
        if metrics.get("episode_return_mean", 0.0) >= self.target:
            self.context.should_stop = True


def play(model, episodes: int = 3, seed: int = 0) -> float:
    """The mean return of ``model``'s greedy actions (``predict``) over ``episodes`` of its env."""
    env = model.make_env(model.config)
    total = 0.0
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done = False
        while not done:
            action = model.predict({"obs": [obs.tolist()]})["action"][0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
    return total / episodes
