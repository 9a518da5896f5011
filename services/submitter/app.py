"""Composition root of the submitter's HTTP API (FastAPI): build the app, and in its
lifespan open the connections (connections.py) the routes (routes.py) work with.

Nothing connects at import or in ``create_app``; it reads the access settings
(http_security.api_access: the tokens file, or no-auth on loopback) and refuses to
build an app on unsafe ones. ``main`` runs it under uvicorn.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from functools import partial

import uvicorn
from fastapi import FastAPI, Response

from services.common.errors import EXIT_USER_ERROR
from services.common.logging import configure_logging, get_logger
from services.common.metrics import HttpMetrics
from services.common.quotas import QuotaConfigError, load_quotas
from services.common.settings import SubmitterSettings
from services.reports.report_cache import ReportCache
from services.submitter.api_tokens import ApiConfigError
from services.submitter.connections import open_ledger, open_nats
from services.submitter.dashboard import build_dashboard
from services.submitter.datasets import AllowedRegistries
from services.submitter.http_security import api_access, secure
from services.submitter.routes import ERROR_HANDLERS, Ports, build_router

log = get_logger(__name__)


def create_app(settings: SubmitterSettings) -> FastAPI:
    """Build the HTTP app; connections open in its lifespan, not at import.

    Raises ApiConfigError when the access settings are unsafe or unreadable (no
    tokens file, no-auth off loopback, a tokens file others can read) or a dataset
    registry setting is not one, and
    QuotaConfigError when the quotas file is (naming the file and the field).
    """
    access = api_access(settings)
    quotas = load_quotas(settings.quotas_file) if settings.quotas_file is not None else None
    if settings.api_dataset_registries is not None:
        try:
            AllowedRegistries.parse(settings.api_dataset_registries)
        except ValueError as exc:
            raise ApiConfigError(f"TRIALBUS_API_DATASET_REGISTRIES: {exc}") from None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        configure_logging(settings.log_level, settings.log_json)
        # A service waits for NATS however long it takes (timeout_s=None).
        async with (
            open_nats(settings, "trialbus-submitter", timeout_s=None) as nats,
            open_ledger(settings) as ledger,
        ):
            coordinator = await nats.coordinator()
            if quotas is not None:  # runners enforce the file's limits from now on
                await coordinator.set_team_limits(quotas)
            cache = ReportCache(settings.report_cache_mib * 2**20)
            app.state.ports = await nats.ports_for(ledger, quotas, partial(Ports, reports=cache))
            app.state.nats = nats  # the dashboard's live feeds subscribe on it
            log.info("submitter ready", port=settings.http_port)
            yield

    app = FastAPI(
        title="trialbus",
        version="0.1.0",
        lifespan=lifespan,
        exception_handlers=ERROR_HANDLERS,
    )
    app.include_router(build_router(settings))
    app.include_router(build_dashboard(settings))
    http_metrics = HttpMetrics()

    # Prometheus text, not part of the JSON API (so not in docs/openapi.json); behind
    # the same token as every route: one port, one credential for a scraper.
    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        body, content_type = http_metrics.page()
        return Response(body, media_type=content_type)

    secure(app, access)
    app.add_middleware(http_metrics.middleware)  # outermost: refused requests count too
    return app


def main() -> None:
    """Run the HTTP API (``python -m services.submitter``, ``trialbus service submitter``)."""
    settings = SubmitterSettings()
    configure_logging(settings.log_level, settings.log_json)
    try:
        app = create_app(settings)
    except (ApiConfigError, QuotaConfigError) as exc:
        print(f"trialbus submitter: {exc}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    uvicorn.run(app, host=settings.http_host, port=settings.http_port, log_level="warning")
