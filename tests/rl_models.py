"""Reinforcement-learning models for the tests (an importable module: Ray's workers load them by name)."""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import torch.nn as nn

import raymodel as rm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from rl_cartpole import Balancer, StopAt, play  # the example's model is the tests' (and the benchmark's)

__all__ = ["Balancer", "StopAt", "Swinger", "play"]


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
