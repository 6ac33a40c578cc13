"""The dashboard's web application (Starlette): the page, its static files and the JSON API.

Read-only, except ``POST /api/jobs/<id>/stop`` and ``POST /api/jobs/<id>/update``
(``{"config": {...}, "settings": {...}}``), which need the token the dashboard
printed at start (header ``X-Raymodel-Token``, or ``?token=``); without it the
answer is 401.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, Callable

STATIC = Path(__file__).parent / "static"


def create_app(token: str) -> Any:
    """The Starlette application; ``token`` guards the actions (stopping or changing a job)."""
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

    def refused(request: Request) -> Any:
        given = request.headers.get("x-raymodel-token") or request.query_params.get("token") or ""
        if secrets.compare_digest(given.encode(), token.encode()):
            return None
        return JSONResponse(
            {"error": "Changing a job needs the dashboard's token: open the URL it printed at start (…/?token=…)."},
            status_code=401,
        )

    def the_job(request: Request) -> Any:
        from raymodel import jobs

        try:
            return jobs.get(request.path_params["job_id"])
        except jobs.JobNotFound as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)

    def stop(request: Request) -> Any:
        job = refused(request) or the_job(request)
        if isinstance(job, JSONResponse):
            return job
        job.stop()
        return JSONResponse({"id": job.id, "status": job.status, "stopping": True})

    async def update(request: Request) -> Any:
        from raymodel.exceptions import SettingsError

        job = refused(request) or the_job(request)
        if isinstance(job, JSONResponse):
            return job
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return JSONResponse({"error": 'Send JSON: {"config": {...}, "settings": {...}}.'}, status_code=400)
        try:
            change = job.update(config=body.get("config"), settings=body.get("settings"))
        except SettingsError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse({"id": job.id, "change": change})

    routes = [
        Route("/", index),
        Route("/api/jobs", lambda r: answer(_api.jobs)),
        Route("/api/jobs/{job_id}", one_job),
        Route("/api/jobs/{job_id}/stop", stop, methods=["POST"]),
        Route("/api/jobs/{job_id}/update", update, methods=["POST"]),
        Route("/api/models", lambda r: answer(_api.models)),
        Route("/api/routes", lambda r: answer(_api.routes)),
        Route("/api/rollouts", lambda r: answer(_api.rollouts)),
        Route("/api/resources", lambda r: answer(_api.resources)),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes)
