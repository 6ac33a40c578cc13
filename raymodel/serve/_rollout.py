"""Progressive delivery: ``served.rollout(ref, steps, step_s, guard)``.

A rollout lives in the cluster, in one detached actor (``RolloutController``, ``raymodel-rollouts``
in the ``raymodel`` namespace), not in the caller: it goes on when the caller exits and any process
sees it (``rm.serve.rollouts()``, ``raymodel serve rollouts``, the dashboard). For each step it sets
the route's split (the candidate's share, the route's version the rest) and watches the figures
the route's replicas send it every half second (``_route_server.RouteServer._report``): each
answered request's latency and whether it failed (a 5xx: an exception in the candidate's
``preprocess``/``forward``/``postprocess`` or an answer its output schema refuses; a client's 4xx is
not the candidate's fault).

- A breach (the candidate's error rate over ``max_error_rate``, or its p99 over ``max_p99_ms``,
  judged over the current step and over the whole rollout once each holds ``min_requests``
  answers) sets the route back to the version it had at once, and moves no alias: "rolled back".
- A step passes when it has lasted ``step_s`` and the candidate answered ``min_requests`` in it
  within the limits. Passing the last step moves the route's alias (``digits@production`` ->
  the candidate's version) and serves it alone: "promoted". A route served by number or by key
  has no alias to move; it then serves the candidate's number alone.
- ``stop()`` sets the route back too: "stopped".

Every change is a reconfiguration of the route's replicas in place (``Servable.apply``): no
replica restarts and no request is dropped.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
import traceback
import uuid
from typing import Any, Mapping, Sequence

from raymodel._internal.name_rules import parse_ref
from raymodel.exceptions import ServeError, SettingsError

CONTROLLER, NAMESPACE = "raymodel-rollouts", "raymodel"
#: How many of the candidate's latencies a rollout keeps for its p99 (the newest).
KEEP = 20000


@dataclasses.dataclass(frozen=True)
class Guard:
    """The limits a rollout's candidate must keep; any one broken rolls the route back at once.

    Attributes:
        max_error_rate: The largest share of the candidate's requests that may fail (5xx), in [0, 1].
        max_p99_ms: The candidate's 99th-percentile latency limit in milliseconds (None: no limit),
            measured in the replica from the request's arrival to its answer.
        min_requests: The candidate's answers a step needs before it passes; the limits are judged
            once this many are in (fewer say little).
    """

    max_error_rate: float = 0.01
    max_p99_ms: float | None = None
    min_requests: int = 100

    def __post_init__(self) -> None:
        problems = []
        rate = self.max_error_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            problems.append(f"`max_error_rate` must be a number in [0, 1] (got {rate!r}).")
        p99 = self.max_p99_ms
        if p99 is not None and (isinstance(p99, bool) or not isinstance(p99, (int, float)) or not p99 > 0):
            problems.append(f"`max_p99_ms` must be a positive number of milliseconds, or None (got {p99!r}).")
        n = self.min_requests
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            problems.append(f"`min_requests` must be a whole number >= 1 (got {n!r}).")
        if problems:
            raise SettingsError("Guard: " + " ".join(problems))

    @classmethod
    def coerce(cls, value: Any) -> Guard:
        if value is None:
            return cls()
        if isinstance(value, Guard):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {f.name for f in dataclasses.fields(cls)})
            if unknown:
                raise SettingsError(
                    f"Guard has no field(s) {', '.join(map(repr, unknown))}; it takes "
                    "max_error_rate, max_p99_ms and min_requests."
                )
            return cls(**value)
        raise SettingsError(f"`guard` takes rm.Guard(...) or a dict of its fields (got {type(value).__name__}).")


def check_steps(steps: Any, step_s: Any) -> tuple[tuple[float, ...], float]:
    """The candidate's shares, increasing in (0, 1], and a step's least length in seconds."""
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence) or not steps:
        raise SettingsError(f"`steps` takes the candidate's shares, like (0.05, 0.25, 1.0) (got {steps!r}).")
    out = []
    for share in steps:
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise SettingsError(f"Each step is a share in (0, 1] (got {share!r} in {tuple(steps)}).")
        if out and share <= out[-1]:
            raise SettingsError(f"`steps` must increase (got {tuple(steps)}).")
        out.append(float(share))
    if isinstance(step_s, bool) or not isinstance(step_s, (int, float)) or not math.isfinite(step_s) or step_s < 0:
        raise SettingsError(f"`step_s` must be a number of seconds >= 0 (got {step_s!r}).")
    return tuple(out), float(step_s)


def controller(create: bool = False) -> Any:
    """The rollout controller's handle (``create``: start it if it is not running)."""
    import ray

    if not create:
        return ray.get_actor(CONTROLLER, namespace=NAMESPACE)
    return (
        ray.remote(RolloutController)
        .options(
            name=CONTROLLER,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_concurrency=32,
        )
        .remote()
    )


def start_rollout(route: str, ref: str, steps: Any, step_s: Any, guard: Any, servable: type) -> Rollout:
    """Check every argument here (a bad one changes nothing), then start the rollout in the cluster;
    ``servable`` is the ``Servable`` class, with which the controller redeploys the route."""
    steps, step_s = check_steps(steps, step_s)
    guard = Guard.coerce(guard)
    if not isinstance(ref, str) and type(ref).__name__ != "ModelRef":
        raise SettingsError(f"A rollout's candidate is a registry reference like 'digits@candidate' (got {ref!r}).")
    import ray

    handle = controller(create=True)
    state = ray.get(handle.start.remote(route, str(ref), steps, step_s, dataclasses.asdict(guard), servable))
    if isinstance(state, Exception):
        raise state
    return Rollout(state["id"], state)


def running_on(route: str) -> str | None:
    """The id of the rollout running on ``route``, if any (None where no controller runs)."""
    try:
        handle = controller()
    except ValueError:
        return None
    import ray

    return ray.get(handle.running.remote(route))


def rollouts() -> list[Rollout]:
    """Every rollout the cluster's controller knows (running and ended), oldest first."""
    try:
        handle = controller()
    except ValueError:
        return []
    import ray

    return [Rollout(state["id"], state) for state in ray.get(handle.list.remote())]


class Rollout:
    """A rollout running in the cluster; every property asks the controller for the newest state."""

    def __init__(self, rollout_id: str, state: dict[str, Any] | None = None) -> None:
        self.id = rollout_id
        self._last = state or {}

    def state(self) -> dict[str, Any]:
        """Everything the controller knows: status, reason, step, shares, the guard and the figures."""
        import ray

        self._last = ray.get(controller().get.remote(self.id))
        return self._last

    @property
    def status(self) -> str:
        """``"running"``, ``"promoted"``, ``"rolled back"`` or ``"stopped"``."""
        return str(self.state()["status"])

    @property
    def reason(self) -> str | None:
        """Why it ended (or what it waits for), with the numbers that decided it."""
        return self.state()["reason"]

    @property
    def step(self) -> int:
        """The step it is at, from 1 (0: not started)."""
        return int(self.state()["step"])

    def wait(self, timeout: float | None = None) -> str:
        """Block until it ends; its final status. ``TimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (status := self.status) == "running":
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"rollout {self.id} is still running after {timeout} s: {self.reason}")
            time.sleep(0.2)
        return status

    def stop(self) -> None:
        """Set the route back to the version it had ("stopped"); no alias moves."""
        import ray

        ray.get(controller().stop.remote(self.id))
        self.wait(timeout=120)

    def __repr__(self) -> str:
        s = self._last
        return (
            f"Rollout({self.id!r}, route={s.get('route')!r}, candidate={s.get('candidate')!r}, "
            f"status={s.get('status')!r}, step={s.get('step')}/{len(s.get('steps', ()))})"
        )


class _Figures:
    """A candidate's or a baseline's answers: how many, how many failed, the newest latencies (ms)."""

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.latencies: list[float] = []

    def add(self, samples: list[tuple[float, bool]]) -> None:
        self.requests += len(samples)
        self.errors += sum(failed for _, failed in samples)
        self.latencies.extend(ms for ms, _ in samples)
        if len(self.latencies) > 2 * KEEP:
            del self.latencies[:-KEEP]

    def p99(self) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies[-KEEP:])
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    def summary(self) -> dict[str, Any]:
        p99 = self.p99()
        return {
            "requests": self.requests,
            "errors": self.errors,
            "error_rate": round(self.errors / self.requests, 4) if self.requests else None,
            "p99_ms": round(p99, 3) if p99 is not None else None,
        }


class RolloutController:
    """The cluster's rollouts (see the module's docstring); one thread drives each."""

    def __init__(self) -> None:
        self.rollouts: dict[str, dict[str, Any]] = {}
        self.figures: dict[str, dict[str, _Figures]] = {}  # id -> {"candidate", "baseline", "step"}
        self.stopping: set[str] = set()
        self.lock = threading.Lock()

    # ------------------------------------------------------------ the API
    def start(
        self, route: str, ref: str, steps: tuple[float, ...], step_s: float, guard: dict[str, Any], servable: type
    ) -> dict[str, Any] | Exception:
        """Check the route and the candidate, then drive the rollout on a thread; its first state.
        A refusal comes back as the exception (raised in the caller, without Ray's wrapping)."""
        try:
            servable, baseline, candidate, alias = self._prepare(route, ref, servable)
        except (ServeError, SettingsError) as exc:
            return exc
        rollout_id = f"rollout-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        state = {
            "id": rollout_id,
            "route": route,
            "app": servable.name,
            "baseline": baseline,
            "baseline_split": dict(servable.plan["split"]),
            "candidate": candidate,
            "candidate_ref": ref,
            "alias": alias,
            "steps": list(steps),
            "step_s": step_s,
            "guard": guard,
            "status": "running",
            "reason": "starting",
            "step": 0,
            "split": dict(servable.plan["split"]),
            "started": time.time(),
            "step_started": None,
            "ended": None,
        }
        with self.lock:
            self.rollouts[rollout_id] = state
            self.figures[rollout_id] = {"candidate": _Figures(), "baseline": _Figures(), "step": _Figures()}
        threading.Thread(target=self._drive, args=(rollout_id, servable), daemon=True).start()
        return self._view(rollout_id)

    def report(self, rollout_id: str, pending: dict[str, list[tuple[float, bool]]]) -> None:
        """A replica's figures since its last report: ``{"key:N": [(latency ms, failed), ...]}``."""
        with self.lock:
            state, figures = self.rollouts.get(rollout_id), self.figures.get(rollout_id)
            if state is None or figures is None or state["status"] != "running":
                return
            for label, samples in pending.items():
                if label == state["candidate"]:
                    figures["candidate"].add(samples)
                    figures["step"].add(samples)
                else:
                    figures["baseline"].add(samples)

    def get(self, rollout_id: str) -> dict[str, Any]:
        if rollout_id not in self.rollouts:
            raise ServeError(f"No rollout {rollout_id!r}; `rm.serve.rollouts()` lists them.")
        return self._view(rollout_id)

    def list(self) -> list[dict[str, Any]]:
        return [self._view(rollout_id) for rollout_id in self.rollouts]

    def running(self, route: str) -> str | None:
        """The id of the rollout running on ``route``, if any."""
        with self.lock:
            return next((i for i, r in self.rollouts.items() if r["route"] == route and r["status"] == "running"), None)

    def stop(self, rollout_id: str) -> None:
        self.get(rollout_id)
        self.stopping.add(rollout_id)

    def _view(self, rollout_id: str) -> dict[str, Any]:
        with self.lock:
            state = dict(self.rollouts[rollout_id])
            figures = self.figures[rollout_id]
            state["figures"] = {name: f.summary() for name, f in figures.items()}
        return state

    # ------------------------------------------------------------ driving
    def _prepare(self, route: str, ref: str, servable_class: type) -> tuple[Any, str, str, str | None]:
        """``(the route's Servable, its version "key:N", the candidate's "key:N", the alias to move)``."""
        from ray import serve

        from raymodel.registry import Registry
        from raymodel.serve._traffic import check_ref

        key, version = check_ref(ref, "The rollout's candidate")
        spec = None
        for name in serve.status().applications:
            try:
                handle = serve.get_app_handle(name)
                if handle.stats.remote().result(timeout_s=10).get("route") == route:
                    spec = handle.spec.remote().result(timeout_s=10)
                    break
            except Exception:  # noqa: BLE001 - another application (not a route of registry versions)
                continue
        if spec is None:
            raise ServeError(
                f"No route of registry versions at `{route}`; serve one first: "
                f"`rm.Servable('{key}@production', '{route}').deploy()` (`raymodel serve`)."
            )
        running = self.running(route)
        if running is not None:
            raise ServeError(f"`{route}` is being rolled out already ({running}); stop it first.")
        plan = spec["plan"]
        if len(plan["split"]) != 1:
            raise ServeError(
                f"A rollout starts from a route that serves one version; `{route}` splits "
                f"{plan['split']}. Set it to one first: `served.set_split({{'{key}@production': 1.0}})`."
            )
        (base_ref,) = plan["split"]
        base_key, base_version = parse_ref(base_ref)
        if base_key != key:
            raise ServeError(f"`{route}` serves `{base_key}`; a rollout's candidate is a version of it (got {ref!r}).")
        registry = Registry(plan["registry"])
        baseline = f"{key}:{registry.resolve(key, base_version)}"
        candidate = f"{key}:{registry.resolve(key, version)}"  # raises, naming the versions there are
        if candidate == baseline:
            raise ServeError(f"{ref!r} names {candidate}, the version `{route}` serves already.")
        servable = servable_class(
            {base_ref: 1.0},
            route,
            settings=spec["settings"],
            registry=plan["registry"],
            shadow=plan.get("shadow"),
            shadow_fraction=plan.get("shadow_fraction", 1.0),
        )
        alias = base_version if isinstance(base_version, str) else None
        return servable, baseline, candidate, alias

    def _set(self, rollout_id: str, **changes: Any) -> None:
        with self.lock:
            self.rollouts[rollout_id].update(changes)

    def _drive(self, rollout_id: str, servable: Any) -> None:
        state = self.rollouts[rollout_id]
        base_ref = next(iter(state["baseline_split"]))
        candidate, guard = state["candidate"], state["guard"]
        try:
            for i, share in enumerate(state["steps"], start=1):
                split = {candidate: 1.0} if share >= 1.0 else {base_ref: 1.0 - share, candidate: share}
                self._route(servable, split, rollout_id)
                with self.lock:
                    self.figures[rollout_id]["step"] = _Figures()
                    state.update(step=i, split=split, step_started=time.time(), reason=f"step {i}: {share:.0%}")
                ended = self._watch(rollout_id, i, share, guard, state["step_s"])
                if ended is not None:
                    status, reason = ended
                    self._route(servable, state["baseline_split"], None)
                    split = state["baseline_split"]
                    self._set(rollout_id, status=status, reason=reason, split=split, ended=time.time())
                    return
            self._promote(rollout_id, servable)
        except Exception as exc:  # noqa: BLE001 - whatever broke, the route goes back to what it served
            detail = f"{type(exc).__name__}: {exc}"
            try:
                self._route(servable, state["baseline_split"], None)
                reason = f"stopped: {detail}; `{state['route']}` serves {state['baseline']} again"
            except Exception:  # noqa: BLE001 - the route itself is gone
                reason = f"stopped: {detail} (the route could not be set back: is it still served?)"
            self._set(rollout_id, status="stopped", reason=reason, ended=time.time())
            print(f"rollout {rollout_id} stopped\n{traceback.format_exc()}", flush=True)

    def _route(self, servable: Any, split: dict[str, float], rollout_id: str | None) -> None:
        servable._set_split(split)
        servable.rollout_id = rollout_id
        servable.apply()

    def _watch(
        self, rollout_id: str, i: int, share: float, guard: dict[str, Any], step_s: float
    ) -> tuple[str, str] | None:
        """Until step ``i`` passes (None) or the rollout ends (``(status, reason)``)."""
        state = self.rollouts[rollout_id]
        began = time.monotonic()
        while True:
            time.sleep(0.1)
            if rollout_id in self.stopping:
                back = f"`{state['route']}` serves {state['baseline']} again"
                return "stopped", f"stopped at step {i} ({share:.0%}); {back}"
            with self.lock:
                figures = self.figures[rollout_id]
                judged = [(name, figures[name]) for name in ("step", "candidate")]
                breach = next((b for name, f in judged if (b := _breach(f, guard, name)) is not None), None)
                in_step = figures["step"].requests
            if breach is not None:
                return "rolled back", (
                    f"rolled back at step {i} ({share:.0%}): {state['candidate']} {breach}; "
                    f"`{state['route']}` serves {state['baseline']} again, no alias moved"
                )
            waited = time.monotonic() - began
            if waited >= step_s and in_step >= guard["min_requests"]:
                return None
            if waited >= step_s:
                self._set(
                    rollout_id,
                    reason=f"step {i} ({share:.0%}): waiting for {guard['min_requests']} requests "
                    f"of {state['candidate']} (has {in_step})",
                )

    def _promote(self, rollout_id: str, servable: Any) -> None:
        from raymodel.registry import Registry

        state = self.rollouts[rollout_id]
        key, n = state["candidate"].rsplit(":", 1)
        base_ref = next(iter(state["baseline_split"]))
        if state["alias"] is not None:
            Registry(servable.plan["registry"]).set_alias(key, state["alias"], int(n))
            final, moved = {base_ref: 1.0}, f"{key}@{state['alias']} now names {state['candidate']}"
        else:
            final = {state["candidate"]: 1.0}
            moved = f"`{state['route']}` serves {state['candidate']} (no alias to move)"
        self._route(servable, final, None)
        with self.lock:
            c = self.figures[rollout_id]["candidate"].summary()
        self._set(
            rollout_id,
            status="promoted",
            split=final,
            ended=time.time(),
            reason=f"promoted after {len(state['steps'])} steps ({c['requests']} requests, "
            f"{c['errors']} failed, p99 {c['p99_ms']} ms): {moved}",
        )


def _breach(figures: _Figures, guard: dict[str, Any], over: str) -> str | None:
    """What the candidate broke, with the numbers, once ``figures`` hold ``min_requests`` answers."""
    n = figures.requests
    if n < guard["min_requests"]:
        return None
    where = "in this step" if over == "step" else "in the rollout"
    rate = figures.errors / n
    if rate > guard["max_error_rate"]:
        return (
            f"failed {figures.errors} of {n} requests {where} (error rate {rate:.1%}, "
            f"over max_error_rate {guard['max_error_rate']:.1%})"
        )
    limit = guard["max_p99_ms"]
    p99 = figures.p99()
    if limit is not None and p99 is not None and p99 > limit:
        return f"answered with p99 {p99:.1f} ms over {n} requests {where} (over max_p99_ms {limit:g} ms)"
    return None
