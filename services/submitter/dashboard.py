"""The web dashboard (``/ui/``): server-rendered pages over the one read path.

Pages: the experiments list (``/ui/``, filter ``?q=``), an experiment (leaderboard,
failure causes, pass@k, matrix, cost, trials, live progress), a trial (its record and
live log), the comparison of two sides (``/ui/compare``, ``queries.comparison``) and
the runner fleet (``/ui/runners``, ``follow.fleet`` as ``GET /runners``), the
queue (``/ui/queue``, ``follow.read_queue`` as ``GET /queue``);
two Server-Sent Events streams feed the live parts (dashboard_stream.py). Numbers
come from services.reports.queries, as the CLI's and the JSON API's do.

Security (docs/security.md, "Dashboard"): every page is a GET behind http_security's
guard (the login form excepted); a browser authenticates with the session cookie the
login form sets; templates autoescape every value; every answer carries a strict
Content-Security-Policy (scripts and styles from this origin only, no inline script),
``X-Frame-Options: DENY`` and no-store caching.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from pydantic import BaseModel

from schemas.record import TrialRecord
from services.common.errors import ExperimentNotFound, UserInputError
from services.common.settings import SubmitterSettings
from services.reports import queries
from services.submitter import dashboard_views as views
from services.submitter.dashboard_artifacts import (
    ListingCache,
    archive_listing,
    build_artifact_routes,
)
from services.submitter.dashboard_compare import comparison_view
from services.submitter.dashboard_live_pages import (
    build_live_page_routes,
    queue_context,
    runners_context,
)
from services.submitter.dashboard_stream import (
    PageSources,
    experiment_stream,
    log_stream,
    page_row,
    page_view,
    view_sections,
)
from services.submitter.dashboard_trial import timeline
from services.submitter.dashboard_views import experiment_url, trial_url
from services.submitter.follow import lookups_of
from services.submitter.http_security import SESSION_COOKIE, ApiAccess, identify_token
from services.submitter.live_feeds import LiveFeeds, valid_experiment_id, valid_trial_id
from services.submitter.routes import Ports

STATIC = Path(__file__).parent / "static"
STATIC_TYPES = {
    "dashboard.css": "text/css",
    "dashboard.js": "text/javascript",
    "favicon.svg": "image/svg+xml",
}
"""The only static files served (a fixed list: no path from a request reaches the disk)."""
SESSION_MAX_AGE_S = 12 * 3600
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # Not no-referrer: with it Chrome sends "Origin: null" on the login form's POST,
    # which the guard refuses as cross-origin.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
"""Sent with every dashboard answer."""


def render(template: str, request: Request, status: int = 200, **context: Any) -> HTMLResponse:
    """A page from ``template``, with the security headers."""
    identity = getattr(request.state, "identity", None)
    context.setdefault("data", {})
    context.setdefault("title", "trialbus")
    html = views.PAGES.get_template(template).render(
        identity=identity.label if identity is not None else None, **context
    )
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def _not_found(request: Request, what: str) -> HTMLResponse:
    return render("message.html", request, 404, title="Not found", message=what)


def record_sections(record: TrialRecord) -> list[dict[str, Any]]:
    """The trial page's tables: each part of the record as (field, text) pairs."""

    def items(model: BaseModel) -> list[tuple[str, str]]:
        out = []
        for key, value in model.model_dump(mode="json").items():
            if value is None or value == {} or value == []:
                continue
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            out.append((key, text))
        return out

    summary = [
        ("experiment", record.experiment_id),
        ("status", record.status),
        ("repetition", str(record.repetition)),
        ("attempts", str(record.attempts)),
    ]
    return [
        {"title": "Summary", "fields": summary},
        {"title": "Evaluation", "fields": items(record.evaluation)},
        {"title": "Errors", "fields": [(str(i + 1), e) for i, e in enumerate(record.errors)]},
        {"title": "Timing", "fields": items(record.timing)},
        {"title": "Usage", "fields": items(record.usage)},
        {"title": "Provenance", "fields": items(record.provenance)},
        {"title": "Artifacts", "fields": items(record.artifacts)},
    ]


def build_dashboard(settings: SubmitterSettings) -> APIRouter:
    """The dashboard's routes, under ``/ui``; the queue page judges spend caps by the
    ports' team quotas (``Ports.quotas``)."""
    router = APIRouter(prefix="/ui", include_in_schema=False)
    topology = settings.topology
    listings = ListingCache()  # the trial pages' archive listings, by digest

    def ports(request: Request) -> Ports:
        found: Ports = request.app.state.ports
        return found

    def feeds(request: Request) -> LiveFeeds:
        return LiveFeeds(request.app.state.nats.nc, topology)

    @router.get("/login")
    async def login_page(request: Request) -> Response:
        return render("login.html", request, title="Log in", error=None)

    @router.post("/login")
    async def login(request: Request) -> Response:
        access: ApiAccess = request.app.state.api_access
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        token = (form.get("token") or [""])[0]
        if identify_token(access, token) is None:
            return render("login.html", request, 401, title="Log in", error="Unknown token.")
        answer = RedirectResponse("/ui/", status_code=303, headers=SECURITY_HEADERS)
        answer.set_cookie(
            SESSION_COOKIE,
            token.strip(),
            max_age=SESSION_MAX_AGE_S,
            path="/ui",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return answer

    @router.get("/logout")
    async def logout() -> Response:
        answer = RedirectResponse("/ui/login", status_code=303, headers=SECURITY_HEADERS)
        answer.delete_cookie(SESSION_COOKIE, path="/ui", httponly=True, samesite="strict")
        return answer

    @router.get("/static/{name}")
    async def static(name: str) -> Response:
        if name not in STATIC_TYPES:
            return Response("not found", 404, headers=SECURITY_HEADERS)
        body = await asyncio.to_thread((STATIC / name).read_bytes)
        return Response(body, media_type=STATIC_TYPES[name], headers=SECURITY_HEADERS)

    @router.get("/")
    async def experiments(request: Request, q: str = "") -> Response:
        found = ports(request)
        lookups = lookups_of(found.coordinator, live=feeds(request))
        rows = [
            {
                **_row_dict(row),
                "url": experiment_url(row.experiment_id),
                "priority_class": row.class_shown(settings.classes.default),
            }
            for row in await queries.experiment_rows(found.ledger, lookups, cache=found.reports)
            if row.matches(q)
        ]
        return render("experiments.html", request, title="Experiments", rows=rows, q=q)

    @router.get("/experiments/{experiment_id}")
    async def experiment(request: Request, experiment_id: str, page: int = 1) -> Response:
        ledger, live = ports(request).ledger, feeds(request)
        if not valid_experiment_id(experiment_id):
            return _not_found(request, f"{experiment_id!r} is not an experiment id.")
        try:
            view = await page_view(ledger, experiment_id, ports(request).reports)
        except ExperimentNotFound as exc:
            return _not_found(request, str(exc))
        started = await live.started_trials(experiment_id)
        paused = await ports(request).coordinator.is_paused(experiment_id)
        row = page_row(experiment_id, view, started, paused=paused)
        parts = view_sections(experiment_id, view, started, page)
        # The live feed sends the trial table's page shown here, not the whole table.
        number = parts.context["pager"]["number"]
        return render(
            "experiment.html",
            request,
            title=row.name,
            data={"events-url": f"{experiment_url(experiment_id)}/events?page={number}"},
            name=row.name,
            submitted_by=row.submitted_by,
            started=row.started,
            duration=row.duration_s,
            progress=row.progress,
            report_url=f"/experiments/{quote(experiment_id, safe='')}/report.html",
            trials_url=f"/experiments/{quote(experiment_id, safe='')}/trials",
            **parts.context,
        )

    @router.get("/experiments/{experiment_id}/events")
    async def experiment_events(request: Request, experiment_id: str, page: int = 1) -> Response:
        if not valid_experiment_id(experiment_id):
            return _not_found(request, f"{experiment_id!r} is not an experiment id.")
        found = ports(request)
        sources = PageSources(
            found.ledger, feeds(request), lookups_of(found.coordinator), found.reports
        )
        stream = experiment_stream(sources, experiment_id, page)
        return _sse(stream)

    @router.get("/compare")
    async def compare(
        request: Request,
        a: str = "",
        b: str = "",
        agent_a: str = "",
        agent_b: str = "",
    ) -> Response:
        # The JSON API's /compare parameters; an empty form field means "not given".
        form = {"a": a, "b": b, "agent_a": agent_a, "agent_b": agent_b}
        context: dict[str, Any] = {"form": form, "cmp": None, "error": None, "back_url": None}
        if a and valid_experiment_id(a):
            context["back_url"] = experiment_url(a)
        if not a:
            return render("compare.html", request, title="Compare", **context)
        status = 200
        try:
            data = await queries.comparison(
                ports(request).ledger, a, b or None, agent_a or None, agent_b or None
            )
            context["cmp"] = comparison_view(data)
        except ExperimentNotFound as exc:
            status, context["error"] = 404, str(exc)
        except UserInputError as exc:
            status, context["error"] = 422, str(exc)  # as the JSON API answers it
        return render("compare.html", request, status, title="Compare", **context)

    @router.get("/runners")
    async def runners(request: Request) -> Response:
        view = await runners_context(request.app)
        data = {"live-url": "/ui/runners/events"}
        return render("runners.html", request, title="Runners", data=data, **view)

    @router.get("/queue")
    async def queue(request: Request) -> Response:
        view = await queue_context(request.app)
        data = {"live-url": "/ui/queue/events"}
        return render("queue.html", request, title="Queue", data=data, **view)

    @router.get("/trials/{trial_id}")
    async def trial(request: Request, trial_id: str) -> Response:
        if not valid_trial_id(trial_id):
            return _not_found(request, f"{trial_id!r} is not a trial id.")
        record = await queries.trial_record(ports(request).ledger, trial_id)
        exp_id = record.experiment_id if record else None
        return render(
            "trial.html",
            request,
            title=trial_id,
            data={"log-url": f"{trial_url(trial_id)}/log"},
            trial_id=trial_id,
            experiment_id=exp_id,
            experiment_url=experiment_url(exp_id) if exp_id else None,
            sections=record_sections(record) if record else [],
            timeline=timeline(record.timing) if record else None,
            stored=await archive_listing(request, record, listings) if record else None,
        )

    @router.get("/trials/{trial_id}/log")
    async def trial_log(request: Request, trial_id: str) -> Response:
        if not valid_trial_id(trial_id):
            return _not_found(request, f"{trial_id!r} is not a trial id.")
        return _sse(log_stream(feeds(request), trial_id))

    router.include_router(build_artifact_routes(render, SECURITY_HEADERS))
    router.include_router(build_live_page_routes(_sse))
    return router


def _row_dict(row: views.ExperimentRow) -> dict[str, Any]:
    return {
        "experiment_id": row.experiment_id,
        "name": row.name,
        "submitted_by": row.submitted_by,
        "team": row.team,
        "progress": row.progress,
        "started": row.started,
        "duration_s": row.duration_s,
    }


def _sse(stream: AsyncIterator[str]) -> StreamingResponse:
    # X-Accel-Buffering: a proxy in front must pass events on as they come.
    headers = {**SECURITY_HEADERS, "X-Accel-Buffering": "no"}
    return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
