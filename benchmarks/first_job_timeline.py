"""Where a first job's seconds go: a timeline of one fresh process, from its start to its result.

The process imports raymodel, starts Ray (`rm.init`), submits one small job and waits for it; the
steps it sees are timed here, and the actors the job needed (the training server, the pool's actor,
Ray Train's controller and its helpers, each worker) are read from Ray's task events afterwards:
when each actor was asked for, when a worker process took it, and when its constructor returned.
Every time is seconds from the interpreter's start (the process's start time in /proc).

    python benchmarks/first_job_timeline.py [--backend torch|rllib|transformers]

This is raymodel measured alone (no other side): it says where the time goes, not how it compares.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

STARTED = time.time()  # before any import of ours


def process_start() -> float:
    """The interpreter's start (wall clock): what `time python script.py` counts from. From /proc: the
    process's start and the time since boot, both in the boot clock (``btime``, whole seconds, would put
    the start up to a second off)."""
    since_boot_then = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    now, since_boot_now = time.time(), float(Path("/proc/uptime").read_text().split()[0])
    return now - (since_boot_now - since_boot_then)


def job_for(backend: str):
    """The model, settings and data of the backend's small first job."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    if backend == "torch":
        from digits import DigitsNet, load_data as load_arrays

        import raymodel as rm

        X, y = load_arrays()
        data = rm.data.from_numpy(X.astype("float32"), y, valid_fraction=0.2)
        return DigitsNet(), {"num_workers": 2, "num_epochs": 3, "batch_size": 64, "progress": False}, data
    if backend == "rllib":
        from rl_cartpole import Balancer

        return Balancer(), {"num_workers": 1, "num_epochs": 1, "progress": False}, None
    from transformers_sentiment import Sentiment, sentiment_data

    settings = {"num_workers": 2, "num_epochs": 1, "batch_size": 16, "progress": False}
    return Sentiment(), settings, sentiment_data(256, 64)


def actor_events(since: float) -> list[tuple[str, float, float, float]]:
    """``(actor class, asked, placed, ready)`` of each actor made since ``since`` (seconds, wall clock)."""
    from ray.util.state import list_tasks

    rows = []
    for task in list_tasks(detail=True, filters=[("type", "=", "ACTOR_CREATION_TASK")], limit=10_000):
        events = {e["state"]: e["created_ms"] / 1000 for e in (task.events or [])}
        asked = min(events.values(), default=0.0)
        if asked < since:
            continue
        placed = events.get("RUNNING", asked)  # a worker process took it: its constructor starts
        ready = events.get("FINISHED", events.get("RUNNING", placed))
        name = (task.func_or_class_name or task.name or "?").split(".")[0]
        rows.append((name, asked, placed, ready))
    return sorted(rows, key=lambda r: r[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("torch", "rllib", "transformers"), default="torch")
    args = parser.parse_args()
    zero = process_start()
    marks = [("interpreter start", zero), ("script's first line", STARTED)]

    import raymodel as rm

    marks.append(("import raymodel", time.time()))
    model, settings, data = job_for(args.backend)
    marks.append(("model and data made (framework imported)", time.time()))
    rm.init()
    marks.append(("rm.init (Ray started, dashboard up)", time.time()))
    job = model.train(settings, data=data, wait=False)
    marks.append(("job submitted (training server up)", time.time()))
    first = next(iter(job.stream()))
    marks.append((f"first row in this process (epoch {first['epoch']})", time.time()))
    result = job.wait()
    marks.append(("result in this process", time.time()))

    print(f"first {args.backend} job in a fresh process: seconds from the interpreter's start")
    for what, at in marks:
        print(f"  {at - zero:7.2f}  {what}")
    print("actors it needed (asked -> a worker process runs its constructor -> the constructor returned):")
    for name, asked, placed, ready in actor_events(since=zero):
        print(f"  {asked - zero:7.2f} -> {placed - zero:7.2f} -> {ready - zero:7.2f}  ({ready - asked:5.2f} s)  {name}")
    assert [row["epoch"] for row in result.history] == list(range(1, settings["num_epochs"] + 1)), result.history


if __name__ == "__main__":
    main()
