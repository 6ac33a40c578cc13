"""First contact: a user's first job, each side a fresh Python process timed from its start to its end.

Three jobs, each against its hand-written Ray form (the same model, data, workers and steps):

- **torch**: the digits MLP, 2 workers x 3 epochs, batch 64, a checkpoint each epoch; hand-written:
  ``ray.init()`` + a ``TorchTrainer`` (``hand_torch.py``: no raymodel imported);
- **rllib**: one PPO iteration on CartPole (``examples/rl_cartpole.py``, 1 env runner); hand-written:
  ``ray.init()`` + ``PPOConfig...build_algo().train()`` (``rl_ppo.py``'s);
- **transformers**: the tiny BERT of ``examples/transformers_sentiment.py``, 2 workers x 1 epoch on 256
  rows; hand-written: ``ray.init()`` + Ray's ``TorchTrainer`` + HF ``Trainer`` pattern
  (``hf_trainer.py``'s; its data tokenized on the driver, as raymodel does).

Two situations, the sides in turns, medians of ``--reps``:

- **nothing running**: each process starts its own local Ray. raymodel's process runs as a user's
  script does: define the model class, ``rm.init()`` (which warms a pool for that class's backend:
  ``--warm`` auto), make the data, ``model.train``;
- **a server started earlier**: ``raymodel server start --warm <backend>:2 --wait`` (which returns once
  its warm pool is ready; ``--warm rllib`` for RLlib, which has no pool: its Algorithm's actor started
  ahead, not waited for) against ``ray start --head``; then new processes, one after another, each
  joining it and running the same job. Before that: one process launched as soon as a plain
  ``raymodel server start --warm <backend>:2`` returns (its pool still starting), on a server of its own.
  ``--server-warm auto``: the servers warm what a plain
  ``raymodel server start`` does (torch's pool, which a transformers job takes too).

Then, in one process joined to the torch server: a warm job's wall (``train(wait=False)`` to
``job.wait()``) and its first row, p50 and p95 of ``--warm-jobs``.

A third situation, **off the cluster** (``--phases off``, torch only): each side's process is a client
that is not a node, reaching the head by its dashboard's HTTP address only, the storage on moto's S3
server. raymodel: ``raymodel server start --warm torch:2 --wait``, then each process the torch one
above with ``RAY_ADDRESS=http://HEAD:PORT`` (its ``rm.init()`` takes it): the class defined there,
``model.train`` (the data made in the process, the rows streamed back). Hand-written: ``ray start
--head``, then each process submits the hand-written torch job above through Ray's
``JobSubmissionClient`` (an entrypoint script and its ``working_dir``, the data made by the script, the
checkpoints on the same storage) and follows its log to the end (Ray's stream, no polling).

Both sides get the Ray settings raymodel gives a local instance it starts (Train's report poll
every 0.2 s, no preemption watcher), so the figures compare structure, not environment variables.
Ratios are raymodel / hand-written. Nothing else should run meanwhile.

    python benchmarks/first_contact.py [--reps 3] [--only torch,rllib,transformers] [--warm-jobs 20]
                                       [--phases cold,server,off]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from first_job_timeline import process_start  # the interpreter's start, from /proc

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
BACKENDS = ("torch", "rllib", "transformers")
GOALS = {"torch": 0.5, "rllib": 1.0, "transformers": 1.0}
#: What raymodel sets for a local Ray it starts (raymodel/_ray/cluster.py), given to both sides.
RAY_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}
TORCH = {"num_workers": 2, "num_epochs": 3, "batch_size": 64, "progress": False}


# ------------------------------------------------------------------ the children
def _ray_init(marks: dict[str, float]) -> None:
    import ray

    began = time.time()
    address = os.environ.get("RAY_ADDRESS")
    ray.init(address=address or "local", logging_level="ERROR", log_to_driver=False)
    marks["init"] = time.time()
    marks["init_s"] = marks["init"] - began


def _digits():
    import numpy as np
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(X))
    cut = int(len(X) * 0.8)
    return X[order[:cut]], y[order[:cut]], X[order[cut:]], y[order[cut:]]


def hand_torch(marks: dict[str, float]) -> None:
    import ray
    from hand_torch import hand_written_loop
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    _ray_init(marks)
    refs = [ray.put(a) for a in _digits()]
    config = {"hidden": 64, "lr": 1e-3, "batch_size": 64, "epochs": TORCH["num_epochs"], "refs": refs}
    result = TorchTrainer(
        hand_written_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=TORCH["num_workers"]),
        run_config=RunConfig(storage_path=os.environ["RAYMODEL_HOME"], name=f"hand-{time.time_ns()}"),
    ).fit()
    assert result.error is None and result.metrics["epoch"] == TORCH["num_epochs"]


def rm_torch(marks: dict[str, float]) -> None:
    from digits import DigitsNet  # the user's model class (its module imports raymodel)

    import raymodel as rm

    began = time.time()
    rm.init()
    marks["init"] = time.time()
    marks["init_s"] = marks["init"] - began
    Xt, yt, Xv, yv = _digits()
    result = DigitsNet().train(TORCH, data={"train": (Xt, yt), "valid": (Xv, yv)})
    assert len(result.history) == TORCH["num_epochs"]


def hand_rllib(marks: dict[str, float]) -> None:
    from rl_ppo import hand_written

    _ray_init(marks)
    hand_written(1, float("inf"))


def rm_rllib(marks: dict[str, float]) -> None:
    from rl_cartpole import Balancer

    import raymodel as rm

    began = time.time()
    rm.init()
    marks["init"] = time.time()
    marks["init_s"] = marks["init"] - began
    result = Balancer().train({"num_workers": 1, "num_epochs": 1, "progress": False})
    assert len(result.history) == 1


def hand_transformers(marks: dict[str, float]) -> None:
    from hf_trainer import hand_written, tokenized

    _ray_init(marks)
    data = tokenized(256)
    hand_written(data, 1, tempfile.mkdtemp(dir=os.environ["RAYMODEL_HOME"]))


def rm_transformers(marks: dict[str, float]) -> None:
    from transformers_sentiment import Sentiment, sentiment_data

    import raymodel as rm

    began = time.time()
    rm.init()
    marks["init"] = time.time()
    marks["init_s"] = marks["init"] - began
    settings = {"num_workers": 2, "num_epochs": 1, "batch_size": 16, "progress": False}
    result = Sentiment(config={"lr": 2e-3}).train(settings, data=sentiment_data(256, 64))
    assert len(result.history) == 1


def warm_jobs(marks: dict[str, float]) -> None:
    """In a process joined to a torch server: ``--warm-jobs`` jobs one after another, each timed."""
    import numpy as np
    import small_jobs  # its pool_job: to the first row, to the result
    from digits import DigitsNet

    import raymodel as rm

    rm.init()
    Xt, yt, Xv, yv = _digits()
    data = {"train": (Xt, yt), "valid": (Xv, yv)}
    DigitsNet().train(TORCH, data=data)  # the pool warm, whatever it was
    assert small_jobs.SETTINGS == TORCH, "small_jobs.pool_job must run this benchmark's job"
    firsts, walls = zip(*(small_jobs.pool_job(data) for _ in range(int(os.environ["WARM_JOBS"]))))
    for name, values in (("wall", walls), ("first_row", firsts)):
        marks[f"{name}_p50"] = float(np.percentile(values, 50))
        marks[f"{name}_p95"] = float(np.percentile(values, 95))


#: The hand-written job's entrypoint off the cluster: ``hand_torch`` above, in a driver of the cluster's.
HAND_JOB = """from first_contact import hand_torch

hand_torch({})
print("HAND-RESULT", flush=True)
"""


def hand_off_torch(marks: dict[str, float]) -> None:
    """The same job by hand from off the cluster: Ray's Jobs API, an entrypoint and its ``working_dir``."""
    import asyncio
    import shutil

    from ray.job_submission import JobStatus, JobSubmissionClient

    began = time.time()
    client = JobSubmissionClient(os.environ["RM_BENCH_CLUSTER"])
    marks["init"] = time.time()
    marks["init_s"] = marks["init"] - began
    folder = Path(tempfile.mkdtemp(prefix="hand-job-"))
    for name in ("hand_torch.py", "first_contact.py", "first_job_timeline.py"):
        shutil.copy(HERE / name, folder / name)
    (folder / "job.py").write_text(HAND_JOB)
    job = client.submit_job(
        entrypoint="python job.py",
        runtime_env={"working_dir": str(folder), "env_vars": {"RAYMODEL_HOME": os.environ["RAYMODEL_HOME"], **RAY_ENV}},
    )

    async def follow() -> str:
        text = ""
        async for chunk in client.tail_job_logs(job):
            text += chunk
        return text

    log = asyncio.run(follow())
    status = client.get_job_status(job)
    assert status == JobStatus.SUCCEEDED and "HAND-RESULT" in log, (status, log[-3000:])


CHILDREN = {f.__name__: f for f in (hand_torch, rm_torch, hand_rllib, rm_rllib, hand_transformers, rm_transformers)}
CHILDREN.update(warm_jobs=warm_jobs, hand_off_torch=hand_off_torch)


def child(name: str) -> None:
    sys.path[:0] = [str(HERE), str(EXAMPLES)]
    zero = process_start()
    marks: dict[str, float] = {}
    CHILDREN[name](marks)
    marks["result"] = time.time()
    print("MARKS " + json.dumps({k: (v - zero if v > 1e9 else v) for k, v in marks.items()}), flush=True)


# ------------------------------------------------------------------ the parent
def run_child(name: str, env: dict[str, str]) -> dict[str, float]:
    """Run one child process; its wall from the start to its exit, and its marks."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{name} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    line = next(x for x in reversed(done.stdout.splitlines()) if x.startswith("MARKS "))
    return {"wall": wall, **json.loads(line[6:])}


def no_ray_left(timeout: float = 60.0) -> None:
    """Wait until no raylet runs on the machine (a child's own local Ray has gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if subprocess.run(["pgrep", "-x", "raylet"], capture_output=True).returncode != 0:
            return
        time.sleep(0.5)
    raise SystemExit("a Ray instance is still running: stop it (`ray stop`) and run again with nothing else running")


def side_env(home: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYMODEL_WARM")}
    token = os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
    if token or Path.home().joinpath(".ray", "auth_token").is_file():  # token auth, as raymodel turns it on
        env.setdefault("RAY_AUTH_MODE", "token")
    path = os.pathsep.join(filter(None, [str(HERE), str(EXAMPLES), env.get("PYTHONPATH")]))
    return {
        **env,
        **RAY_ENV,
        "PYTHONPATH": path,
        "RAYMODEL_HOME": home,
        "RAYMODEL_SERVER_FILE": os.path.join(home, "server.json"),
        "PYTHONUNBUFFERED": "1",
    }


def _cli(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(args, env=env, check=True, capture_output=True, text=True)
    return time.perf_counter() - start


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):6.1f} s [{min(values):.1f}-{max(values):.1f}]"


def nothing_running(backends: list[str], reps: int, env: dict[str, str]) -> dict[str, dict[str, list[dict]]]:
    runs: dict[str, dict[str, list[dict]]] = {b: {"hand": [], "rm": []} for b in backends}
    for rep in range(reps):
        for backend in backends:
            for side in ("hand", "rm") if rep % 2 == 0 else ("rm", "hand"):
                no_ray_left()
                runs[backend][side].append(run_child(f"{side}_{backend}", env))
                print(f"  rep {rep + 1} {backend} {side}: {runs[backend][side][-1]['wall']:.1f} s", flush=True)
    return runs


def with_server(backend: str, processes: int, env: dict[str, str], warm: str = "") -> dict[str, object]:
    """``raymodel server start --warm`` (``warm``, else the backend's own pool) then ``processes`` raymodel
    processes; ``ray start --head`` then as many hand-written ones."""
    raymodel = str(Path(sys.executable).with_name("raymodel"))
    ray = str(Path(sys.executable).with_name("ray"))
    no_ray_left()
    warm = warm or ("rllib" if backend == "rllib" else f"{backend}:2")
    out: dict[str, object] = {"warm_spec": warm}
    if warm != "none":  # a process launched as a start that does not wait returns: its pool still starting
        out["plain_start"] = _cli([raymodel, "server", "start", "--warm", warm], env)
        try:
            out["at_start"] = run_child(f"rm_{backend}", env)
        finally:
            _cli([raymodel, "server", "stop", "--grace-s", "0"], env)
        no_ray_left()
    out["start"] = _cli([raymodel, "server", "start", "--warm", warm, "--wait"], env)
    try:
        out["rm"] = [run_child(f"rm_{backend}", env) for _ in range(processes)]
        if backend == "torch":
            out["warm"] = run_child("warm_jobs", env)
    finally:
        _cli([raymodel, "server", "stop", "--grace-s", "0"], env)
    no_ray_left()
    out["hand_start"] = _cli([ray, "start", "--head", "--port", "6391", "--disable-usage-stats"], env)
    try:
        out["hand"] = [run_child(f"hand_{backend}", {**env, "RAY_ADDRESS": "127.0.0.1:6391"}) for _ in range(processes)]
    finally:
        _cli([ray, "stop", "--force"], env)
    return out


def off_cluster(processes: int, env: dict[str, str]) -> dict[str, object]:
    """Clients off the cluster (``RM_BENCH_CLUSTER``, the head's dashboard): ``raymodel server start --warm
    torch:2 --wait`` then ``processes`` raymodel clients; ``ray start --head`` then as many hand-written
    ones (Ray's Jobs API). The storage (``RAYMODEL_HOME``) of both: moto's S3 server."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    from s3server import ENV as S3_ENV, S3Server, free_port

    raymodel = str(Path(sys.executable).with_name("raymodel"))
    ray = str(Path(sys.executable).with_name("ray"))
    out: dict[str, object] = {}
    with S3Server() as s3:
        path = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the jobs' `python`: this one
        env = {**env, **S3_ENV, "RAYMODEL_HOME": s3.uri("home"), "PATH": path}
        no_ray_left()
        port, dashboard = free_port(), free_port()
        head = ["--port", str(port), "--dashboard-port", str(dashboard)]
        url = f"http://127.0.0.1:{dashboard}"
        clients = {**env, "RM_BENCH_CLUSTER": url}
        out["start"] = _cli([raymodel, "server", "start", *head, "--warm", "torch:2", "--wait"], env)
        try:
            # raymodel's torch process as it is: its `rm.init()` takes RAY_ADDRESS, the head's dashboard
            out["rm"] = [run_child("rm_torch", {**clients, "RAY_ADDRESS": url}) for _ in range(processes)]
        finally:
            _cli([raymodel, "server", "stop", "--grace-s", "0"], env)
        no_ray_left()
        out["hand_start"] = _cli([ray, "start", "--head", *head, "--disable-usage-stats"], env)
        try:
            out["hand"] = [run_child("hand_off_torch", clients) for _ in range(processes)]
        finally:
            _cli([ray, "stop", "--force"], env)
    return out


def report_off_cluster(out: dict[str, Any]) -> None:
    rm_walls, hand_walls = [r["wall"] for r in out["rm"]], [r["wall"] for r in out["hand"]]
    ratio = statistics.median(rm_walls) / statistics.median(hand_walls)
    print("\n## off the cluster: a client process that is not a node, its first job, start to end")
    print(
        f"        torch: `raymodel server start --warm torch:2 --wait` {out['start']:.1f} s; raymodel clients "
        + ", ".join(f"{w:.1f}" for w in rm_walls)
        + f" s; `ray start --head` {out['hand_start']:.1f} s; "
        "hand-written clients (JobSubmissionClient, entrypoint + working_dir) "
        + ", ".join(f"{w:.1f}" for w in hand_walls)
        + f" s; ratio of medians {ratio:.2f}x (goal <= 0.5x: {'met' if ratio <= 0.5 else 'NOT met'})"
    )
    for side in ("rm", "hand"):
        for r in out[side]:
            print(f"  off {side}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--processes", type=int, default=4, help="new processes per server (default 4)")
    parser.add_argument("--warm-jobs", type=int, default=20)
    parser.add_argument("--only", default=",".join(BACKENDS))
    parser.add_argument(
        "--phases", default="cold,server,off", help="cold (nothing running), server, off (off the cluster): any of them"
    )
    parser.add_argument(
        "--server-warm",
        default="",
        help="the servers' --warm (default: the backend's own pool, BACKEND:2; `auto`: what a plain "
        "`raymodel server start` warms, torch's pool, which takes Lightning's and transformers' jobs too)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    backends = [b for b in args.only.split(",") if b]
    home = tempfile.mkdtemp(prefix="first-contact-")
    env = {**side_env(home), "WARM_JOBS": str(args.warm_jobs)}
    cpus = os.cpu_count()
    print(f"first contact: each side a fresh process, start to end; {cpus} CPUs; {args.reps} reps in turns")
    phases = args.phases.split(",")
    runs = nothing_running(backends, args.reps, env) if "cold" in phases else {}
    servers = {}
    for backend in backends if "server" in phases else ():
        servers[backend] = with_server(backend, args.processes, env, args.server_warm)
        print(f"  server for {backend} done", flush=True)
    off = off_cluster(args.processes, env) if "off" in phases else None
    if runs:
        report_cold(backends, runs)
    if servers:
        report_servers(servers, args.warm_jobs)
    if off:
        report_off_cluster(off)


def report_cold(backends: list[str], runs: dict[str, dict[str, list[dict]]]) -> None:
    print("\n## nothing running: a fresh process with its own local Ray, median [range]")
    inits = []
    for backend in backends:
        hand = [r["wall"] for r in runs[backend]["hand"]]
        mine = [r["wall"] for r in runs[backend]["rm"]]
        inits += [r["init_s"] for r in runs[backend]["rm"]]
        ratio = statistics.median(mine) / statistics.median(hand)
        goal = GOALS[backend]
        print(
            f"{backend:>13}: hand-written {_median(hand)}  raymodel {_median(mine)}  "
            f"{ratio:.2f}x (goal <= {goal:g}x: {'met' if ratio <= goal else 'NOT met'})"
        )
    hand_inits = [r["init_s"] for b in backends for r in runs[b]["hand"]]
    print(
        f"rm.init() itself (a local Ray started, the server asked to warm): {_median(inits)} (goal <= 3 s); "
        f"ray.init() in the hand-written processes (ray imported before): {_median(hand_inits)}"
    )
    _exits({b: runs[b] for b in backends})
    print("\nmarks of each process, nothing running (s from its start; wall: to its exit, Ray's shutdown included):")
    for backend in backends:
        for side in ("hand", "rm"):
            for r in runs[backend][side]:
                print(f"  {backend} {side}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()))


def _exits(runs: dict[str, dict[str, list[dict]]]) -> None:
    """From each process's result to its exit (Ray's shutdown, the interpreter's end): wall - result."""
    for side, name in (("rm", "raymodel"), ("hand", "hand-written")):
        exits = {b: _median([r["wall"] - r["result"] for r in runs[b][side]]) for b in runs}
        print(f"from the result to the exit, {name}: " + "; ".join(f"{b} {e}" for b, e in exits.items()))


def report_servers(servers: dict[str, dict[str, object]], warm_jobs: int) -> None:
    print("\n## a server started earlier: each new process, start to end, one after another")
    for backend, out in servers.items():
        rm_walls = [r["wall"] for r in out["rm"]]  # type: ignore[union-attr]
        hand_walls = [r["wall"] for r in out["hand"]]  # type: ignore[union-attr]
        print(f"{backend:>13}: warm pools `--warm {out['warm_spec']}`")
        if "at_start" in out:
            print(
                f"{backend:>13}: `raymodel server start` (not waiting) {out['plain_start']:.1f} s, then a process "
                f"at once {out['at_start']['wall']:.1f} s (its warm pool still starting)"
            )  # type: ignore[index]
        print(
            f"{backend:>13}: `raymodel server start --wait` {out['start']:.1f} s; raymodel processes "
            + ", ".join(f"{w:.1f}" for w in rm_walls)
            + f" s (goal <= 3 s each: {'met' if max(rm_walls) <= 3 else 'NOT met'}); "
            f"`ray start --head` {out['hand_start']:.1f} s; hand-written processes "
            + ", ".join(f"{w:.1f}" for w in hand_walls)
            + " s; "
            f"ratio of medians {statistics.median(rm_walls) / statistics.median(hand_walls):.2f}x"
        )
    _exits({b: {"rm": list(out["rm"]), "hand": list(out["hand"])} for b, out in servers.items()})  # type: ignore[call-overload]
    warm: Any = servers.get("torch", {}).get("warm")
    if warm:
        print(
            f"\n## a warm job (one process, {warm_jobs} jobs): wall p50 {warm['wall_p50']:.3f} s, "
            f"p95 {warm['wall_p95']:.3f} s (goal p50 <= 0.25 s: {'met' if warm['wall_p50'] <= 0.25 else 'NOT met'}); "
            f"first row p50 {warm['first_row_p50']:.3f} s, p95 {warm['first_row_p95']:.3f} s "
            f"(goal <= 0.1 s: {'met' if warm['first_row_p50'] <= 0.1 else 'NOT met'})"
        )
    print("\nmarks of each process with a server (s from its start):")
    for backend, out in servers.items():
        for side in ("rm", "hand"):
            for r in out[side]:  # type: ignore[attr-defined]
                print(f"  {backend} {side}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()))


if __name__ == "__main__":
    main()
