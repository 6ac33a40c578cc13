"""What an idle instance costs: the CPU that a local Ray instance's processes spend doing nothing.

A user calls ``rm.init()`` (or ``ray.init()``) and then reads, thinks, writes code: the instance's
processes keep running. Each side here is a fresh process that starts its instance, waits
``--settle-s`` for the starts to end, then measures, over ``--window-s``, the CPU time of every process
that started after it did (the instance's daemons and actors, and itself):

- **hand-written**: ``ray.init()``, a plain local instance (its dashboard: Train V2 needs it), with
  the Ray settings raymodel gives its instances (``first_contact.py``'s ``RAY_ENV``);
- **raymodel, no pool**: ``rm.init(warm="none")``: the training server's actors beside it;
- **raymodel**: ``rm.init()`` as a user calls it: the warm torch:2 pool too (its Train controller,
  synchronization actor and two workers), what makes a first job take under a second. raymodel's
  default against the plain instance: it holds more, and is labelled so.

Prints CPU-s a minute for each side, its processes by kind, and each side's ratio to the
hand-written one. Nothing else should run meanwhile (the figures are small: another process's work
is not counted, but it slows these).

    python benchmarks/idle_cost.py [--settle-s 30] [--window-s 60]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from first_contact import no_ray_left, side_env

SIDES = ("hand", "raymodel-no-pool", "raymodel")
LABELS = {"hand": "hand-written", "raymodel-no-pool": "raymodel, no pool", "raymodel": "raymodel (warm pool)"}


def _kind(cmdline: list[str], name: str) -> str:
    """A process's kind: its Ray title's class (``ray::TrainController.run`` -> ``TrainController``), or
    its program's name (``gcs_server``, ``raylet``, the dashboard's and the agents' scripts)."""
    first = cmdline[0] if cmdline else name
    if first.startswith("ray::"):
        return re.split(r"[.:]", first[len("ray::") :])[0] or first
    for part in cmdline[:3]:
        if part.endswith(".py"):
            return Path(part).stem
    return Path(first).name or name


def measure(side: str, settle_s: float, window_s: float) -> dict[str, float]:
    """In the child: start the side's instance, settle, and return CPU-s by kind over the window."""
    import psutil

    began = time.time() - 1.0
    if side == "hand":
        import ray

        ray.init(address="local", logging_level="ERROR", log_to_driver=False)
    else:
        import raymodel as rm

        rm.init(warm="none" if side == "raymodel-no-pool" else None)
    time.sleep(settle_s)

    def cpu() -> dict[int, tuple[str, float]]:
        seen = {}
        for process in psutil.process_iter(["pid", "name", "cmdline", "create_time"]):
            try:
                if process.info["create_time"] < began:
                    continue
                times = process.cpu_times()
                kind = _kind(process.info["cmdline"] or [], process.info["name"])
                seen[process.pid] = (kind, times.user + times.system)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return seen

    before = cpu()
    time.sleep(window_s)
    after = cpu()
    by_kind: dict[str, float] = {}
    for pid, (kind, spent) in after.items():
        if pid in before:
            by_kind[kind] = by_kind.get(kind, 0.0) + (spent - before[pid][1]) * 60.0 / window_s
    return by_kind


def run_side(side: str, settle_s: float, window_s: float) -> dict[str, float]:
    home = tempfile.mkdtemp(prefix="rm-idle-")
    env = {**side_env(home), "HOME": home}  # a fresh home: no server of another run is joined
    args = [sys.executable, __file__, "--child", side, "--settle-s", str(settle_s), "--window-s", str(window_s)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=settle_s + window_s + 300)
    if done.returncode:
        raise SystemExit(f"{side} failed:\n{done.stderr[-3000:]}")
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    no_ray_left()
    return json.loads(line[len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settle-s", type=float, default=30.0)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(measure(args.child, args.settle_s, args.window_s)), flush=True)
        os._exit(0)  # the instance ends with this process; its figures are out
    no_ray_left()
    results = {}
    for side in SIDES:
        said = f"settling {args.settle_s:.0f} s, measuring {args.window_s:.0f} s"
        print(f"{LABELS[side]}: starting, {said} ...", flush=True)
        results[side] = run_side(side, args.settle_s, args.window_s)
    hand = sum(results["hand"].values())
    print(f"\nCPU-s a minute, idle (settled {args.settle_s:.0f} s, measured over {args.window_s:.0f} s)")
    for side in SIDES:
        total = sum(results[side].values())
        kinds = sorted(results[side].items(), key=lambda kv: -kv[1])
        top = ", ".join(f"{kind} {spent:.2f}" for kind, spent in kinds[:8])
        print(f"  {LABELS[side]:22s} {total:6.2f}  ({total / hand:.2f}x hand-written; {len(kinds)} kinds)  {top}")


if __name__ == "__main__":
    main()
