"""Serving with Ray Serve: ``model.serve(route)``.

``POST <route>`` with a JSON body answers ``postprocess(forward(preprocess(body)))``;
requests are batched adaptively. ``GET <route>/health`` and ``GET <route>/info``
describe the deployment, and ``GET <route>/openapi.json`` publishes the model's
``input_schema`` / ``output_schema`` as OpenAPI 3.1. Errors are JSON
``{"error": ..., "detail": ...}``: 400 (not JSON), 405 (wrong method), 413 (body
too large), 422 (the body does not match ``input_schema``: ``errors`` lists each
field's JSON path and message; or ``preprocess`` raised
``ValueError``/``TypeError``/``KeyError``), 500 (model failure, or an output
that does not match ``output_schema``, with a ``request_id``; the replica keeps
serving).
"""

from raymodel.serve._config import config, config_yaml, route_application
from raymodel.serve._driver import Servable, ServedModel, rollout, rollouts
from raymodel.serve._rollouts.controller import served_spec
from raymodel.serve._rollouts.rollout import Guard, Rollout, check_steps
from raymodel.serve._routes.restore import restore
from raymodel.serve._settings import ServeSettings

__all__ = [
    "Guard",
    "Rollout",
    "Servable",
    "ServeSettings",
    "ServedModel",
    "check_steps",
    "config",
    "config_yaml",
    "rollout",
    "rollouts",
    "served_spec",
    "restore",
    "route_application",
]
