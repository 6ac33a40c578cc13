"""``model.serve(route)``: deploy the instance's current weights on Ray Serve."""

from __future__ import annotations

import os
import re
import time
from typing import TYPE_CHECKING, Any, Mapping

from raymodel._internal import runtime
from raymodel.exceptions import ServeError, SettingsError
from raymodel.serve._settings import ServeSettings

if TYPE_CHECKING:
    from raymodel.model import RayModel


class ServedModel:
    """A model being served. ``url`` is the HTTP endpoint; ``predict`` goes through a Serve handle."""

    def __init__(self, name: str, route: str, url: str, handle: Any, info: dict[str, Any]) -> None:
        self.name, self.route, self.url, self.info = name, route, url, info
        self._handle = handle

    def predict(self, payload: Any) -> Any:
        """Answer ``payload`` in-cluster (preprocess, batched forward, postprocess)."""
        return self._handle.predict.remote(payload).result()

    def shutdown(self) -> None:
        """Delete the application; its replicas and their resources are released."""
        from ray import serve

        serve.delete(self.name, _blocking=True)

    def __repr__(self) -> str:
        return f"ServedModel(name={self.name!r}, url={self.url!r})"


def serve_model(model: "RayModel", route: str, settings: ServeSettings | Mapping[str, Any] | None) -> ServedModel:
    settings = ServeSettings.coerce(settings)
    route = _check_route(route)
    model.backend.import_framework()
    runtime.ensure_ray(False)
    from ray import serve

    from raymodel.serve._deployment import ModelServer

    name = settings.name or (re.sub(r"[^A-Za-z0-9_-]", "_", route.strip("/")) or "root")
    checkpoint = _checkpoint_of(model, name)
    info = {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "backend": model.backend.name,
        "config": {k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
                   for k, v in model.config.items()},
        "source": dict(model.source) or {"checkpoint": checkpoint},
        "route": route,
    }
    _start_http(settings)
    options: dict[str, Any] = {
        "name": f"{name}-model",
        "max_ongoing_requests": settings.max_ongoing_requests,
        "ray_actor_options": settings.ray_actor_options or {},
    }
    if settings.num_replicas == "auto":
        options["autoscaling_config"] = {"min_replicas": settings.min_replicas,
                                         "max_replicas": settings.max_replicas,
                                         "target_ongoing_requests": max(2, settings.max_batch_size)}
    else:
        options["num_replicas"] = settings.num_replicas
    app = serve.deployment(ModelServer).options(**options).bind(
        checkpoint, info, settings.max_batch_size, settings.batch_wait_timeout_s, settings.max_body_bytes)
    try:
        handle = serve.run(app, name=name, route_prefix=route, blocking=False)
    except Exception as exc:
        raise ServeError(f"Could not deploy `{type(model).__name__}` at `{route}`: {exc}") from exc
    host, port = _http_address(settings)
    return ServedModel(name, route, f"http://{host}:{port}{route}", handle, info)


def _check_route(route: Any) -> str:
    if not isinstance(route, str) or not route.startswith("/") or " " in route:
        raise SettingsError(f"`route` must be a URL path starting with '/', like '/digits' (got {route!r}).")
    return route.rstrip("/") or "/"


def _checkpoint_of(model: "RayModel", name: str) -> str:
    """A checkpoint of the instance's *current* weights, which every replica loads."""
    root = runtime.home()
    if "://" in root:
        raise ServeError("Serving writes a checkpoint under RAYMODEL_HOME, which must be a local path here.")
    path = os.path.join(root, "serve", name, f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}")
    return model.save(path)


def _start_http(settings: ServeSettings) -> None:
    from ray import serve

    serve.start(http_options={"host": settings.host, "port": settings.port})
    runtime.quiet(False)  # Serve sets up its own driver logger when it starts: quiet it again


def _http_address(settings: ServeSettings) -> tuple[str, int]:
    """Where the proxy really listens (the first ``serve.start`` of the cluster decides)."""
    try:
        from ray.serve.context import _get_global_client

        config = _get_global_client().http_config
        return config.host, config.port
    except Exception:  # noqa: BLE001 - fall back to what was asked for
        return settings.host, settings.port
