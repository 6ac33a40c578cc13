"""The torch training step's settings: precision (autocast, a gradient scaler), gradient
accumulation and clipping (``TrainSettings``), and the epoch's batches with a last-batch flag."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

import torch
from torch import nn


async def with_last(it: AsyncIterator[Any]) -> AsyncIterator[tuple[int, Any, bool]]:
    """``(index, item, is_last)``: one item of look-ahead (the batches are prefetched anyway)."""
    i, pending, have = 0, None, False
    async for item in it:
        if have:
            yield i, pending, False
            i += 1
        pending, have = item, True
    if have:
        yield i, pending, True


class StepControl:
    """Precision, gradient accumulation and clipping of one worker's optimizer steps
    (``TrainSettings.precision``, ``accumulate_grad_batches``, ``grad_clip_norm``/``grad_clip_value``)."""

    def __init__(self, settings: Any, device: torch.device) -> None:
        self.every = int(settings.accumulate_grad_batches)
        self.clip_norm, self.clip_value = settings.grad_clip_norm, settings.grad_clip_value
        self.dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(settings.precision)
        self.device_type = device.type
        self.scaler = torch.amp.GradScaler(device.type) if settings.precision == "16-mixed" else None
        self.modules: list[nn.Module] = []

    def autocast(self) -> Any:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """The loss over ``accumulate_grad_batches`` (the summed gradients are the big batch's mean)."""
        loss = loss / self.every if self.every > 1 else loss
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def clip(self, optimizers: list[Any]) -> None:
        if self.clip_norm is None and self.clip_value is None:
            return
        if self.scaler is not None:
            for opt in optimizers:
                self.scaler.unscale_(opt)  # clip the true gradients, not the scaled ones
        params = [p for m in self.modules for p in m.parameters() if p.grad is not None]
        if self.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, self.clip_norm)
        else:
            torch.nn.utils.clip_grad_value_(params, self.clip_value)

    def step(self, optimizers: list[Any]) -> None:
        self.clip(optimizers)
        for opt in optimizers:
            if self.scaler is not None:
                self.scaler.step(opt)
            else:
                opt.step()
        if self.scaler is not None:
            self.scaler.update()
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
