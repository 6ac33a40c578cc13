"""Serving with Ray Serve: ``model.serve(route)``.

``POST <route>`` with a JSON body answers ``postprocess(forward(preprocess(body)))``;
requests are batched adaptively. ``GET <route>/health`` and ``GET <route>/info``
describe the deployment. Errors are JSON ``{"error": ..., "detail": ...}``:
400 (not JSON), 405 (wrong method), 413 (body too large), 422 (``preprocess``
raised ``ValueError``/``TypeError``/``KeyError``), 500 (model failure, with a
``request_id``; the replica keeps serving).
"""

from raymodel.serve._driver import Servable, ServedModel
from raymodel.serve._settings import ServeSettings

__all__ = ["Servable", "ServeSettings", "ServedModel"]
