"""The HTTP API's routes: translate a request, call a handler or a query, answer.

Writes go through services.submitter.handlers, reads through
services.reports.queries (the CLI calls the same), so the two cannot disagree. The
ports come from ``Ports``, put in place by app.py's lifespan.

Relative task paths in a manifest posted over HTTP resolve against
``TRIALBUS_TASKS_ROOT`` (default: the service's working folder), and must stay inside
it when it is set.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from services.common.errors import (
    ExperimentNotFound,
    LedgerUnavailable,
    ManifestError,
    UserInputError,
)
from services.common.ports import Coordinator, EventBus, Ledger
from services.common.settings import SubmitterSettings
from services.reports import queries
from services.reports.html import render_html
from services.submitter import handlers
from services.submitter.manifest_io import parse_manifest, parse_manifest_text
from services.submitter.submit import prepare


@dataclass(frozen=True, slots=True)
class Ports:
    """What the routes work with (app.state.ports)."""

    bus: EventBus
    ledger: Ledger
    coordinator: Coordinator


def _ports(request: Request) -> Ports:
    ports: Ports = request.app.state.ports
    return ports


PortsDep = Annotated[Ports, Depends(_ports)]


ErrorHandler = Callable[[Request, Any], Coroutine[Any, Any, Response]]


def _answer(status: int, key: str) -> ErrorHandler:
    """An exception handler answering ``{key: message}`` with ``status``."""

    async def handler(_request: Request, exc: Exception) -> Response:
        return JSONResponse({key: str(exc)}, status_code=status)

    return handler


ERROR_HANDLERS: dict[int | type[Exception], ErrorHandler] = {
    UserInputError: _answer(422, "error"),
    ExperimentNotFound: _answer(404, "detail"),
    LedgerUnavailable: _answer(503, "error"),
}
"""Exceptions to answers: bad input 422, unknown experiment 404, ledger down 503."""


def build_router(settings: SubmitterSettings) -> APIRouter:
    """The routes; every one but /healthz needs the bearer token when one is set."""

    def authorize(authorization: Annotated[str | None, Header()] = None) -> None:
        if settings.api_token is None:
            return
        expected = f"Bearer {settings.api_token}"
        if authorization is None or not hmac.compare_digest(authorization, expected):
            raise HTTPException(
                401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"}
            )

    open_router = APIRouter()
    router = APIRouter(dependencies=[Depends(authorize)])

    @open_router.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.post("/experiments", status_code=202)
    async def submit(
        request: Request, ports: PortsDep, manifest: Annotated[Any, Body()] = None
    ) -> dict[str, Any]:
        """Submit a manifest as JSON, or as YAML text (Content-Type: application/yaml)."""
        if request.headers.get("content-type", "").startswith(("application/yaml", "text/")):
            parsed = parse_manifest_text(
                (await request.body()).decode(errors="replace"), "request body"
            )
        elif manifest is None:
            raise ManifestError("request body: expected a manifest (JSON object or YAML text)")
        else:
            parsed = parse_manifest(manifest, "request body")
        prepared = prepare(parsed, settings.tasks_root or Path.cwd(), settings.tasks_root)
        result = await handlers.submit(prepared, ports.bus, ports.ledger, ports.coordinator)
        return result.as_dict()

    @router.get("/experiments/{experiment_id}/status")
    async def status(experiment_id: str, ports: PortsDep) -> dict[str, int]:
        """Counts by state (as `trialbus status --json`)."""
        return await queries.experiment_status(ports.ledger, experiment_id)

    @router.get("/experiments/{experiment_id}/leaderboard")
    async def board(experiment_id: str, ports: PortsDep) -> list[dict[str, Any]]:
        """The leaderboard rows (as `trialbus leaderboard --json`)."""
        _, rows = await queries.experiment_leaderboard(ports.ledger, experiment_id)
        return rows

    @router.get("/experiments/{experiment_id}/report")
    async def report(experiment_id: str, ports: PortsDep) -> dict[str, Any]:
        """The full report (as `trialbus report --json`)."""
        return await queries.experiment_report(ports.ledger, experiment_id)

    @router.get("/experiments/{experiment_id}/report.html")
    async def report_html(experiment_id: str, ports: PortsDep) -> HTMLResponse:
        """The report as a self-contained HTML page (as `trialbus report --html`)."""
        return HTMLResponse(
            render_html(await queries.experiment_report(ports.ledger, experiment_id))
        )

    @router.get("/compare")
    async def compare(
        ports: PortsDep,
        a: str,
        b: str | None = None,
        agent_a: str | None = None,
        agent_b: str | None = None,
    ) -> dict[str, Any]:
        """Paired comparison (as `trialbus compare A [B] --a AGENT --b AGENT --json`)."""
        return await queries.comparison(ports.ledger, a, b, agent_a, agent_b)

    open_router.include_router(router)
    return open_router
