"""The submitter service: an HTTP API (FastAPI) to submit manifests and read reports.

Relative task paths in a manifest posted over HTTP resolve against
``TRIALBUS_TASKS_ROOT`` (default: the service's working folder), and must stay inside
it when it is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import uvicorn
from fastapi import Body, Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse
from nats.aio.client import Client as NatsClient

from services.common.adapters.jetstream import JetStreamBus, connect, ensure_streams
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.errors import LedgerUnavailable, ManifestError, UserInputError
from services.common.logging import configure_logging, get_logger
from services.common.ports import Ledger
from services.common.settings import SubmitterSettings
from services.reports.html import render_html
from services.reports.leaderboard import leaderboard, status_counts
from services.reports.queries import comparison
from services.reports.report import build_report
from services.submitter.manifest_io import parse_manifest, parse_manifest_text
from services.submitter.submit import prepare, publish_experiment

log = get_logger(__name__)


def create_app(settings: SubmitterSettings) -> FastAPI:
    """Build the HTTP app; connections open in its lifespan, not at import."""
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        configure_logging(settings.log_level, settings.log_json)
        nc: NatsClient = await connect(settings.nats_servers, "trialbus-submitter")
        js = nc.jetstream()
        await ensure_streams(js, settings.topology, settings.stream_replicas)
        ledger = MongoLedger(settings.ledger_url, settings.ledger_db)
        coordinator = await NatsCoordinator.open(
            js, settings.topology, lease_ttl_s=60, replicas=settings.stream_replicas
        )
        state.update(
            nc=nc, bus=JetStreamBus(js, settings.topology), ledger=ledger, coord=coordinator
        )
        log.info("submitter ready", port=settings.http_port)
        try:
            yield
        finally:
            await ledger.close()
            await nc.drain()

    app = FastAPI(title="trialbus", version="0.1.0", lifespan=lifespan)

    def authorize(authorization: Annotated[str | None, Header()] = None) -> None:
        if settings.api_token is None:
            return
        expected = f"Bearer {settings.api_token}"
        if authorization is None or not hmac.compare_digest(authorization, expected):
            raise HTTPException(
                401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"}
            )

    def ledger() -> Ledger:
        the_ledger: Ledger = state["ledger"]
        return the_ledger

    @app.exception_handler(UserInputError)
    async def user_error(_r: Request, exc: UserInputError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=422)

    @app.exception_handler(LedgerUnavailable)
    async def unavailable(_r: Request, exc: LedgerUnavailable) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=503)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/experiments", status_code=202, dependencies=[Depends(authorize)])
    async def submit(request: Request, manifest: Annotated[Any, Body()] = None) -> dict[str, Any]:
        """Submit a manifest as JSON, or as YAML text (Content-Type: application/yaml)."""
        if request.headers.get("content-type", "").startswith(("application/yaml", "text/")):
            parsed = parse_manifest_text(
                (await request.body()).decode(errors="replace"), "request body"
            )
        elif manifest is None:
            raise ManifestError("request body: expected a manifest (JSON object or YAML text)")
        else:
            parsed = parse_manifest(manifest, "request body")
        base = settings.tasks_root or Path.cwd()
        prepared = prepare(parsed, base, settings.tasks_root)
        await state["coord"].uncancel(prepared.experiment_id)
        result = await publish_experiment(prepared, state["bus"], ledger())
        return result.as_dict()

    @app.get("/experiments/{experiment_id}/status", dependencies=[Depends(authorize)])
    async def status(experiment_id: str) -> dict[str, int]:
        info = await ledger().get_experiment(experiment_id)
        records = await ledger().records_for(experiment_id)
        if info is None and not records:
            raise HTTPException(404, f"no experiment {experiment_id!r}")
        return status_counts(records, info)

    @app.get("/experiments/{experiment_id}/leaderboard", dependencies=[Depends(authorize)])
    async def board(experiment_id: str) -> list[dict[str, Any]]:
        info = await ledger().get_experiment(experiment_id)
        records = await ledger().records_for(experiment_id)
        if info is None and not records:
            raise HTTPException(404, f"no experiment {experiment_id!r}")
        # Bootstrap intervals cost CPU time: keep the event loop free meanwhile.
        rows = await asyncio.to_thread(leaderboard, records, info)
        return [r.as_dict() for r in rows]

    async def _report(experiment_id: str) -> dict[str, Any]:
        info = await ledger().get_experiment(experiment_id)
        records = await ledger().records_for(experiment_id)
        if info is None and not records:
            raise HTTPException(404, f"no experiment {experiment_id!r}")
        return await asyncio.to_thread(build_report, experiment_id, records, info)

    @app.get("/experiments/{experiment_id}/report", dependencies=[Depends(authorize)])
    async def report(experiment_id: str) -> dict[str, Any]:
        """The full report (as `trialbus report --json`)."""
        return await _report(experiment_id)

    @app.get("/experiments/{experiment_id}/report.html", dependencies=[Depends(authorize)])
    async def report_html(experiment_id: str) -> HTMLResponse:
        """The report as a self-contained HTML page (as `trialbus report --html`)."""
        return HTMLResponse(render_html(await _report(experiment_id)))

    @app.get("/compare", dependencies=[Depends(authorize)])
    async def compare(
        a: str, b: str | None = None, agent_a: str | None = None, agent_b: str | None = None
    ) -> dict[str, Any]:
        """Paired comparison (as `trialbus compare A [B] --a AGENT --b AGENT --json`)."""
        return await comparison(ledger(), a, b, agent_a, agent_b)

    return app


def main() -> None:
    settings = SubmitterSettings()
    uvicorn.run(
        create_app(settings), host=settings.http_host, port=settings.http_port, log_level="warning"
    )
