"""A module of the package beside the model's: it travels with the model class, by value."""

import torch.nn as nn


def mlp(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
