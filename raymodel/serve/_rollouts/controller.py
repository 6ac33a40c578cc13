"""The rollout controller: the detached actor that drives every rollout of the cluster (see
``rollout.py``'s docstring), and the figures and limits it judges a candidate by."""

from __future__ import annotations

import json
import threading
import time
import traceback
import uuid
from typing import Any

from raymodel._internal import locations, storage
from raymodel._internal.name_rules import parse_ref, route_app_name
from raymodel.exceptions import ServeError, SettingsError
from raymodel.serve._routes.plan import RouteSpec

#: How many of the candidate's latencies a rollout keeps for its p99 (the newest).
KEEP = 20000


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

    def __init__(self, servable: Any) -> None:
        self.rollouts: dict[str, dict[str, Any]] = {}
        self.figures: dict[str, dict[str, _Figures]] = {}  # id -> {"candidate", "baseline", "step"}
        self.stopping: set[str] = set()
        self.lock = threading.Lock()
        # Ray Serve builds every deployment config by registering a module with cloudpickle, dumping
        # and unregistering it (`RequestRouterConfig`): one registry for the process, so two threads
        # at once (a rollout's step and a request to start another) fail with "... is not registered
        # for pickle by value". The controller's threads call Serve one at a time.
        self.serve_calls = threading.RLock()
        self._resume(servable)

    # ------------------------------------------------------------ the API
    def start(
        self, route: str, ref: str, steps: tuple[float, ...], step_s: float, guard: dict[str, Any], servable: Any
    ) -> dict[str, Any] | Exception:
        """Check the route and the candidate, then drive the rollout on a thread; its first state.
        A refusal comes back as the exception (raised in the caller, without Ray's wrapping)."""
        try:
            with self.serve_calls:
                servable, baseline, candidate, alias = self._prepare(route, ref, servable)
        except (ServeError, SettingsError) as exc:
            return exc
        rollout_id = f"rollout-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        state = {
            "id": rollout_id,
            "route": route,
            "app": servable.name,
            "baseline": baseline,
            "baseline_split": dict(servable.plan.split),
            "candidate": candidate,
            "candidate_ref": ref,
            "alias": alias,
            "steps": list(steps),
            "step_s": step_s,
            "guard": guard,
            "status": "running",
            "reason": "starting",
            "step": 0,
            "split": dict(servable.plan.split),
            "started": time.time(),
            "step_started": None,
            "ended": None,
        }
        with self.lock:
            self.rollouts[rollout_id] = state
            self.figures[rollout_id] = {"candidate": _Figures(), "baseline": _Figures(), "step": _Figures()}
        self._save(rollout_id)
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

    def _prepare(self, route: str, ref: str, servable_class: type) -> tuple[Any, str, str, str | None]:
        """``(the route's Servable, its version "key:N", the candidate's "key:N", the alias to move)``."""
        from raymodel.registry import Registry
        from raymodel.serve._routes.traffic import check_ref

        key, version = check_ref(ref, "The rollout's candidate")
        spec = served_spec(route)
        if spec is None:
            raise ServeError(
                f"No route of registry versions at `{route}`; serve one first: "
                f"`rm.Servable('{key}@production', '{route}').deploy()` (`raymodel serve`)."
            )
        running = self.running(route)
        if running is not None:
            raise ServeError(f"`{route}` is being rolled out already ({running}); stop it first.")
        plan = spec.plan
        if len(plan.split or {}) != 1:
            raise ServeError(
                f"A rollout starts from a route that serves one version; `{route}` splits "
                f"{plan.split}. Set it to one first: `served.set_split({{'{key}@production': 1.0}})`."
            )
        (base_ref,) = plan.split or {}
        base_key, base_version = parse_ref(base_ref)
        if base_key != key:
            raise ServeError(f"`{route}` serves `{base_key}`; a rollout's candidate is a version of it (got {ref!r}).")
        registry = Registry(plan.registry)
        baseline = f"{key}:{registry.resolve(key, base_version)}"
        candidate = f"{key}:{registry.resolve(key, version)}"  # raises, naming the versions there are
        if candidate == baseline:
            raise ServeError(f"{ref!r} names {candidate}, the version `{route}` serves already.")
        servable = servable_class(
            {base_ref: 1.0},
            route,
            settings=spec.settings,
            registry=plan.registry,
            shadow=plan.shadow,
            shadow_fraction=plan.shadow_fraction,
        )
        alias = base_version if isinstance(base_version, str) else None
        return servable, baseline, candidate, alias

    def _set(self, rollout_id: str, **changes: Any) -> None:
        with self.lock:
            self.rollouts[rollout_id].update(changes)
        if {"status", "step", "split"} & set(changes):
            self._save(rollout_id)

    # ------------------------------------------------------- kept in storage
    def _save(self, rollout_id: str) -> None:
        """The rollout's state, where a controller started after a head restart finds it (``_resume``)."""
        with self.lock:
            state = json.dumps(self.rollouts[rollout_id])
        storage.write_bytes(storage.join(_folder(), f"{rollout_id}.json"), state.encode())

    def _resume(self, servable: Any) -> None:
        """The rollouts an earlier controller kept: ended ones are listed; each running one goes on from its
        step, with its shares, once its route is served again (``serve/_routes/declared.py``; its figures start anew).

        The controller takes them up itself, whoever started it (Ray restarting it after its death, a
        release's runner following its rollout, or a new head's ``restore``): a rollout kept as running
        and driven by no one would leave the release that follows it waiting in silence. ``servable``:
        the ``Servable`` class, with which it sets the route's split (Ray restarts the actor with it)."""
        for state in _kept():
            self.rollouts[state["id"]] = state
            self.figures[state["id"]] = {"candidate": _Figures(), "baseline": _Figures(), "step": _Figures()}
            if state["status"] == "running":
                state["reason"] = f"resuming at step {max(state['step'], 1)} after a restart: waiting for the route"
                threading.Thread(target=self._go_on, args=(state["id"], servable), daemon=True).start()

    def _go_on(self, rollout_id: str, servable_class: Any, wait_s: float = 300.0) -> None:
        state = self.rollouts[rollout_id]
        deadline = time.monotonic() + wait_s
        while (spec := served_spec(state["route"])) is None:
            if time.monotonic() > deadline:
                reason = f"stopped: `{state['route']}` was not served again within {wait_s:.0f} s of a restart"
                self._set(rollout_id, status="stopped", reason=reason, ended=time.time())
                return
            time.sleep(1.0)
        plan = spec.plan
        servable = servable_class(
            state["baseline_split"],
            state["route"],
            settings=spec.settings,
            registry=plan.registry,
            shadow=plan.shadow,
            shadow_fraction=plan.shadow_fraction,
        )
        self._drive(rollout_id, servable, first=max(int(state["step"]), 1))

    # ------------------------------------------------------------ driving
    def _drive(self, rollout_id: str, servable: Any, first: int = 1) -> None:
        state = self.rollouts[rollout_id]
        base_ref = next(iter(state["baseline_split"]))
        candidate, guard = state["candidate"], state["guard"]
        try:
            for i, share in enumerate(state["steps"], start=1):
                if i < first:  # passed before a restart
                    continue
                split = {candidate: 1.0} if share >= 1.0 else {base_ref: 1.0 - share, candidate: share}
                self._route(servable, split, rollout_id)
                with self.lock:
                    self.figures[rollout_id]["step"] = _Figures()
                    state.update(step=i, split=split, step_started=time.time(), reason=f"step {i}: {share:.0%}")
                self._save(rollout_id)
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
        with self.serve_calls:
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
            Registry(servable.plan.registry).set_alias(key, state["alias"], int(n))
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


def served_spec(route: str) -> RouteSpec | None:
    """What serves ``route`` when it is a route of registry versions (its ``plan``, ``settings``); else
    ``None`` (nothing there, another application, or no Serve running)."""
    from ray import serve

    try:
        names = list(serve.status().applications)
    except Exception:  # noqa: BLE001 - Serve is not running: nothing is served
        return None
    # The application named after the route first (most are); a new driver's first call to a replica
    # waits for Serve to tell it the replicas, seconds on a busy machine.
    names.sort(key=lambda name: name != route_app_name(route))
    for name in names:
        try:
            handle = serve.get_app_handle(name)
            if handle.stats.remote().result(timeout_s=60).get("route") == route:
                spec: RouteSpec = handle.spec.remote().result(timeout_s=60)
                return spec
        except Exception:  # noqa: BLE001 - another application (not a route of registry versions)
            continue
    return None


def running_kept() -> list[str]:
    """The ids of the rollouts kept in storage as running (a controller started now resumes them)."""
    return [state["id"] for state in _kept() if state.get("status") == "running"]


def _kept() -> list[dict[str, Any]]:
    """Every rollout's state kept in storage (a file that cannot be read is left out)."""
    found = []
    for name in storage.listdir(_folder()):
        try:
            found.append(json.loads(storage.read_bytes(storage.join(_folder(), name))))
        except (OSError, ValueError):
            continue
    return found


def _folder() -> str:
    """Where each rollout's state is kept: beside the declared routes (no application's name has a dot)."""
    return locations.home_path("serve", "rollouts.state")


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
