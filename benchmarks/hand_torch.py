"""The hand-written Ray Train side of the torch benchmarks: what a user writes with Ray Train V2 and plain
PyTorch for the digits MLP (train, validate, all-reduce the metrics, checkpoint and report each epoch).

It imports torch and Ray only (no raymodel), so that a fresh process running it pays what a user's
script would (``first_contact.py``).
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F


def hand_written_loop(config):
    """What a user writes by hand with Ray Train V2 and plain PyTorch."""
    import ray.train
    import ray.train.torch

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], 10))
    net = ray.train.torch.prepare_model(net)
    opt = torch.optim.Adam(net.parameters(), lr=config["lr"])
    Xtr, ytr, Xva, yva = (ray.get(r) for r in config["refs"])
    train = torch.utils.data.TensorDataset(torch.tensor(Xtr, dtype=torch.float32), torch.tensor(ytr))
    valid = torch.utils.data.TensorDataset(torch.tensor(Xva, dtype=torch.float32), torch.tensor(yva))
    train_loader = ray.train.torch.prepare_data_loader(
        torch.utils.data.DataLoader(train, batch_size=config["batch_size"], shuffle=True)
    )
    valid_loader = ray.train.torch.prepare_data_loader(
        torch.utils.data.DataLoader(valid, batch_size=config["batch_size"])
    )
    world = ray.train.get_context().get_world_size()
    for epoch in range(1, config["epochs"] + 1):
        if world > 1:
            train_loader.sampler.set_epoch(epoch)
        net.train()
        total, n = 0.0, 0
        for x, y in train_loader:
            opt.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            total, n = total + loss.item(), n + 1
        net.eval()
        correct, count, vloss = 0.0, 0, 0.0
        with torch.no_grad():
            for x, y in valid_loader:
                logits = net(x)
                vloss += F.cross_entropy(logits, y, reduction="sum").item()
                correct += (logits.argmax(1) == y).sum().item()
                count += len(y)
        stats = torch.tensor([total, n, vloss, correct, count], dtype=torch.float64)
        if world > 1:
            torch.distributed.all_reduce(stats)
        metrics = {
            "epoch": epoch,
            "loss": stats[0].item() / stats[1].item(),
            "val_loss": stats[2].item() / stats[4].item(),
            "val_acc": stats[3].item() / stats[4].item(),
        }
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0:
                module = net.module if hasattr(net, "module") else net
                torch.save({"model": module.state_dict(), "optimizer": opt.state_dict()}, os.path.join(tmp, "model.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(metrics, checkpoint=checkpoint)
