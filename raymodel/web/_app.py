"""The dashboard's web application (Starlette): the page, its static files and the JSON API.

Read-only, except ``POST /api/jobs/<id>/stop``, which needs the token the
dashboard printed at start (header ``X-Raymodel-Token``, or ``?token=``);
without it the answer is 401.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, Callable

STATIC = Path(__file__).parent / "static"


def create_app(token: str) -> Any:
    """The Starlette application; ``token`` guards the one action (stopping a job)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import FileResponse, JSONResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    from raymodel.web import _api

    def answer(fn: Callable[[], Any]) -> Any:
        try:
            return JSONResponse(fn())
        except Exception as exc:  # noqa: BLE001 - the page shows the error, the server keeps going
            return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, status_code=500)

    def index(request: Request) -> Any:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    def one_job(request: Request) -> Any:
        record = _api.job(request.path_params["job_id"])
        if record is None:
            return JSONResponse({"error": f"No job `{request.path_params['job_id']}`."}, status_code=404)
        return JSONResponse(record)

    def stop(request: Request) -> Any:
        given = request.headers.get("x-raymodel-token") or request.query_params.get("token") or ""
        if not secrets.compare_digest(given.encode(), token.encode()):
            return JSONResponse(
                {"error": "Stopping a job needs the dashboard's token: open the URL it printed at start (…/?token=…)."},
                status_code=401,
            )
        from raymodel import jobs

        job_id = request.path_params["job_id"]
        try:
            job = jobs.get(job_id)
        except jobs.JobNotFound as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        job.stop()
        return JSONResponse({"id": job_id, "status": job.status, "stopping": True})

    routes = [
        Route("/", index),
        Route("/api/jobs", lambda r: answer(_api.jobs)),
        Route("/api/jobs/{job_id}", one_job),
        Route("/api/jobs/{job_id}/stop", stop, methods=["POST"]),
        Route("/api/models", lambda r: answer(_api.models)),
        Route("/api/routes", lambda r: answer(_api.routes)),
        Route("/api/resources", lambda r: answer(_api.resources)),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes)
