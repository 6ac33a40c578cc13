"""Progressive delivery: ``served.rollout(ref, steps, step_s, guard)``.

A rollout lives in the cluster, in one detached actor (``RolloutController``, ``raymodel-rollouts``
in the ``raymodel`` namespace), not in the caller: it goes on when the caller exits and any process
sees it (``rm.serve.rollouts()``, ``raymodel serve rollouts``, the dashboard). For each step it sets
the route's split (the candidate's share, the route's version the rest) and watches the figures
the route's replicas send it every half second (``serve._routes.server.RouteServer._report``): each
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
import time
from typing import Any, Mapping, Sequence

from raymodel.exceptions import SettingsError

CONTROLLER, NAMESPACE = "raymodel-rollouts", "raymodel"


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
    out: list[float] = []
    for share in steps:
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise SettingsError(f"Each step is a share in (0, 1] (got {share!r} in {tuple(steps)}).")
        if out and share <= out[-1]:
            raise SettingsError(f"`steps` must increase (got {tuple(steps)}).")
        out.append(float(share))
    if isinstance(step_s, bool) or not isinstance(step_s, (int, float)) or not math.isfinite(step_s) or step_s < 0:
        raise SettingsError(f"`step_s` must be a number of seconds >= 0 (got {step_s!r}).")
    return tuple(out), float(step_s)


def controller(servable: type | None = None) -> Any:
    """The rollout controller's handle. Given ``servable`` (the ``Servable`` class, with which it sets
    routes' splits), it is started if it is not running."""
    import ray

    if servable is None:
        return ray.get_actor(CONTROLLER, namespace=NAMESPACE)
    from raymodel.serve._rollouts.controller import RolloutController

    return (
        ray.remote(RolloutController)
        .options(
            name=CONTROLLER,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_concurrency=32,
            # Killed, it comes back and takes up its running rollouts from storage (``_resume``); a call
            # made meanwhile waits for it and is made again there.
            max_restarts=-1,
            max_task_retries=-1,
        )
        .remote(servable)
    )


def start_rollout(route: str, ref: str, steps: Any, step_s: Any, guard: Any, servable: type) -> Rollout:
    """Check every argument here (a bad one changes nothing), then start the rollout in the cluster;
    ``servable`` is the ``Servable`` class, with which the controller redeploys the route."""
    steps, step_s = check_steps(steps, step_s)
    guard = Guard.coerce(guard)
    if not isinstance(ref, str) and type(ref).__name__ != "ModelRef":
        raise SettingsError(f"A rollout's candidate is a registry reference like 'digits@candidate' (got {ref!r}).")
    state = _ask("start", (route, str(ref), steps, step_s, dataclasses.asdict(guard), servable), servable)
    if isinstance(state, Exception):
        raise state
    return Rollout(state["id"], state)


def running_on(route: str) -> str | None:
    """The id of the rollout running on ``route``, if any (None where no controller runs)."""
    try:
        return _ask("running", (route,))
    except ValueError:
        return None


def known_rollouts(servable: type | None = None) -> list[Rollout]:
    """Every rollout the cluster's controller knows (running and ended), oldest first. Given ``servable``
    (the ``Servable`` class), the controller is started if it is not running (it takes up the rollouts
    kept in storage as running)."""
    try:
        states = _ask("list", (), servable)
    except ValueError:
        return []
    return [Rollout(state["id"], state) for state in states]


def _ask(method: str, args: tuple[Any, ...], servable: type | None = None) -> Any:
    """``controller.<method>(*args)``, waited for (``controller(servable)``: a ``ValueError`` where none
    runs and ``servable`` is None); from a client off the cluster, as a call of the cluster's."""
    from raymodel._ray import cluster, remote

    if remote.active() is not None:
        return remote.call(_ask, method, args, servable)
    import ray

    cluster.ensure_ray(False)
    return ray.get(getattr(controller(servable), method).remote(*args))


class Rollout:
    """A rollout running in the cluster; every property asks the controller for the newest state."""

    def __init__(self, rollout_id: str, state: dict[str, Any] | None = None) -> None:
        self.id = rollout_id
        self._last = state or {}

    def state(self) -> dict[str, Any]:
        """Everything the controller knows: status, reason, step, shares, the guard and the figures."""
        self._last = _ask("get", (self.id,))
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
        from raymodel._ray import remote

        if remote.active() is not None:  # off the cluster: one call waits there, not a call per look
            status = remote.call(_wait_here, self.id, timeout)
            self.state()
            return str(status)
        deadline = None if timeout is None else time.monotonic() + timeout
        while (status := self.status) == "running":
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"rollout {self.id} is still running after {timeout} s: {self.reason}")
            time.sleep(0.2)
        return status

    def stop(self) -> None:
        """Set the route back to the version it had ("stopped"); no alias moves."""
        _ask("stop", (self.id,))
        self.wait(timeout=120)

    def __repr__(self) -> str:
        s = self._last
        return (
            f"Rollout({self.id!r}, route={s.get('route')!r}, candidate={s.get('candidate')!r}, "
            f"status={s.get('status')!r}, step={s.get('step')}/{len(s.get('steps', ()))})"
        )


def _wait_here(rollout_id: str, timeout: float | None) -> str:
    """On the cluster: ``Rollout(rollout_id).wait(timeout)``."""
    return Rollout(rollout_id).wait(timeout)
