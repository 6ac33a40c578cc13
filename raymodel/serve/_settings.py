"""``ServeSettings``: how to serve."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from raymodel._internal.settings import (
    SettingsBase,
    check_actor_options,
    check_choice,
    check_int,
    check_name,
    check_number,
    check_type,
    collect,
    settings_class,
)
from raymodel.exceptions import SettingsError
from raymodel.serve._replica.auth import digests


def default_port() -> int:
    """Serve's HTTP port unless one is given: ``RAYMODEL_SERVE_PORT``, else 8000."""
    value = os.environ.get("RAYMODEL_SERVE_PORT", "8000")
    try:
        return int(value)
    except ValueError:
        raise SettingsError(f"`RAYMODEL_SERVE_PORT` must be a port number (got {value!r}).") from None


@settings_class
class ServeSettings(SettingsBase):
    """How to run ``model.serve(route)``. Keyword-only; a plain dict is accepted too.

    Attributes:
        num_replicas: Replicas of the model, or ``"auto"`` to autoscale between
            ``min_replicas`` and ``max_replicas``.
        min_replicas, max_replicas: Autoscaling bounds (``num_replicas="auto"``).
        target_ongoing_requests: Requests in progress per replica that autoscaling
            aims at; default: ``max_batch_size`` (at least 2), a full batch each.
        upscale_delay_s, downscale_delay_s: How long the load must call for more
            (fewer) replicas before Serve adds (removes) one; Serve's defaults.
        look_back_period_s: The window over which Serve averages the load it scales
            by (Serve's 30 s): a shorter one follows a load that stops sooner. Ray 2.60's
            Serve warns (``FutureWarning``) at 10 s or less, its deprecated
            ``metrics_interval_s``, and says a later Serve will refuse it.
        max_batch_size: Requests stacked into one ``forward`` at most.
        batch_wait_timeout_s: How long a batch waits to fill up.
        max_ongoing_requests: Requests one replica accepts at once.
        ray_actor_options: Resources of each replica, e.g. ``{"num_cpus": 1}``.
        host, port: Where Ray Serve's HTTP proxy listens (127.0.0.1 and 8000 by
            default, or ``RAYMODEL_SERVE_PORT``). Serve has one proxy per cluster:
            the first ``serve()`` sets them.
        name: The Serve application's name; default: derived from the route.
        max_body_bytes: Larger request bodies are refused with 413.
        registry_poll_s: How often a replica serving a registry alias (or a key's
            newest version) checks whether it moved.
        access_log: One log line per request in the replica's log (off: it cost
            a tenth of a small model's replica CPU).
        max_models_per_replica: Versions one replica holds at once on a route of
            several versions (a split, a shadow, ``"digits@*"``): an LRU, as Ray
            Serve's model multiplexing keeps it; the least recently used goes first. On an
            OpenAI route of LoRA versions, the adapters one base holds at once.
        api: ``"raymodel"`` (the route answers ``POST {route}`` with the model's own
            payloads) or ``"openai"``: a causal LM answers OpenAI's API under the route
            (``/completions``, ``/chat/completions``, ``/models``; docs/llm-serving.md).
        api_keys: Keys every request to the route must carry as ``Authorization: Bearer
            <key>`` (else a 401): a list, or the name of an environment variable (keys
            separated by commas) or of a file (one per line) holding them. Only their
            sha256 digests are kept, from here on: no log, setting or ``/info`` shows a key.
    """

    num_replicas: Any = 1
    min_replicas: int = 1
    max_replicas: int = 4
    target_ongoing_requests: float | None = None
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    look_back_period_s: float = 30.0
    max_batch_size: int = 16
    batch_wait_timeout_s: float = 0.005
    max_ongoing_requests: int = 64
    ray_actor_options: dict[str, Any] | None = None
    host: str = "127.0.0.1"
    port: int = dataclasses.field(default_factory=default_port)
    name: str | None = None
    max_body_bytes: int = 1 << 20
    registry_poll_s: float = 2.0
    access_log: bool = False
    max_models_per_replica: int = 3
    api: str = "raymodel"
    api_keys: Any = None

    def _validate(self) -> list[str]:
        problems = collect(
            check_int("min_replicas", self.min_replicas, minimum=0),
            check_int("max_replicas", self.max_replicas, minimum=1),
            check_number(
                "target_ongoing_requests", self.target_ongoing_requests, minimum=0, exclusive_min=True, allow_none=True
            ),
            check_number("upscale_delay_s", self.upscale_delay_s, minimum=0),
            check_number("downscale_delay_s", self.downscale_delay_s, minimum=0),
            check_number("look_back_period_s", self.look_back_period_s, minimum=0, exclusive_min=True),
            check_int("max_batch_size", self.max_batch_size, minimum=1),
            check_number("batch_wait_timeout_s", self.batch_wait_timeout_s, minimum=0),
            check_int("max_ongoing_requests", self.max_ongoing_requests, minimum=1),
            check_type("host", self.host, (str,), "a host name or IP address"),
            check_int("port", self.port, minimum=1, maximum=65535),
            check_name("name", self.name),
            check_int("max_body_bytes", self.max_body_bytes, minimum=1),
            check_number("registry_poll_s", self.registry_poll_s, minimum=0.05),
            check_type("access_log", self.access_log, (bool,), "True or False"),
            check_int("max_models_per_replica", self.max_models_per_replica, minimum=1),
            check_choice("api", self.api, ("raymodel", "openai")),
            *check_actor_options("ray_actor_options", self.ray_actor_options),
        )
        keys, problem = digests(self.api_keys)
        if problem:
            problems.append(problem)
        object.__setattr__(self, "api_keys", keys)  # the digests only, from here on
        replicas = None if self.num_replicas == "auto" else check_int("num_replicas", self.num_replicas, minimum=1)
        if replicas:
            problems.append(replicas.replace(" (got", " or 'auto' (got"))
        if (
            isinstance(self.min_replicas, int)
            and isinstance(self.max_replicas, int)
            and self.min_replicas > self.max_replicas
        ):
            problems.append(f"`min_replicas` ({self.min_replicas}) must be <= `max_replicas` ({self.max_replicas}).")
        return problems


#: Settings of where a route is reached and what it is called, not of its replicas.
ADDRESS_FIELDS = ("host", "port", "name")


def replica_settings(s: ServeSettings) -> dict[str, Any]:
    """``s`` less ``ADDRESS_FIELDS``: what a route's replicas are made of (a deployment's version)."""
    return {field.name: getattr(s, field.name) for field in dataclasses.fields(s) if field.name not in ADDRESS_FIELDS}


def replica_options(s: ServeSettings) -> dict[str, Any]:
    """The Serve deployment options of a route's model replicas: how many (or autoscaling), their
    resources, concurrency and access log."""
    options: dict[str, Any] = {
        "max_ongoing_requests": s.max_ongoing_requests,
        "ray_actor_options": s.ray_actor_options or {},
        "logging_config": {"enable_access_log": s.access_log},
    }
    if s.num_replicas == "auto":
        options["autoscaling_config"] = {
            "min_replicas": s.min_replicas,
            "max_replicas": s.max_replicas,
            "target_ongoing_requests": s.target_ongoing_requests or max(2, s.max_batch_size),
            "upscale_delay_s": s.upscale_delay_s,
            "downscale_delay_s": s.downscale_delay_s,
            "look_back_period_s": s.look_back_period_s,
        }
    else:
        options["num_replicas"] = s.num_replicas
    return options


def replica_needs(s: ServeSettings) -> dict[str, float]:
    """What a route's replicas take as it starts (``num_replicas`` of them, or autoscaling's
    ``min_replicas``): idle pools that leave room for it keep running (Serve's default replica
    takes 1 CPU)."""
    options = s.ray_actor_options or {}
    replicas = s.min_replicas if s.num_replicas == "auto" else s.num_replicas
    cpus = options.get("num_cpus")
    each = {"CPU": 1.0 if cpus is None else float(cpus), "GPU": float(options.get("num_gpus") or 0.0)}
    each.update({name: float(amount) for name, amount in (options.get("resources") or {}).items()})
    return {name: amount * replicas for name, amount in each.items() if amount * replicas}
