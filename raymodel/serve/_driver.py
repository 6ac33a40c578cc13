"""``Servable``, behind ``model.serve(route)``: a model or a registry version as a Ray Serve application."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Mapping

from raymodel._internal import locations, storage
from raymodel._internal.name_rules import route_app_name
from raymodel._ray import cluster, ingress
from raymodel.contract import text_generation, training_server
from raymodel.exceptions import ServeError, SettingsError
from raymodel.serve._failures import replica_failures
from raymodel.serve._rollouts.rollout import Guard, Rollout, known_rollouts, running_on, start_rollout
from raymodel.serve._routes.declared import declare, forget
from raymodel.serve._routes.plan import RoutePlan, is_multiplexed, plan_route
from raymodel.serve._settings import ServeSettings, replica_needs, replica_options, replica_settings

logger = logging.getLogger(__name__)

#: How long ``Servable.apply`` waits for Serve to hand a replica its new split before handing it
#: the split itself (a replica takes one in about a second here).
PUSH_AFTER_S = 10.0

if TYPE_CHECKING:
    from raymodel.contract import Model


class ServedModel:
    """A model being served. ``url`` is the HTTP endpoint; ``predict`` goes through a Serve handle."""

    def __init__(
        self, name: str, route: str, url: str, handle: Any, info: dict[str, Any], servable: Servable | None = None
    ) -> None:
        self.name, self.route, self.url, self.info = name, route, url, info
        self._handle = handle
        self._servable = servable

    def set_split(self, split: Mapping[str, float]) -> None:
        """New weights for a route of registry versions, live: Serve reconfigures the route's replicas
        in place (no restart, no request fails); returns once the route answers with them.

        Args:
            split: ``{reference: weight}``, weights positive and summing to 1, e.g.
                ``{"digits@production": 0.5, "digits@candidate": 0.5}``.
        """
        servable = self._routed("set_split")
        rolling = running_on(self.route)
        if rolling is not None:
            raise ServeError(f"`{self.route}` is being rolled out ({rolling}); stop the rollout first.")
        servable._set_split(split)  # every check first: a bad split changes nothing
        servable.apply()
        assert servable.plan is not None and servable.plan.split is not None  # `_routed` checked it
        self.info["split"] = dict(servable.plan.split)

    def rollout(
        self,
        ref: str,
        steps: tuple[float, ...] = (0.05, 0.25, 1.0),
        step_s: float = 60.0,
        guard: Guard | Mapping[str, Any] | None = None,
    ) -> Rollout:
        """Move this route's traffic to ``ref`` in steps, in the cluster; roll back at once on a breach
        of ``guard``, promote after the last step (docs/model-server.md, "Rollouts").

        Args:
            ref: The candidate, a registry reference of the route's key (``"digits@candidate"``,
                ``"digits:4"``); pinned to the version it names now.
            steps: The candidate's shares, increasing, in (0, 1]; the route's version keeps the rest.
            step_s: The least time a step lasts (it also waits for ``guard.min_requests``).
            guard: ``rm.Guard`` (or a dict of its fields): the limits the candidate must keep.

        Returns:
            A ``Rollout``: ``status``, ``reason``, ``step``, ``wait()``, ``stop()``. It goes on if this
            process exits; ``rm.serve.rollouts()`` lists it from any process.
        """
        self._routed("rollout")
        return start_rollout(self.route, ref, steps, step_s, guard, Servable)

    def _routed(self, what: str) -> Servable:
        servable = self._servable
        if servable is None or servable.plan is None or servable.plan.multiplexed:
            raise ServeError(
                f"`{what}` works on a route of registry versions; `{self.route}` serves "
                + ("a multiplexed key" if servable is not None and servable.plan else "a model instance")
                + ". Serve a reference: `rm.Servable('digits@production', route).deploy()`."
            )
        return servable

    def predict(self, payload: Any) -> Any:
        """Answer ``payload`` in-cluster (preprocess, batched forward, postprocess)."""
        return self._handle.predict.remote(payload).result()

    def shutdown(self) -> None:
        """Delete the application; its replicas, their resources and its serve checkpoints are released."""
        _take_down(self.name)

    def __repr__(self) -> str:
        return f"ServedModel(name={self.name!r}, url={self.url!r})"


def rollout(
    route: str,
    ref: str,
    steps: tuple[float, ...] = (0.05, 0.25, 1.0),
    step_s: float = 60.0,
    guard: Guard | Mapping[str, Any] | None = None,
) -> Rollout:
    """``served.rollout(...)`` for a route served by any process, named by its path (``"/digits"``);
    what ``raymodel serve rollout`` runs. Arguments as ``ServedModel.rollout``; the route must serve
    one registry version."""
    return start_rollout(route, ref, steps, step_s, guard, Servable)


def rollouts(start: bool = False) -> list[Rollout]:
    """Every rollout the cluster's controller knows (running and ended), oldest first. ``start``: start
    the controller if it is not running (it takes up the rollouts kept in storage as running)."""
    return known_rollouts(Servable if start else None)


class Servable:
    """A model, or a registry version, ready to be served over HTTP by Ray Serve.

    ``deploy()`` is ``model.serve(route)``; ``as_application()`` gives the Ray
    Serve ``Application`` itself, for ``serve.run(app)``, for composing with
    other deployments, for ``serve run module:app`` or a Serve config file.

    Args:
        model_or_ref: A model instance (its current weights are served), a
            registry reference ``"digits@production"``, ``"digits:3"`` or
            ``"digits"`` (the newest version), or a ``ModelRef``. The model
            server (docs/model-server.md): a weighted split
            ``{"digits@production": 0.9, "digits@candidate": 0.1}`` (weights
            positive, summing to 1; sticky per ``x-raymodel-key`` header), or
            ``"digits@*"`` (``"*"``: any key) for any version chosen per request
            by the ``x-raymodel-model`` header.
        route: The URL path, e.g. ``"/digits"``.
        settings: A ``ServeSettings`` or a dict of its fields.
        registry: The registry of a reference (default: ``RAYMODEL_REGISTRY``
            or ``$RAYMODEL_HOME/registry``).
        shadow: A registry reference that gets a copy of every request after
            the answer is sent; its answers are compared with the answered
            version's (agreement, mean absolute difference) and never returned.
        shadow_fraction: The share of requests copied to the shadow, in (0, 1].

    A route served by alias (or by key, for the newest version) follows it:
    each replica checks every ``registry_poll_s`` seconds and, when the alias
    moves, loads the new version in the background and swaps it in; requests
    in flight finish on the old one and none fails.

    Example:
        >>> app = rm.Servable("digits@production", "/digits").as_application()
        >>> serve.run(app, route_prefix="/digits")   # or: serve run my_module:app --route-prefix /digits
    """

    def __init__(
        self,
        model_or_ref: Any,
        route: str = "/",
        *,
        settings: ServeSettings | Mapping[str, Any] | None = None,
        registry: str | None = None,
        shadow: str | None = None,
        shadow_fraction: float = 1.0,
    ) -> None:
        self.settings = ServeSettings.coerce(settings)
        self.route = _check_route(route)
        self.name = self.settings.name or route_app_name(self.route)
        self.model: Any = None
        self.plan: RoutePlan | None = None  # a route of registry versions (one, a split, a shadow, multiplexed)
        self.rollout_id: str | None = None  # the rollout this route is in (set by the rollout controller)
        self._written: str | None = None  # the serve checkpoint ``as_application`` wrote
        self._registry = registry
        if (
            isinstance(model_or_ref, (str, Mapping))
            or type(model_or_ref).__name__ == "ModelRef"
            or shadow is not None
            or is_multiplexed(model_or_ref)
        ):
            self.plan, self.info = plan_route(model_or_ref, shadow, shadow_fraction, registry, self.settings)
        elif hasattr(model_or_ref, "backend") and callable(getattr(model_or_ref, "save", None)):
            model_or_ref.backend.import_framework()
            from raymodel.contract.schema import schemas_of

            schemas_of(type(model_or_ref))  # a bad input/output schema fails here, before any replica starts
            if self.settings.api == "openai":
                model_or_ref.ensure_setup()
                try:
                    text_generation(model_or_ref)
                except ValueError as exc:
                    raise ServeError(str(exc) + ".") from None
            self.model = model_or_ref
            self.info = {
                "class": f"{type(model_or_ref).__module__}.{type(model_or_ref).__qualname__}",
                "backend": model_or_ref.backend.name,
                "config": _plain(model_or_ref.config),
            }
        else:
            raise ServeError(
                f"`Servable` takes a model or a registry reference like 'digits@production' "
                f"(got {type(model_or_ref).__name__})."
            )
        self.info["route"] = self.route

    def as_application(self) -> Any:
        """The Ray Serve ``Application`` (not yet running); a model's weights are saved for it first."""
        from ray import serve

        from raymodel.serve._replica.deployment import ModelReplica

        if self.plan is not None:
            return routed_application(self)
        source = {"checkpoint": _checkpoint_of(self.model, self.name)}
        self._written = source["checkpoint"]
        info = {**self.info, "source": dict(self.model.source) if self.model.source else dict(source)}
        s = self.settings
        options = {"name": f"{self.name}-model", **replica_options(s)}
        return (
            serve.deployment()(ModelReplica)
            .options(**options)
            .bind(source, info, s.max_batch_size, s.batch_wait_timeout_s, s.max_body_bytes, s.api, s.api_keys)
        )

    def deploy(self) -> ServedModel:
        """Run the application on Ray Serve (starting Ray and Serve if needed); a rolling update
        when the route's application is already running. From a client off the cluster, the
        cluster deploys it (its proxy on every address of the head unless ``settings.host`` says
        otherwise) and ``url`` is the head's."""
        from raymodel._ray import remote

        if remote.active() is not None:
            return _deploy_off_cluster(self)
        cluster.ensure_ray(False)
        # Idle pools of the training server in the replicas' way give their resources back first (a
        # route of several versions: every idle pool).
        training_server().make_room(None if self.plan is not None else replica_needs(self.settings))
        from ray import serve

        app = self.as_application()
        ingress.start_http(self.settings.host, self.settings.port)
        cluster.quiet(False)  # Serve sets up its own driver logger when it starts: quiet it again
        new = self.name not in serve.status().applications
        try:
            handle = serve.run(app, name=self.name, route_prefix=self.route, blocking=False)
        except Exception as exc:
            self._discard_written()
            failed = replica_failures(self.name)  # what a replica raised, not only Serve's summary
            why = f"its replicas failed to start: {failed} (Serve: {exc})" if failed else str(exc)
            if new:  # nothing half-deployed stays behind: a failed application would hold its route
                with contextlib.suppress(Exception):  # the deploy's own error is what to say
                    serve.delete(self.name)
            raise ServeError(f"Could not deploy `{self.info['class']}` at `{self.route}`: {why}") from exc
        # The application runs on the new checkpoint now: the ones it replaced are not needed any more.
        folder = serve_folder(self.name)
        for name in storage.listdir(folder):
            location = storage.join(folder, name)
            if location != self._written:
                storage.delete(location)
        host, port = _http_address(self.settings)
        url = f"http://{host}:{port}{self.route}"
        try:
            _wait_until_answering(url)
        except ServeError:
            if new:  # nothing half-deployed stays behind (a rolling update keeps its route)
                serve.delete(self.name)
                self._discard_written()
            raise
        if self.plan is not None:
            declare(self)  # served again when a head starts on the same storage (``serve/_routes/declared.py``)
        return ServedModel(self.name, self.route, url, handle, self.info, self)

    def _set_split(self, split: Mapping[str, float]) -> None:
        assert self.plan is not None
        plan, info = plan_route(split, self.plan.shadow, self.plan.shadow_fraction, self._registry, self.settings)
        self.plan, self.info = plan, {**info, "route": self.route}

    def apply(self, timeout_s: float = 60.0) -> None:
        """Redeploy a running route with this servable's split (and rollout): a reconfiguration in
        place; returns once every replica answers with it.

        Serve's controller hands the new ``user_config`` to each replica; a replica still on the old
        split after ``PUSH_AFTER_S`` (a controller slow on a loaded head) is handed the same split
        directly (``RouteServer.take``, idempotent). ``user_config`` stays what a replica started later
        reads."""
        from ray import serve

        assert self.plan is not None
        serve.run(self.as_application(), name=self.name, route_prefix=self.route, blocking=False)
        config = {"split": self.plan.split, "rollout": self.rollout_id}
        wanted = (config["split"], config["rollout"])
        handle = serve.get_app_handle(self.name)
        began = time.monotonic()
        pushed = False
        while True:
            seen = [(now.plan.split, now.rollout) for now in handle.broadcast("spec").results(timeout_s=10)]
            behind = [s for s in seen if s != wanted]
            if seen and not behind:
                if self.rollout_id is None:  # a rollout's steps are its own: it sets them again after a restart
                    declare(self)
                return
            waited = time.monotonic() - began
            if behind and not pushed and waited > PUSH_AFTER_S:
                logger.warning(
                    "`%s`: %d of %d replicas still answer with %s %.0f s after the redeploy; handing them "
                    "the split %s directly",
                    self.route,
                    len(behind),
                    len(seen),
                    behind[0][0],
                    waited,
                    wanted[0],
                )
                handle.broadcast("take", config).results(timeout_s=30)
                pushed = True
            if waited > timeout_s:
                raise ServeError(
                    f"`{self.route}` did not take the split {wanted[0]} (rollout {wanted[1]}) within "
                    f"{timeout_s:.0f} s: {len(behind)} of {len(seen)} replicas answer with "
                    f"{behind[0][0] if behind else None} (rollout {behind[0][1] if behind else None}); "
                    f"Serve says {_deployment_status(self.name)}; Serve's logs say why "
                    "(`ray/session_latest/logs/serve/` under Ray's temp folder)."
                )
            time.sleep(0.05)

    def _discard_written(self) -> None:
        """Delete the serve checkpoint ``as_application`` wrote, for a deployment that did not happen."""
        if self._written:
            storage.delete(self._written)

    def __repr__(self) -> str:
        if self.plan is not None:
            return f"Servable({self.plan.served!r}, route={self.route!r})"
        return f"Servable({self.info['class']!r}, route={self.route!r})"


def _plain(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v) for k, v in config.items()}


def _check_route(route: Any) -> str:
    if not isinstance(route, str) or not route.startswith("/") or " " in route:
        raise SettingsError(f"`route` must be a URL path starting with '/', like '/digits' (got {route!r}).")
    return route.rstrip("/") or "/"


def serve_folder(name: str) -> str:
    """Where an application's serve checkpoints live: ``$RAYMODEL_HOME/serve/<name>`` (any URI)."""
    return locations.home_path("serve", name)


def _checkpoint_of(model: Model, name: str) -> str:
    """A checkpoint of the instance's *current* weights, which every replica loads itself, from
    wherever ``RAYMODEL_HOME`` is (a replica on another node reads the URI)."""
    return model.save(storage.join(serve_folder(name), f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}"))


def _deployment_status(app: str) -> str:
    """Serve's word on an application's deployments (their status, message and replicas' states)."""
    from ray import serve

    try:
        deployments = serve.status().applications[app].deployments
    except Exception as exc:  # noqa: BLE001 - only for an error message
        return f"nothing ({type(exc).__name__}: {exc})"
    return "; ".join(
        f"{name}: {d.status}" + (f" ({d.message})" if d.message else "") + f", replicas {dict(d.replica_states)}"
        for name, d in deployments.items()
    )


def _wait_until_answering(url: str, timeout_s: float = 60.0) -> None:
    """Serve says the replicas run before HAProxy has reloaded with them: wait until the route's
    ``/health`` answers through the HTTP front, so the first request a caller sends is answered."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=5) as answer:
                if answer.status == 200 and b'"ok"' in answer.read():
                    return
        except urllib.error.HTTPError as exc:
            if exc.code == 401:  # a route with keys: the replica answers (this process holds no key)
                return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise ServeError(
                f"`{url}` did not answer within {timeout_s:.0f} s of being deployed; Serve's "
                "logs say why (`ray/session_latest/logs/serve/` under Ray's temp folder)."
            )
        time.sleep(0.1)


class ServedOffCluster(ServedModel):
    """A route that a client off the cluster deployed: requests go to its URL over HTTP, and its
    shutdown is a call of the cluster's."""

    def predict(self, payload: Any) -> Any:
        """Answer ``payload`` through the route's URL."""
        import requests

        answer = requests.post(self.url, json=payload, timeout=60)
        if answer.status_code != 200:
            raise ServeError(f"`{self.url}` answered {answer.status_code}: {answer.text[:500]}")
        return answer.json()

    def set_split(self, split: Mapping[str, float]) -> None:
        """As ``ServedModel.set_split``: checked here, then the route reconfigured in a call of the cluster's."""
        from raymodel._ray import remote

        servable = self._routed("set_split")
        servable._set_split(split)  # every check first, here: a bad split changes nothing
        rolling = running_on(self.route)
        if rolling is not None:
            raise ServeError(f"`{self.route}` is being rolled out ({rolling}); stop the rollout first.")
        remote.call(_apply_here, servable)
        assert servable.plan is not None and servable.plan.split is not None  # `_routed` checked it
        self.info["split"] = dict(servable.plan.split)

    def shutdown(self) -> None:
        from raymodel._ray import remote

        remote.call(_shutdown_here, self.name)


def _apply_here(servable: Servable) -> None:
    """On the cluster: ``servable.apply()`` (a route's new split, in place)."""
    cluster.ensure_ray(False)
    servable.apply()


def _deploy_off_cluster(servable: Servable) -> ServedModel:
    """``servable.deploy()`` from a client off the cluster: one call of the cluster's deploys it there."""
    from urllib.parse import urlparse

    from raymodel._ray import remote

    on = remote.active()
    assert on is not None
    if servable.settings.host == ServeSettings().host:  # the default, this machine's loopback: the head's every address
        servable.settings = dataclasses.replace(servable.settings, host="0.0.0.0")
    name, route, (host, port), info = remote.call(
        _deploy_here, servable, by_value=(servable.model,) if servable.model is not None else ()
    )
    if host in ("0.0.0.0", "::", "127.0.0.1", "localhost"):
        host = urlparse(on.address).hostname or host
    return ServedOffCluster(name, route, f"http://{host}:{port}{route}", None, info, servable)


def _deploy_here(servable: Servable) -> tuple[str, str, tuple[str, int], dict[str, Any]]:
    """On the cluster, in a call's driver: deploy the route; its name, path, proxy address and info."""
    served = servable.deploy()
    return served.name, served.route, _http_address(servable.settings), served.info


def _shutdown_here(name: str) -> None:
    """On the cluster: ``ServedModel.shutdown`` of the application ``name``."""
    cluster.ensure_ray(False)
    _take_down(name)


def _take_down(name: str) -> None:
    """Delete the application ``name`` and its serve checkpoints."""
    from ray import serve

    serve.delete(name, _blocking=True)
    storage.delete(serve_folder(name))
    forget(name)  # a route of registry versions is not served again after a restart


def _http_address(settings: ServeSettings) -> tuple[str, int]:
    """Where the proxy really listens (the first ``serve.start`` of the cluster decides)."""
    try:
        from ray.serve.context import _get_global_client

        client = _get_global_client()
        if client is None:
            return settings.host, settings.port
        config = client.http_config
        return config.host, config.port
    except Exception:  # noqa: BLE001 - fall back to what was asked for
        return settings.host, settings.port


def routed_application(servable: Any) -> Any:
    """The Serve application of a route of registry versions: ``RouteServer`` (one deployment; the split
    and the rollout in its ``user_config``, so that a new split is a reconfiguration, not a restart),
    or, for a multiplexed route, ``ModelRouter`` in front of ``VersionServer``."""
    from ray import serve

    s, plan = servable.settings, servable.plan
    split = plan.split
    # Serve restarts a deployment whose version changes; the same version with a new ``user_config``
    # is reconfigured in place. The version is what the route is, less its weights and its split. (Serve's
    # Python API gives every ``serve.run`` a random version, a restart; the option is private since 2.x.)
    unsplit = sorted((k, v) for k, v in dataclasses.asdict(plan).items() if k != "split" and v is not None)
    version = hashlib.sha256(repr((unsplit, replica_settings(s))).encode()).hexdigest()[:16]
    info = {key: value for key, value in servable.info.items() if key != "split"}
    if split is not None:
        from raymodel.serve._routes.server import RouteServer

        return (
            serve.deployment()(RouteServer)
            .options(
                name=f"{servable.name}-model",
                version=version,
                _internal=True,
                user_config={"split": split, "rollout": servable.rollout_id},
                **replica_options(s),
            )
            .bind(plan, info, s.max_batch_size, s.batch_wait_timeout_s, s.max_body_bytes, s)
        )
    if s.api == "openai":  # a key's versions (LoRA adapters on one base) chosen by the request's `model`
        from raymodel.serve._llm.adapters import AdapterServer

        options = {"name": f"{servable.name}-model", "version": version, "_internal": True, **replica_options(s)}
        return serve.deployment()(AdapterServer).options(**options).bind(plan, info, s)
    from raymodel.serve._routes.versions import ModelRouter, VersionServer

    options = {"name": f"{servable.name}-versions", "version": version, "_internal": True, **replica_options(s)}
    backend = (
        serve.deployment()(VersionServer)
        .options(**options)
        .bind(plan.registry, s.max_models_per_replica, s.max_batch_size, s.batch_wait_timeout_s, s.max_body_bytes)
    )
    router = serve.deployment()(ModelRouter).options(
        name=f"{servable.name}-router",
        version=version,
        _internal=True,
        num_replicas=1,
        # Routing is a few dict look-ups and a handle call per request: it takes no CPU of its own.
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=max(256, s.max_ongoing_requests),
        logging_config={"enable_access_log": s.access_log},
    )
    return router.bind(backend, plan, info, s.max_body_bytes, s.api_keys)
