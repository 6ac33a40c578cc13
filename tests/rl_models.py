"""Reinforcement-learning models for the tests (an importable module: Ray's workers load them by name)."""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import torch.nn as nn

import raymodel as rm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from rl_cartpole import Balancer, StopAt, play  # the example's model is the tests' (and the benchmark's)

__all__ = ["Balancer", "QuickBalancer", "StopAt", "Swinger", "play"]


class QuickBalancer(Balancer):
    """``Balancer`` at a quarter of its samples and a third of its SGD passes an iteration (about 1 s
    of a 2-core machine, not 3): for the tests of what a run does (its rows, changes, faults, trials),
    not of what it learns."""

    default_config = {**Balancer.default_config, "train_batch_size_per_learner": 500, "num_epochs": 2}


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
