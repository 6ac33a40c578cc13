"""The client off the cluster (tests/off_cluster.py runs it in a network namespace of its own): the
scenarios a laptop's user runs against the cluster at ``RM_TEST_CLUSTER``, each printing one
``RESULT`` JSON line of what the test checks.

* ``errors``: a wrong token, no token, an address nobody answers at, a local ``RAYMODEL_HOME`` (each refused by
  ``rm.init``), a cluster whose jobs' Python lacks raymodel, another raymodel version here than there
  (each refused by the first call, which runs nothing there): in words that say what to do.
* ``train``: ``rm.init(address=...)``, then a blocking ``model.train`` of a class that only this
  process can import (``digits_laptop``, with a module of its package beside the model's): its rows
  as they come (each printed line's time), the result, the weights back here.
* ``job``: ``model.train(..., wait=False)``, the job's status, ``rm.jobs.list/get``, its rows streamed
  as they come (``job.stream()``), ``wait``; a second job waited for; a third one updated (``lr``,
  ``num_epochs``), asked its ``eta`` and ``resources``, and stopped.
* ``tune``: a blocking ``model.tune`` of 4 trials with ASHA, then the best model put in the registry on
  the cluster's storage and got back from it in this process.
* ``release`` (after ``tune``): that version in production and served on a route, a release of the
  class gated against it, registered, rolled out on the route while this process sends it requests, and
  promoted.
* ``serve`` (after ``tune``): that registry version served by reference, and a trained instance served
  as it is, each answering this process's requests at the head's address; then shut down.
* ``needs`` (last): a class whose module imports a package of this process's, named in ``rm.init(
  runtime_env=...)``'s ``py_modules``, and a pip requirement, in its ``pip``: on a pool, tuned, served.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import raymodel as rm

ADDRESS = os.environ["RM_TEST_CLUSTER"]


def result(scenario: str, **values: Any) -> None:
    print("RESULT " + json.dumps({"scenario": scenario, **values}), flush=True)


def refused(fn) -> dict[str, str]:
    began = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - what it was is what the test checks
        return {"type": type(exc).__name__, "message": str(exc), "s": time.monotonic() - began}
    return {"type": "none", "message": "", "s": time.monotonic() - began}


def errors() -> None:
    from raymodel._ray import remote

    token = os.environ["RAY_AUTH_TOKEN"]
    os.environ["RAY_AUTH_TOKEN"] = "0" * 32
    wrong_token = refused(lambda: rm.init(address=ADDRESS))
    del os.environ["RAY_AUTH_TOKEN"]
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(Path(os.getcwd(), "no-token-here"))  # and none in ~/.ray
    no_token = refused(lambda: rm.init(address=ADDRESS))
    del os.environ["RAY_AUTH_TOKEN_PATH"]
    os.environ["RAY_AUTH_TOKEN"] = token
    host = ADDRESS.rsplit(":", 1)[0]
    nobody = refused(lambda: rm.init(address=f"{host}:1"))
    home = os.environ["RAYMODEL_HOME"]
    os.environ["RAYMODEL_HOME"] = "/tmp/laptop-home"
    local_home = refused(lambda: rm.init(address=ADDRESS))
    os.environ["RAYMODEL_HOME"] = home
    # The cluster's jobs run a Python without raymodel (`python` there is one that ignores site-packages).
    bare = Path(os.getcwd(), "bare-python")
    bare.mkdir(exist_ok=True)
    (bare / "python").write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    (bare / "python").chmod(0o755)
    env = {"env_vars": {"PATH": f"{bare}{os.pathsep}{os.environ['PATH']}"}}
    no_raymodel = refused(lambda: (rm.init(address=ADDRESS, runtime_env=env), rm.jobs.list()))
    # This process has another raymodel than the cluster (its metadata says 9.9.9).
    other = Path(os.getcwd(), "other-raymodel")
    info = other / "raymodel-9.9.9.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: raymodel\nVersion: 9.9.9\n")
    sys.path.insert(0, str(other))
    other_version = refused(lambda: (rm.init(address=ADDRESS), rm.jobs.list()))
    sys.path.remove(str(other))
    result(
        "errors",
        wrong_token=wrong_token,
        no_token=no_token,
        nobody=nobody,
        local_home=local_home,
        no_raymodel=no_raymodel,
        other_version=other_version,
        connected=remote.active() is not None,
    )


class Lines(io.TextIOBase):
    """This process's standard output, each line kept with the time it was written."""

    def __init__(self, stream) -> None:
        self.stream, self.lines = stream, []

    def write(self, text: str) -> int:
        for line in text.splitlines():
            self.lines.append((time.monotonic(), line))
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def train() -> None:
    import ray
    from digits_laptop.model import LaptopDigits, Paced, data

    began = time.monotonic()
    rm.init(address=ADDRESS)
    connected = time.monotonic() - began
    model = LaptopDigits()
    lines = Lines(sys.stdout)
    sys.stdout = lines
    try:
        began = time.monotonic()
        trained = model.train(
            {"num_workers": 2, "num_epochs": 3, "batch_size": 64, "callbacks": [Paced(1.5)]}, data=data()
        )
        ended = time.monotonic()
    finally:
        sys.stdout = lines.stream
    valid = data().splits["valid"]
    predicted = np.asarray(model.predict({"pixels": valid.x.tolist()})["digit"])
    result(
        "train",
        connected_s=connected,
        took_s=ended - began,
        epochs=[row["epoch"] for row in trained.history],
        val_acc=trained.metrics["val_acc"],
        accuracy=float((predicted == valid.y).mean()),
        checkpoint=trained.checkpoint,
        rows=[[t - began, line] for t, line in lines.lines if "epoch" in line],
        ended_at=ended - began,
        ray_here=ray.is_initialized(),
    )


def job() -> None:
    from digits_laptop.model import LaptopDigits, Paced, data

    from raymodel._internal import storage

    rm.init(address=ADDRESS)
    model = LaptopDigits()
    # 6 epochs of 3 s, epoch 2 held until this process has row 1: however late the stream's driver starts
    # on a busy head, it sees the later rows come as they are made.
    go = storage.join(os.environ["RAYMODEL_HOME"], "scratch", f"go-{os.getpid()}")
    settings = {"num_workers": 2, "num_epochs": 6, "batch_size": 64, "callbacks": [Paced(3.0, hold=go)]}
    job = model.train(settings, data=data(), wait=False)
    status = job.summary["status"]  # the record the server answered the submission with
    streamed = []
    for row in job.stream():  # one call, each row as it comes
        streamed.append((time.monotonic(), row["epoch"]))
        if row["epoch"] == 1:
            storage.write_text(go, "go")
    listed = [j.id for j in rm.jobs.list()]
    got = rm.jobs.get(job.id).id
    trained = job.wait(timeout=300)
    other = model.train({**settings, "num_epochs": 1, "callbacks": []}, data=data(), wait=False)
    began = time.monotonic()
    waited = other.wait(timeout=300)  # one call that ends when the job does
    # A long job changed, asked and stopped from here.
    long = model.train({**settings, "num_epochs": 60, "callbacks": [Paced(1.0)]}, data=data(), wait=False)
    while not long.history():
        time.sleep(1.0)
    change = long.update(config={"lr": 1e-3}, settings={"num_epochs": 50})
    eta, holds = long.eta, long.resources
    long.stop()
    long.wait(timeout=300)
    control = {"change": change, "eta": eta, "holds": holds, "status": long.status, "epochs": len(long.history())}
    result(
        "job",
        calls=sessions(job.id),
        id=job.id,
        status_at_once=status,
        listed=job.id in listed,
        got=got,
        streamed=streamed,
        waited_epochs=[row["epoch"] for row in waited.history],
        waited_s=time.monotonic() - began,
        control=control,
        status=job.status,
        history=[row["epoch"] for row in job.history()],
        result_epochs=[row["epoch"] for row in trained.history],
        logs=job.logs(),
    )


def sessions(job_id: str) -> dict[str, Any]:
    """Calls one after another run in one driver of the cluster's (``remote._Session``): how many Ray jobs
    ten calls started, and what they took. Then a driver that ended at its idle end, given a call as if it
    had not: the call goes to another, which answers it."""
    from ray.job_submission import JobSubmissionClient

    from raymodel._ray import remote

    ray_jobs = JobSubmissionClient(ADDRESS)
    before = len(ray_jobs.list_jobs())
    began = time.monotonic()
    got = [rm.jobs.get(job_id).id for _ in range(10)]
    ten = {"new_ray_jobs": len(ray_jobs.list_jobs()) - before, "s": time.monotonic() - began, "got": got}
    cluster = remote.active()
    cluster.end_sessions()
    idle_s, fresh = remote.SESSION_IDLE_S, remote._Session.fresh
    remote.SESSION_IDLE_S = 3.0
    try:
        rm.jobs.get(job_id)  # a driver of 3 s idle
        time.sleep(6.0)  # it has ended
        remote._Session.fresh = lambda self: not self.ended  # taken all the same
        before = len(ray_jobs.list_jobs())
        late = rm.jobs.get(job_id).id
        replaced = {"got": late, "new_ray_jobs": len(ray_jobs.list_jobs()) - before}
    finally:
        remote.SESSION_IDLE_S, remote._Session.fresh = idle_s, fresh
        cluster.end_sessions()
    return {"ten": ten, "replaced": replaced}


def tune() -> None:
    from digits_laptop.model import LaptopDigits, data

    rm.init(address=ADDRESS)
    model = LaptopDigits()
    tuned = model.tune(
        data=data(),
        settings={
            "num_samples": 4,
            "max_epochs": 3,
            "grace_period": 1,
            "reduction_factor": 2,
            "metric": "val_acc",
            "mode": "max",
            "train": {"num_workers": 1, "batch_size": 64, "resources_per_worker": {"CPU": 0.95}},
            "progress": False,
        },
    )
    frame = tuned.dataframe()
    reg = rm.registry.open()
    ref = reg.put(tuned, key="laptop-digits")
    loaded = reg.get("laptop-digits", ref.version)
    valid = data().splits["valid"]
    payload = {"pixels": valid.x[:20].tolist()}
    result(
        "tune",
        trials=tuned.num_trials,
        epochs_per_trial=sorted(int(n) for n in frame["epochs"]),
        stopped_early=int(frame["stopped_early"].sum()),
        best_lr=tuned.best_config["lr"],
        model_lr=model.config["lr"],
        best_checkpoint=tuned.best_checkpoint,
        registry=reg.uri,
        version=ref.version,
        same=loaded.predict(payload) == model.predict(payload),
    )


def release() -> None:
    import threading

    import requests
    from digits_laptop.model import LaptopDigits, data

    rm.init(address=ADDRESS)
    reg = rm.registry.open()
    reg.set_alias("laptop-digits", "production", 1)
    host = ADDRESS.split("//", 1)[1].rsplit(":", 1)[0]
    settings = {"host": host, "port": int(os.environ["RM_TEST_SERVE_PORT"]), "ray_actor_options": {"num_cpus": 0.25}}
    served = rm.Servable("laptop-digits@production", "/laptop-release", settings=settings).deploy()
    payload = {"pixels": data().splits["valid"].x[:2].tolist()}
    job = LaptopDigits().release(
        data=data(),
        settings={"num_workers": 1, "num_epochs": 2, "batch_size": 64, "progress": False},
        register="laptop-digits@candidate",
        gate=rm.Gate(metric="val_acc", mode="max", min_delta=-1.0, against="laptop-digits@production"),
        route="/laptop-release",
        rollout={"steps": (0.5, 1.0), "step_s": 1.0, "guard": {"min_requests": 5}},
        wait=False,
    )
    answers: list[int] = []
    done = threading.Event()

    def traffic() -> None:  # a client of the route's, all through the release
        while not done.is_set():
            answers.append(requests.post(served.url, json=payload, timeout=60).status_code)
            time.sleep(0.05)

    sender = threading.Thread(target=traffic, daemon=True)
    sender.start()
    outcome = job.wait()
    done.set()
    sender.join()
    served.shutdown()
    result(
        "release",
        status=outcome.status,
        reason=outcome.reason,
        version=outcome.version,
        stages=[stage.get("stage") for stage in outcome.stages],
        production=reg.resolve("laptop-digits@production"),
        answers=len(answers),
        failed=sum(code != 200 for code in answers),
    )


def serve() -> None:
    import requests
    from digits_laptop.model import LaptopDigits, data

    rm.init(address=ADDRESS)
    host = ADDRESS.split("//", 1)[1].rsplit(":", 1)[0]
    settings = {"host": host, "port": int(os.environ["RM_TEST_SERVE_PORT"]), "ray_actor_options": {"num_cpus": 0.25}}
    valid = data().splits["valid"]
    payload = {"pixels": valid.x[:8].tolist()}
    model = LaptopDigits()  # trained first: the routes' replicas would leave a 2-CPU pool no room
    model.train({"num_workers": 2, "num_epochs": 1, "batch_size": 64, "progress": False}, data=data())
    by_ref = rm.Servable("laptop-digits:1", "/laptop", settings=settings).deploy()
    answer = requests.post(by_ref.url, json=payload, timeout=60)
    expected = rm.registry.get("laptop-digits", 1).predict(payload)
    served = model.serve("/laptop-model", settings=settings)
    direct = served.predict(payload)
    by_ref.shutdown()
    served.shutdown()
    gone = requests.post(by_ref.url, json=payload, timeout=60).status_code
    result(
        "serve",
        url=by_ref.url,
        status=answer.status_code,
        same=answer.json() == expected,
        model_url=served.url,
        model_same=direct == model.predict(payload),
        after_shutdown=gone,
    )


def wheel(source: Path, into: Path, version: str = "1.0") -> Path:
    """A pure-Python wheel of the package folder ``source`` (made by hand: nothing to download), in ``into``."""
    import base64
    import hashlib
    import zipfile

    name = source.name
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/{path.relative_to(source)}": path.read_bytes() for path in source.rglob("*.py")}
    files[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{dist}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: raymodel-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )

    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{path},sha256={digest(data)},{len(data)}\n" for path, data in files.items())
    files[f"{dist}/RECORD"] = (record + f"{dist}/RECORD,,\n").encode()
    into.mkdir(parents=True, exist_ok=True)
    target = into / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return into


def needs() -> None:
    """A class whose module imports a package of this process's (``rm_pixels``, in ``py_modules``) and a
    pip requirement (``rm_offset``, in ``pip``, installed there from a wheel made here), neither on the
    cluster, whose training server already runs (started by the earlier scenarios, without them): a
    job on a pool of 2 workers, a tune whose trials' worker groups are jobs of their own, the version
    registered, then served by reference and answering here."""
    import requests
    from digits_laptop.model import data

    laptop = Path(os.environ["RM_TEST_LAPTOP_ENV"])
    # The wheelhouse is a folder the cluster's nodes read (one machine here; on a cluster, its image's).
    wheelhouse = wheel(laptop / "site" / "rm_offset", Path(os.getcwd(), "wheelhouse"))
    runtime_env = {
        "py_modules": [str(laptop / "rm_pixels")],
        "pip": {"packages": ["rm_offset==1.0"], "pip_install_options": ["--no-index", "--find-links", str(wheelhouse)]},
    }
    began = time.monotonic()
    rm.init(address=ADDRESS, runtime_env=runtime_env)
    from digits_laptop.needs import NeedsDigits

    job = NeedsDigits().train(
        {"num_workers": 2, "num_epochs": 2, "batch_size": 64, "progress": False}, data=data(), wait=False
    )
    trained = job.wait(timeout=600)
    record = rm.jobs.get(job.id).summary
    trained_s = time.monotonic() - began
    tuned = NeedsDigits().tune(
        data=data(),
        settings={
            "num_samples": 2,
            "max_epochs": 1,
            "metric": "val_acc",
            "mode": "max",
            "train": {
                "num_workers": 2,
                "batch_size": 64,
                "resources_per_worker": {"CPU": 0.95},
            },  # and the trial's 0.01
            "progress": False,
        },
    )
    reg = rm.registry.open()
    ref = reg.put(trained, key="needs-digits")
    host = ADDRESS.split("//", 1)[1].rsplit(":", 1)[0]
    settings = {"host": host, "port": int(os.environ["RM_TEST_SERVE_PORT"]), "ray_actor_options": {"num_cpus": 0.25}}
    served = rm.Servable(f"needs-digits:{ref.version}", "/needs", settings=settings).deploy()
    payload = {"pixels": data().splits["valid"].x[:8].tolist()}
    answer = requests.post(served.url, json=payload, timeout=60)
    served.shutdown()
    result(
        "needs",
        status=trained.metrics.get("val_acc") is not None,
        marks=[trained.metrics.get("val_pixels_mark"), trained.metrics.get("val_offset_mark")],
        pool_key=record.get("pool_key"),
        runtime_env=record.get("runtime_env"),
        trained_s=trained_s,
        trials=tuned.num_trials,
        trial_statuses=[trial.get("status") for trial in tuned.trials],
        best_marks=[tuned.best_metrics.get("val_pixels_mark"), tuned.best_metrics.get("val_offset_mark")],
        served=answer.status_code,
        same=answer.json() == reg.get("needs-digits", ref.version).predict(payload),
    )


def cli() -> None:
    """``raymodel --address URL ...`` from here (after ``tune``: version 1 is in the registry)."""
    import subprocess

    import requests

    def raymodel(*words: str) -> dict[str, Any]:
        began = time.monotonic()
        command = [sys.executable, "-m", "raymodel.cli", "--address", ADDRESS, *words]
        out = subprocess.run(command, capture_output=True, text=True, timeout=600)
        return {"rc": out.returncode, "out": out.stdout, "err": out.stderr[-2000:], "s": time.monotonic() - began}

    status = raymodel("server", "status")
    trained = raymodel(
        "train",
        "laptop-digits:1",
        "--data",
        "digits_laptop.model:data",
        "--set",
        "num_epochs=1",
        "--set",
        "progress=false",
        "--register",
        "laptop-digits@cli",
        "--wait",
    )
    job_id = trained["out"].split()[0] if trained["out"] else ""
    listed = raymodel("jobs", "list")
    shown = raymodel("jobs", "show", job_id)
    logs = raymodel("jobs", "logs", job_id)
    models = raymodel("models", "list")
    dash = raymodel("dashboard", "--port", os.environ["RM_TEST_DASHBOARD_PORT"])
    url = next((w for w in dash["out"].split() if w.startswith("http://")), "")
    page = requests.get(url, timeout=60).status_code if url else 0
    start = raymodel("server", "start")
    result(
        "cli",
        status=status,
        trained=trained,
        job_id=job_id,
        listed=listed,
        shown=shown,
        logs=logs,
        models=models,
        dashboard=dash,
        dashboard_url=url,
        page=page,
        start=start,
    )


def routes() -> None:
    """A route's split and a rollout by hand, from here (after ``release``: versions 1 and 2, 2 in production)."""
    import threading

    import requests
    from digits_laptop.model import data

    rm.init(address=ADDRESS)
    host = ADDRESS.split("//", 1)[1].rsplit(":", 1)[0]
    settings = {"host": host, "port": int(os.environ["RM_TEST_SERVE_PORT"]), "ray_actor_options": {"num_cpus": 0.25}}
    served = rm.Servable("laptop-digits@production", "/laptop-routes", settings=settings).deploy()
    served.set_split({"laptop-digits:1": 0.5, "laptop-digits:2": 0.5})
    split = dict(served.info["split"])
    payload = {"pixels": data().splits["valid"].x[:2].tolist()}
    answers: list[int] = []
    done = threading.Event()

    def traffic() -> None:
        while not done.is_set():
            answers.append(requests.post(served.url, json=payload, timeout=60).status_code)
            time.sleep(0.05)

    sender = threading.Thread(target=traffic, daemon=True)
    sender.start()
    refused_split = refused(lambda: served.set_split({"laptop-digits:1": 0.7}))
    served.set_split({"laptop-digits@production": 1.0})  # a rollout starts from one version
    rollout = served.rollout("laptop-digits:1", steps=(0.5, 1.0), step_s=1.0, guard={"min_requests": 5})
    status = rollout.wait(timeout=300)
    done.set()
    sender.join()
    listed = [r.id for r in rm.serve.rollouts()]
    served.shutdown()
    result(
        "routes",
        split=split,
        refused_split=refused_split,
        rollout=rollout.id,
        status=status,
        reason=rollout.reason,
        listed=listed,
        production=rm.registry.open().resolve("laptop-digits@production"),
        answers=len(answers),
        failed=sum(code != 200 for code in answers),
    )


def memory() -> None:
    """Not in the lane (a figure for docs/performance.md): this process's peak memory while a job of
    100 MB of arrays is submitted from here, against the arrays' own size."""
    import resource

    from digits_laptop.model import LaptopDigits

    rm.init(address=ADDRESS)
    rng = np.random.default_rng(0)
    settings = {"num_workers": 1, "num_epochs": 1, "progress": False}
    peaks = []
    for rows in (20_000, 400_000):  # a small job first: the storage's libraries loaded before the large one
        X = rng.random((rows, 64), dtype=np.float32)
        y = rng.integers(0, 10, size=len(X))
        data = rm.data.from_numpy(X, y, valid_fraction=0.1)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        job = LaptopDigits().train(settings, data=data, wait=False)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        job.stop()
        peaks.append({"arrays_mb": (X.nbytes + y.nbytes) / 2**20, "peak_before_mb": before, "peak_after_mb": after})
        del X, y, data
    result("memory", peaks=peaks)


if __name__ == "__main__":
    for scenario in sys.argv[1:]:
        globals()[scenario]()
