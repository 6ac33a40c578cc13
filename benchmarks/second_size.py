"""A job of a second size: a 1-worker job after a 2-worker one, on a server with room for both pools.

A user who tries two worker counts (a 2-worker job, then a 1-worker one to compare) on a cluster of
4 CPUs. Each side is a fresh process joined to a head started before it, running the digits MLP
(2 workers x 3 epochs, then 1 worker x 3 epochs, batch 64, a checkpoint each epoch); the figure is the
1-worker job's time, from its call to its result:

- **raymodel, auto**: ``raymodel server start --num-cpus 4 --wait`` (its default ``auto``: a torch
  pool of 2 workers and, where the CPUs hold both, one of 1, started once the first is ready);
- **raymodel, torch:2 only**: ``--warm torch:2 --wait`` (what ``auto`` warmed before: the 1-worker job
  starts a pool of its own). raymodel against itself, labelled so;
- **hand-written**: ``ray start --head --num-cpus 4``, then ``ray.init()`` and two ``TorchTrainer``
  runs (``hand_torch.py``'s loop), each a new worker group.

The sides in turns, medians of ``--reps``; both get the Ray settings raymodel gives its instances
(``first_contact.py``'s ``RAY_ENV``). Nothing else should run meanwhile.

    python benchmarks/second_size.py [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from first_contact import EXAMPLES, HERE, TORCH, _cli, _digits, _median, _ray_init, no_ray_left, side_env

SIZES = (2, 1)
SIDES = ("auto", "torch:2", "hand")


def hand_sizes(marks: dict[str, float]) -> None:
    import os

    import ray
    from hand_torch import hand_written_loop
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    _ray_init(marks)
    refs = [ray.put(a) for a in _digits()]
    config = {"hidden": 64, "lr": 1e-3, "batch_size": 64, "epochs": TORCH["num_epochs"], "refs": refs}
    for workers in SIZES:
        began = time.time()
        result = TorchTrainer(
            hand_written_loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=workers),
            run_config=RunConfig(storage_path=os.environ["RAYMODEL_HOME"], name=f"hand-{time.time_ns()}"),
        ).fit()
        assert result.error is None and result.metrics["epoch"] == TORCH["num_epochs"]
        marks[f"job{workers}_s"] = time.time() - began


def rm_sizes(marks: dict[str, float]) -> None:
    from digits import DigitsNet

    import raymodel as rm

    rm.init()
    Xt, yt, Xv, yv = _digits()
    for workers in SIZES:
        began = time.time()
        result = DigitsNet().train({**TORCH, "num_workers": workers}, data={"train": (Xt, yt), "valid": (Xv, yv)})
        assert len(result.history) == TORCH["num_epochs"]
        marks[f"job{workers}_s"] = time.time() - began


CHILDREN = {"hand": hand_sizes, "rm": rm_sizes}


def run_child(name: str, env: dict[str, str]) -> dict[str, float]:
    done = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(next(x for x in reversed(done.stdout.splitlines()) if x.startswith("MARKS "))[6:])


def one(side: str, env: dict[str, str]) -> dict[str, float]:
    """Start the side's head, run its process, stop the head."""
    bin_dir = Path(sys.executable).parent
    no_ray_left()
    if side == "hand":
        start = [str(bin_dir / "ray"), "start", "--head", "--port", "6391", "--num-cpus", "4", "--disable-usage-stats"]
        started = _cli(start, env)
        try:
            marks = run_child("hand", {**env, "RAY_ADDRESS": "127.0.0.1:6391"})
        finally:
            _cli([str(bin_dir / "ray"), "stop", "--force"], env)
    else:
        warm = [] if side == "auto" else ["--warm", side]
        started = _cli([str(bin_dir / "raymodel"), "server", "start", "--num-cpus", "4", *warm, "--wait"], env)
        try:
            marks = run_child("rm", env)
        finally:
            _cli([str(bin_dir / "raymodel"), "server", "stop", "--grace-s", "0"], env)
    return {**marks, "start_s": started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path[:0] = [str(HERE), str(EXAMPLES)]
        marks: dict[str, float] = {}
        CHILDREN[args.child](marks)
        print("MARKS " + json.dumps(marks), flush=True)
        return
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="rm-second-size-") as home:
        env = {**side_env(home), "RAYMODEL_WARM": "auto"}
        for rep in range(args.reps):
            for side in SIDES if rep % 2 == 0 else tuple(reversed(SIDES)):
                runs[side].append(one(side, env))
                got = runs[side][-1]
                print(
                    f"  rep {rep + 1} {side}: start {got['start_s']:.1f} s, 2 workers {got['job2_s']:.1f} s, "
                    f"1 worker {got['job1_s']:.1f} s",
                    flush=True,
                )
    print("\nA 1-worker job after a 2-worker one, a head of 4 CPUs started earlier (medians [range]):")
    names = {"auto": "raymodel, auto (torch:2,torch:1)", "torch:2": "raymodel, torch:2 only", "hand": "hand-written"}
    for side in SIDES:
        start, job2, job1 = (_median([r[k] for r in runs[side]]) for k in ("start_s", "job2_s", "job1_s"))
        print(f"  {names[side]:34} head start {start}, 2-worker job {job2}, 1-worker job {job1}")
    median = {side: statistics.median(r["job1_s"] for r in runs[side]) for side in SIDES}
    print(f"  the 1-worker job, raymodel auto / hand-written: {median['auto'] / median['hand']:.2f}x")
    print(
        f"  the 1-worker job, raymodel auto / raymodel torch:2 only (raymodel against itself): "
        f"{median['auto'] / median['torch:2']:.2f}x"
    )


if __name__ == "__main__":
    main()
