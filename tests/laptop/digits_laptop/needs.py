"""A model class whose module imports what the cluster lacks: ``rm_pixels`` (a package of the laptop's,
in ``runtime_env``'s ``py_modules``) and ``rm_offset`` (a pip requirement, in its ``pip``)."""

import rm_offset
import rm_pixels
import torch

from digits_laptop.model import LaptopDigits


class NeedsDigits(LaptopDigits):
    def forward(self, x):
        return self.net(rm_pixels.centred(x) + rm_offset.OFFSET)

    def validation_step(self, batch):
        seen = super().validation_step(batch)
        # What the worker imported: each package's mark, as a row's figures.
        return {**seen, "pixels_mark": torch.tensor(rm_pixels.MARK), "offset_mark": torch.tensor(rm_offset.MARK)}
