"""Pools: resident worker groups of the training server, which run jobs one after another.

A pool is one long-lived Ray Train run (``raymodel/train/_ray_train_run.py``: the backend's own trainer,
``TorchTrainer``, ``XGBoostTrainer``, ...), started by a ``PoolActor``. Its ``train_loop_per_worker``
(``pool_worker``) takes the pool's jobs one at a time (of any backend of its kind: torch's pools run
Lightning's and transformers' jobs too) and runs each through the same ``WorkerRun`` lifecycle as a
one-off run, with the job's own backend, placed by a ``PoolSession``: checkpoints go to the job's own
storage (rank 0 uploads them, a manifest last, and applies ``keep_checkpoints``), rows go to the server
(and to the job's hub, for a blocking call's progress or a Tune trial), and the newest complete
checkpoint in the job's storage is where a restarted worker group resumes.

Faults: a worker that dies makes Ray Train restart the pool's worker group
(the pool's ``FailureConfig`` retries forever); the new workers take the same
job again and resume it, until the job's own ``max_failures`` is spent. An
exception in user code fails that job alone: every rank leaves it, and the
pool takes the next one. A rank that does not come back within
``_REJOIN_S`` (stuck in a collective its peers left) makes the pool unusable:
it ends, and the next job starts a new one.
"""

from __future__ import annotations

import dataclasses
import gc
import threading
import time
import traceback
from typing import Any

from raymodel._internal import locations, serialization
from raymodel.jobs._pools.session import PoolSession
from raymodel.train import gathers_through_hub, start_hub, stop_hub

#: How long every rank has to leave a failed job before the pool restarts its worker group.
_REJOIN_S = 5.0
#: How long a restart of the worker group may take before the pool counts as broken.
_RESTART_S = 180.0
#: How long a worker's error waits for Ray Train to report a dead worker (the error's cause) first.
_FAILURE_GRACE_S = 1.5


@dataclasses.dataclass
class PoolJob:
    """The job a pool runs now (``id``, its ``spec``), its ``seq`` among the pool's jobs and its
    ``attempt`` (a restart of its workers is the next), each rank's outcome of the attempt
    (``finished``), its first failed rank's (``error``, with ``rank`` and ``at``: decided after a grace),
    and how it ended (``outcome``). ``paused``: every rank leaves it after an error in its code;
    ``fresh_only``: after Ray Train restarted the workers, only new ones (at ``(0, 0)``) take it."""

    id: str
    spec: dict[str, Any]
    seq: int
    attempt: int = 0
    finished: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    error: dict[str, Any] | None = None
    outcome: dict[str, Any] | None = None
    paused: bool = False
    fresh_only: bool = False

    def handed(self) -> dict[str, Any]:
        """What a worker is given of it (``take``)."""
        return {"id": self.id, "seq": self.seq, "spec": self.spec, "attempt": self.attempt}

    def retry(self) -> None:
        """Its next attempt: no rank has finished it, none failed."""
        self.attempt += 1
        self.finished, self.error = {}, None

    @property
    def error_due(self) -> bool:
        return self.error is not None and time.monotonic() - self.error["at"] >= _FAILURE_GRACE_S


class PoolActor:
    """Starts a pool's Ray Train run and hands its workers one job at a time."""

    def __init__(
        self,
        pool_id: str,
        backend: bytes,
        num_workers: int,
        per_worker: dict[str, float],
        use_gpu: bool,
        imports: tuple[str, ...] | None = None,
    ):
        self.pool_id = pool_id
        self.backend = serialization.loads(backend)  # the first job's, or a warm pool's (of its kind: its trainer)
        self.imports = self.backend.pool.worker_imports if imports is None else tuple(imports)
        self.num_workers, self.per_worker, self.use_gpu = num_workers, per_worker, use_gpu
        self.cond = threading.Condition()
        self.job: PoolJob | None = None
        self.seq = 0
        self.ending = False
        self.ended: str | None = None  # why the run ended, once it has
        self.broken: str | None = None
        self.waiting: set[int] = set()  # ranks waiting in `take` for a job
        self.joined: set[int] = set()  # ranks that have asked for a job at least once
        self.settled: set[int] = set()  # ranks whose first job's imports are in (``_settle``)
        self.restarting = False  # the pool asked Ray Train to restart its worker group
        self.gather_hub: Any = None
        self.thread = threading.Thread(target=self._fit, name="raymodel-pool", daemon=True)
        self.started = threading.Event()

    def start(self) -> None:
        if gathers_through_hub(self.backend, self.num_workers):
            self.gather_hub = start_hub()
        self.thread.start()
        self.started.set()

    # ------------------------------------------------------------ the run
    def _fit(self) -> None:
        import ray

        from raymodel.contract import RunPlan
        from raymodel.jobs._server.run_events import PoolFailures
        from raymodel.train import ray_train_run

        me = ray.get_runtime_context().current_actor
        resources = {k: v for k, v in self.per_worker.items() if k != "GPU"}
        plan = RunPlan(
            name=self.pool_id,
            storage=locations.home_path("pools"),  # Ray Train's own files: no job writes here
            loop=pool_worker,
            loop_config={"pool": me, "gather_hub": self.gather_hub, "imports": self.imports},
            num_workers=self.num_workers,
            use_gpu=self.use_gpu,
            resources_per_worker=resources or None,
            max_failures=-1,  # each job counts its own
            events=(PoolFailures(me),),
            groups_swept=True,  # the server removes a dead pool's placement groups (its sweep)
        )
        try:
            ray_train_run(self.backend, plan).fit()
            why = "ended"
        except BaseException as exc:  # noqa: BLE001 - whatever ended the run ends the pool
            why = f"the pool's worker group failed: {type(exc).__name__}: {exc}"
        with self.cond:
            self.ended = why
            if self.job is not None and self.job.outcome is None:
                self.job.outcome = {"error": f"Training failed: {why}", "pool_ok": False}
            self.cond.notify_all()

    def wait_ended(self) -> str:
        """Returns when the pool's run has ended (the server is waiting on this from the start)."""
        self.started.wait()
        self.thread.join()
        stop_hub(self.gather_hub)
        return self.ended or "ended"

    def wait_ready(self) -> bool:
        """Returns once every worker has started, asked for a job and settled (``True``), or the run has ended."""
        with self.cond:
            self.cond.wait_for(lambda: self._ready() or self.ended is not None)
            return self._ready()

    def _ready(self) -> bool:
        return len(self.joined) >= self.num_workers and len(self.settled) >= self.num_workers

    def settle(self, rank: int) -> None:
        with self.cond:
            self.settled.add(rank)
            self.cond.notify_all()

    def end(self) -> None:
        """End the pool once it is idle: its workers return, Ray Train releases their resources."""
        with self.cond:
            self.ending = True
            self.cond.notify_all()

    # --------------------------------------------------- from the job runner
    def run_job(self, job: dict[str, Any]) -> dict[str, Any]:
        """Run ``job`` (its ``id`` and ``spec``) on the workers and wait: ``{"result": rank 0's}`` or
        ``{"error": ...}``, with ``pool_ok``: whether the pool can take the next job."""
        with self.cond:
            if self.ended or self.broken or self.ending:
                return {"error": f"Training failed: the pool ended ({self.ended or self.broken})", "pool_ok": False}
            self.seq += 1
            current = self.job = PoolJob(job["id"], job["spec"], self.seq)
            self.cond.notify_all()
            allowed = int(current.spec.get("max_failures", 0))
            while True:
                self.cond.wait_for(lambda: current.outcome is not None or current.error_due, timeout=0.2)
                if current.outcome is not None:
                    break
                if not current.error_due:
                    continue
                # An error in the job's code, on one rank or more: every rank leaves the job first.
                current.paused = True
                error = current.error or {}
                self._recover()
                if self.broken or self.ended:
                    current.outcome = {**error, "pool_ok": False}
                    break
                if allowed == -1 or current.attempt < allowed:  # as Ray Train retries a run: within max_failures
                    current.retry()
                    current.paused = current.fresh_only = False
                    self.cond.notify_all()
                    continue
                current.outcome = error
                break
            outcome: dict[str, Any] = current.outcome or {}
            self.job = None
            ok = outcome.get("pool_ok", True) and not self.broken and not self.ended
            return {k: v for k, v in {**outcome, "pool_ok": ok}.items() if k not in ("at", "rank")}

    def _recover(self) -> None:
        """Every rank back in ``take``: at once when they all left the failed job, else by restarting
        the worker group (a rank stuck in a collective its peers left); broken when neither works."""
        if self.cond.wait_for(lambda: len(self.waiting) == self.num_workers, timeout=_REJOIN_S):
            return
        self.restarting = True  # the ranks in `take` raise: Ray Train restarts the whole group
        self.cond.notify_all()
        back = self.cond.wait_for(
            lambda: not self.restarting and len(self.waiting) == self.num_workers or bool(self.ended),
            timeout=_RESTART_S,
        )
        if not back or self.ended:
            self.broken = self.ended or "its worker group did not come back after a failed job"

    # ------------------------------------------------------- from the workers
    def take(self, rank: int, last_seq: int, last_attempt: int) -> dict[str, Any] | None:
        """The next job for ``rank``: a newer one than ``(last_seq, last_attempt)`` (a restarted worker,
        at ``(0, 0)``, takes the current one again); ``None``: the pool ends; ``{"restart": True}``:
        raise, so that Ray Train restarts the worker group."""
        with self.cond:
            self.waiting.add(rank)
            self.joined.add(rank)
            self.cond.notify_all()
            try:
                while True:
                    if self.restarting:
                        return {"restart": True}
                    job = self.job
                    if job is not None and job.outcome is None and not job.paused:
                        # After Ray Train restarted the group only its new workers (at 0) take the job:
                        # an old one, not yet stopped, would join its broken collective again.
                        if (job.seq, job.attempt) > (last_seq, last_attempt) and not (job.fresh_only and last_seq):
                            return job.handed()
                    if self.ending or self.broken:
                        return None
                    self.cond.wait(timeout=5.0)
            finally:
                self.waiting.discard(rank)

    def finished(self, seq: int, attempt: int, rank: int, outcome: dict[str, Any]) -> None:
        with self.cond:
            job = self.job
            if job is None or job.seq != seq or job.attempt != attempt or job.outcome is not None:
                return  # an attempt the pool already gave up on
            job.finished[rank] = outcome
            if outcome.get("error"):
                # Decided after a grace: an error that a dying peer caused (a collective cut short) is the
                # restart's business, not the job's. Ray Train reports the death within the grace.
                if job.error is None or rank < job.error["rank"]:
                    job.error = {**outcome, "rank": rank, "at": time.monotonic(), "pool_ok": True}
            elif len(job.finished) == self.num_workers and job.error is None:
                job.outcome = {"result": job.finished[0]["result"]}
            self.cond.notify_all()

    def failure(self, errors: dict[int, str]) -> None:
        """Ray Train saw workers fail (it restarts the group): the job resumes, or fails past its ``max_failures``."""
        with self.cond:
            if self.restarting:  # the restart the pool asked for
                self.restarting = False
                self.cond.notify_all()
                return
            job = self.job
            if job is None or job.outcome is not None:
                return
            job.fresh_only = True
            _tell_server(job.id, errors)
            if job.paused:
                return
            job.retry()
            allowed = int(job.spec.get("max_failures", 0))
            if allowed != -1 and job.attempt > allowed:
                rank, error = sorted(errors.items())[0]
                job.outcome = {
                    "error": f"Training failed on the Ray workers: worker {rank}: {error}",
                    "pool_ok": True,
                }
            self.cond.notify_all()

    def state(self) -> dict[str, Any]:
        with self.cond:
            return {
                "job": None if self.job is None else self.job.id,
                "waiting": len(self.waiting),
                "ended": self.ended,
                "broken": self.broken,
            }


def _tell_server(job_id: str, errors: dict[int, str]) -> None:
    """The job's workers failed: the server watches whether Ray can place them again."""
    from raymodel.jobs._address import running_handle

    server = running_handle()
    if server is not None:  # else no server (a pool outlives it only while being killed)
        server.worker_lost.remote(job_id, errors)


def pool_worker(config: dict[str, Any]) -> dict[str, Any]:
    """``train_loop_per_worker`` of a pool: take a job, run it, say how it went, take the next."""
    import ray
    import ray.train

    pool = config["pool"]
    rank = ray.train.get_context().get_world_rank()
    # What a first job's set-up would import, imported while the worker waits for it. A job that comes
    # sooner waits for them to be in (it would import them itself): two threads importing one package
    # at once can see it partly initialized (pytorch_lightning's circular imports fail so).
    importer = threading.Thread(
        target=_settle, args=(config.get("imports", ()), pool, rank), name="raymodel-imports", daemon=True
    )
    importer.start()
    last = (0, 0)
    while True:
        job = ray.get(pool.take.remote(rank, *last))
        if job is None:
            return {}
        if job.get("restart"):
            raise RuntimeError("raymodel: the pool restarts its worker group (a rank did not leave a failed job)")
        last = (job["seq"], job["attempt"])
        importer.join()
        outcome = run_on_worker(job, config.get("gather_hub"))
        ray.get(pool.finished.remote(job["seq"], job["attempt"], rank, outcome))
        del outcome
        # What the job left in reference cycles is freed before the next job, after its outcome was told
        # (unfrozen, a full collection with torch loaded takes about 0.3 s).
        gc.collect()


def _settle(modules: tuple[str, ...], pool: Any, rank: int) -> None:
    """Import ``modules``, then put what the worker holds for good (modules, Ray's state) out of the
    collector's view (``gc.freeze``: a job's collection walks the job's objects only), then tell the pool:
    it is ready once every rank has. Done after the first job instead, the collection and freeze (about
    1 s with torch loaded) would delay the second job on a warm pool."""
    _import(modules)
    gc.collect()
    gc.freeze()
    pool.settle.remote(rank)


def _import(modules: tuple[str, ...]) -> None:
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - the job that needs it imports it again and says what is wrong
            pass


def run_on_worker(job: dict[str, Any], gather_hub: Any) -> dict[str, Any]:
    """One job on this worker, isolated from the jobs before and after it (``pool_worker`` collects
    what it left once its outcome is told)."""
    from raymodel.train import WorkerRun

    spec = job["spec"]
    _forget_classes()  # the job's classes come fresh from its payload: no state of an earlier job's
    try:
        _, backend = _job_classes(spec)
        with backend.isolated():
            loop_config = {**spec["loop_config"], "gather_hub": gather_hub}
            run = WorkerRun(loop_config, session=PoolSession(spec, job["id"]))
            return {"result": run.run()}
    except BaseException as exc:  # noqa: BLE001 - the job's error, reported; the worker takes the next job
        return {"error": _describe(exc, spec), "traceback": traceback.format_exc()}


def _job_classes(spec: dict[str, Any]) -> tuple[type, Any]:
    """The job's model class and backend, unpickled here; a class that cannot be loaded is an error that
    names it and what is missing."""
    payload = serialization.loads(spec["loop_config"]["payload"])
    try:
        cls, _ = serialization.loads(payload["model"])
    except Exception as exc:
        raise _ClassError(
            f"The model class `{spec['model_class']}` cannot be loaded on the pool's workers: "
            f"{type(exc).__name__}: {exc}. Install what it needs on every node (or define it in an "
            "importable module)."
        ) from exc
    return cls, cls.backend


class _ClassError(Exception):
    pass


def _describe(exc: BaseException, spec: dict[str, Any]) -> str:
    rank = "?"
    try:
        import ray.train

        rank = str(ray.train.get_context().get_world_rank())
    except Exception:  # noqa: BLE001 - only for the message
        pass
    if isinstance(exc, _ClassError):
        return str(exc)
    return f"Training failed on the Ray workers: worker {rank}: {type(exc).__name__}: {exc}"


def _forget_classes() -> None:
    """cloudpickle reuses a class it unpickled before (by its tracker id): a second job of the same class
    would see what the first one set on it (class attributes, its module's globals). Forget them."""
    import cloudpickle.cloudpickle as cp

    for name in ("_DYNAMIC_CLASS_TRACKER_BY_ID", "_DYNAMIC_CLASS_TRACKER_BY_CLASS"):
        tracker = getattr(cp, name, None)
        if tracker is not None:
            with cp._DYNAMIC_CLASS_TRACKER_LOCK:
                tracker.clear()
