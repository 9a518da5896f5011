"""The HTTP API's routes: translate a request, call a handler or a query, answer.

Longer than 350 lines because every HTTP route of the API is declared here, each a
few lines over the handlers (FastAPI reads the declarations for the OpenAPI document);
the decisions live in handlers.py, quota_gate.py, retry.py and trial_pause.py.

Writes go through services.submitter.handlers, reads through
services.reports.queries (the CLI calls the same), so the two cannot disagree. The
ports come from ``Ports``, put in place by app.py's lifespan. Every request reaching a
route passed http_security's guard: a known token (``request.state.identity``), a JSON
or YAML body within the size limit, already read.

Relative task paths in a manifest posted over HTTP resolve against
``TRIALBUS_TASKS_ROOT`` (default: the service's working folder), and must stay inside
it when it is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response

from schemas.manifest import ExperimentManifest
from services.common.errors import (
    ExperimentCancelled,
    ExperimentNotFound,
    InternalError,
    LedgerUnavailable,
    ManifestError,
    ObjectAccessDenied,
    UserInputError,
)
from services.common.logging import get_logger
from services.common.ports import ExperimentInfo
from services.common.quotas import QuotaExceeded
from services.common.settings import SubmitterSettings
from services.reports import queries
from services.reports.html import render_html
from services.reports.junit import experiment_junit
from services.reports.report_cache import ReportCache
from services.reports.trials import TrialFilter, experiment_trials, select
from services.submitter import handlers, trial_pause
from services.submitter.api_tokens import Identity, owner_from_record
from services.submitter.datasets import (
    AllowedRegistries,
    DatasetsBusy,
    FetchedDatasets,
    dataset_indexes,
    fetch_datasets_blocking,
)
from services.submitter.follow import fleet, lookups_of, read_queue
from services.submitter.handlers import SubmitterPorts
from services.submitter.http_security import MANIFEST_MEDIA_TYPES, media_type
from services.submitter.live_feeds import LiveFeeds
from services.submitter.manifest_io import (
    DuplicateKey,
    parse_manifest,
    parse_manifest_text,
    unique_keys,
)
from services.submitter.resolve import TaskFolders
from services.submitter.retry import retry_trial, retry_unscored
from services.submitter.submit import PreparedExperiment, prepare
from services.submitter.task_uploads import accept_task_upload

SOURCE = "request body"
log = get_logger(__name__)


class NotOwner(UserInputError):
    """The caller may not change an experiment another identity submitted (403)."""


class ClassNotAllowed(UserInputError):
    """The caller's token may not submit in the manifest's priority class (403)."""


class UnsupportedMediaType(UserInputError):
    """A body that is neither JSON nor YAML (415)."""


@dataclass(frozen=True, slots=True)
class Ports(SubmitterPorts):
    """What the routes work with (app.state.ports): the submitter's ports and quotas,
    and the report cache."""

    reports: ReportCache = dataclasses.field(default_factory=ReportCache)
    """Computed reports by content version, for the JSON routes and the dashboard."""


def _ports(request: Request) -> Ports:
    ports: Ports = request.app.state.ports
    return ports


def _identity(request: Request) -> Identity:
    identity = getattr(request.state, "identity", None)
    if not isinstance(identity, Identity):
        # The guard (http_security.secure) sets it on every path but /healthz.
        raise InternalError("request reached a route without an identity: is the guard on?")
    return identity


PortsDep = Annotated[Ports, Depends(_ports)]
IdentityDep = Annotated[Identity, Depends(_identity)]


ErrorHandler = Callable[[Request, Any], Coroutine[Any, Any, Response]]


def _answer(status: int, key: str) -> ErrorHandler:
    """An exception handler answering ``{key: message}`` with ``status``."""

    async def handler(_request: Request, exc: Exception) -> Response:
        return JSONResponse({key: str(exc)}, status_code=status)

    return handler


async def _bad_parameters(_request: Request, exc: RequestValidationError) -> Response:
    """A query or path parameter FastAPI could not read: 422 ``{"error": ...}`` naming
    each one, as every other bad input is answered (not FastAPI's own list)."""
    problems = []
    for error in exc.errors():
        where = " ".join(str(part) for part in error.get("loc", ()))
        got = f" (got {error['input']!r})" if error.get("input") is not None else ""
        problems.append(f"{where}: {error.get('msg', 'invalid')}{got}")
    return JSONResponse({"error": "; ".join(problems)}, status_code=422)


ERROR_HANDLERS: dict[int | type[Exception], ErrorHandler] = {
    RequestValidationError: _bad_parameters,
    UserInputError: _answer(422, "error"),
    NotOwner: _answer(403, "error"),
    ClassNotAllowed: _answer(403, "error"),
    QuotaExceeded: _answer(429, "error"),
    UnsupportedMediaType: _answer(415, "error"),
    ExperimentNotFound: _answer(404, "detail"),
    ExperimentCancelled: _answer(409, "error"),
    LedgerUnavailable: _answer(503, "error"),
    DatasetsBusy: _answer(503, "error"),
    ObjectAccessDenied: _answer(503, "error"),
}
"""Exceptions to answers: bad input 422, another's experiment or a priority class the
token may not use 403, a team's quota reached 429 (a limit that frees with time, as
HTTP's "too many requests"), a body neither JSON nor YAML 415, unknown experiment
404, a retry in a cancelled experiment 409 (its state, not the request, is in the
way), ledger down, another request's datasets being fetched, or a bucket the API's
NATS user may not read or write (its message names the right: the operator's to fix)
503."""


def decode_json(body: bytes) -> Any:
    """JSON bytes to data, or a ManifestError naming the body and where it broke."""
    try:
        return json.loads(body, object_pairs_hook=unique_keys)
    except DuplicateKey as exc:
        raise ManifestError(
            f"{SOURCE}: key {exc.key!r} is given twice in one object; JSON decoders keep "
            "only the last one, so write it once"
        ) from None
    except json.JSONDecodeError as exc:
        raise ManifestError(
            f"{SOURCE}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise ManifestError(f"{SOURCE}: not valid JSON: nested too deeply") from None
    except ValueError as exc:  # an integer beyond Python's digit limit, bad UTF-8
        raise ManifestError(f"{SOURCE}: not valid JSON: {str(exc).split(';')[0]}") from None


def prepare_body(body: bytes, content_type: str, settings: SubmitterSettings) -> PreparedExperiment:
    """Parse, validate, resolve and expand a posted manifest (blocking: run in a thread).

    YAML parsing is bounded by manifest_io's budgets (bytes, nodes, values, depth) and
    can still take seconds of CPU, so it never runs on the event loop.
    """
    declared = media_type(content_type)
    if declared in MANIFEST_MEDIA_TYPES - {"application/json"}:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ManifestError(f"{SOURCE}: not UTF-8 text: {exc.reason}") from None
        parsed = parse_manifest_text(text, SOURCE)
    elif not body.strip():
        raise ManifestError(f"{SOURCE}: expected a manifest (JSON object or YAML text)")
    elif declared == "application/json":
        parsed = parse_manifest(decode_json(body), SOURCE)
    else:
        raise UnsupportedMediaType(
            f"Content-Type {declared or '(none)'} is not accepted; send the manifest as "
            "application/json or application/yaml"
        )
    folders = posted_task_folders(settings)
    with client_paths(folders):
        datasets = posted_datasets(parsed, folders.base_dir, settings)
        return prepare(parsed, folders.base_dir, folders.tasks_root, datasets)


def posted_datasets(
    manifest: ExperimentManifest, base_dir: Path, settings: SubmitterSettings
) -> FetchedDatasets | None:
    """A posted manifest's datasets, fetched from the registries the operator allows
    (``TRIALBUS_API_DATASET_REGISTRIES``; services/submitter/datasets.py), or None when
    it allows none (``resolve_tasks`` then refuses a dataset entry). Blocking: called in
    the request's worker thread."""
    if settings.api_dataset_registries is None or not dataset_indexes(manifest):
        return None
    allowed = AllowedRegistries.parse(settings.api_dataset_registries)
    return fetch_datasets_blocking(manifest, base_dir, settings.dataset_cache, allowed)


TASKS_ROOT_NAME = "<tasks root>"
"""How an answer names the API's tasks root: the client wrote its task paths relative
to it, and where it lies on the API's host is not the client's to read."""


def as_client_sees(message: str, folders: TaskFolders) -> str:
    """``message`` with the tasks root's path on this host written as ``<tasks root>``
    (``task folder <tasks root>/tasks/nope does not exist``)."""
    root = folders.tasks_root or folders.base_dir
    for path in dict.fromkeys((str(root.resolve()), str(root))):
        if path != "/":  # a root of / is every path: nothing to leave out
            # The whole name only: /srv/tasks, not the start of /srv/tasks-old.
            message = re.sub(re.escape(path) + r"(?![\w.-])", TASKS_ROOT_NAME, message)
    return message


@contextlib.contextmanager
def client_paths(folders: TaskFolders) -> Iterator[None]:
    """Answer a UserInputError raised inside as the client sees it (``as_client_sees``):
    the same error, its message naming the tasks root ``<tasks root>``."""
    try:
        yield
    except UserInputError as exc:
        exc.args = (as_client_sees(str(exc), folders),)
        raise


def posted_task_folders(settings: SubmitterSettings) -> TaskFolders:
    """Where the task folders of a manifest posted over HTTP are, and what they must
    stay inside: ``TRIALBUS_TASKS_ROOT``, or the service's working folder when it is
    unset. Never anywhere: a token holder would name any task folder on this host
    (another team's private tasks, their solutions and tests)."""
    root = settings.tasks_root or Path.cwd()
    return TaskFolders(root, root)


def check_owner(
    info: ExperimentInfo | None, experiment_id: str, identity: Identity
) -> Identity | None:
    """The experiment's recorded owner; NotOwner unless ``identity`` may change it.

    The ledger knows an experiment once the importer recorded its ExperimentSubmitted;
    one it does not know (``info`` None) has no owner to protect yet.
    """
    if info is None:
        return None
    owner = owner_from_record(info.manifest.get("submitted_by"))
    if not identity.may_change(owner):
        who = f"was submitted by {owner.label}" if owner else "has no recorded owner"
        raise NotOwner(
            f"experiment {experiment_id!r} {who}; only its submitter or an admin token "
            "may resubmit, cancel, pause, resume or retry it (to run your own copy, give "
            "the manifest another name)"
        )
    return owner


def build_router(settings: SubmitterSettings) -> APIRouter:
    """The routes; http_security's guard authenticates every one but /healthz. The team
    quotas a submission is held to are the ports' (``Ports.quotas``; None: none)."""
    router = APIRouter()

    @router.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.post("/experiments", status_code=202)
    async def submit(
        request: Request,
        response: Response,
        ports: PortsDep,
        identity: IdentityDep,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Submit a manifest as JSON (application/json) or YAML (application/yaml).

        With ``dry_run=true``: every check a submission passes before it changes
        anything (the manifest, its task folders, the token's priority class and
        ownership, a live runner that can run it, the team's spend cap, the tasks given
        by checksum in the bucket), then 200 with what it would run; nothing is
        uploaded, published or changed."""
        body = await request.body()  # already read and bounded by the guard
        content_type = request.headers.get("content-type", "")
        prepared = await asyncio.to_thread(prepare_body, body, content_type, settings)
        chosen = handlers.check_priority_class(prepared, settings.classes)
        if not identity.may_use(chosen, settings.classes):
            raise ClassNotAllowed(
                f"compute.priority_class: {identity.label} may not submit in priority class "
                f"{chosen!r}; ask an operator for a token that allows it (priority_classes "
                "in the API tokens file), or use a lower class"
            )
        info = await ports.ledger.get_experiment(prepared.experiment_id)
        owner = check_owner(info, prepared.experiment_id, identity)
        # An admin resubmitting keeps the recorded owner; anyone else is the owner.
        by = (owner or identity).record() if identity.admin else identity.record()
        # The team whose quotas apply is the identity's, never the manifest's.
        team = by.get("team") if by else None
        prepared = dataclasses.replace(prepared, submitted_by=by, team=team)
        if dry_run:
            response.status_code = 200
            return await handlers.dry_run(prepared, ports)
        result = await handlers.submit(prepared, ports)
        log.info("experiment submitted", experiment_id=result.experiment_id, by=identity.label)
        return result.as_dict()

    @router.post("/tasks", status_code=201)
    async def upload_task(request: Request, name: str) -> dict[str, Any]:
        """Store an uploaded task folder (a gzipped tar); answer its name and checksum,
        which a manifest's task entry names: ``{name: ..., checksum: ...}``."""
        ref = await accept_task_upload(await request.body(), name, _ports(request).tasks)
        return {"name": ref.name, "checksum": ref.checksum}

    async def owned(experiment_id: str, ports: Ports, identity: Identity, what: str) -> None:
        """Refuse what neither the experiment's submitter nor an admin asks; log the rest."""
        info = await ports.ledger.get_experiment(experiment_id)
        if info is None and not identity.admin:
            raise ExperimentNotFound(
                f"no experiment {experiment_id!r} in the ledger (yet: a submission is "
                "recorded within seconds, by the importer); retry shortly"
            )
        check_owner(info, experiment_id, identity)
        log.info(f"experiment {what}", experiment_id=experiment_id, by=identity.label)

    @router.post("/experiments/{experiment_id}/cancel")
    async def cancel(experiment_id: str, ports: PortsDep, identity: IdentityDep) -> dict[str, Any]:
        """Cancel (as `trialbus cancel --json`): the submitter's identity or an admin."""
        await owned(experiment_id, ports, identity, "cancelled")
        return await handlers.cancel(ports.ledger, ports.coordinator, experiment_id)

    @router.post("/experiments/{experiment_id}/pause")
    async def pause(experiment_id: str, ports: PortsDep, identity: IdentityDep) -> dict[str, Any]:
        """Pause (as `trialbus pause --json`): queued trials wait, running ones finish."""
        await owned(experiment_id, ports, identity, "paused")
        return await handlers.pause(ports.ledger, ports.coordinator, experiment_id)

    @router.post("/experiments/{experiment_id}/resume")
    async def resume(experiment_id: str, ports: PortsDep, identity: IdentityDep) -> dict[str, Any]:
        """Resume (as `trialbus resume --json`): the queued trials start within seconds."""
        await owned(experiment_id, ports, identity, "resumed")
        return await handlers.resume(ports.ledger, ports.coordinator, experiment_id)

    @router.post("/experiments/{experiment_id}/trials/{trial_id}/pause")
    async def pause_one(
        experiment_id: str, trial_id: str, ports: PortsDep, identity: IdentityDep
    ) -> dict[str, Any]:
        """Pause one trial (as `trialbus pause EXP --trial T --json`): it waits unstarted
        until resumed; running, it finishes. Same owner rule as the experiment's pause."""
        await owned(experiment_id, ports, identity, "trial paused")
        return await trial_pause.pause_trial(
            ports.ledger, ports.coordinator, experiment_id, trial_id
        )

    @router.post("/experiments/{experiment_id}/trials/{trial_id}/resume")
    async def resume_one(
        experiment_id: str, trial_id: str, ports: PortsDep, identity: IdentityDep
    ) -> dict[str, Any]:
        """Resume one paused trial (as `trialbus resume EXP --trial T --json`)."""
        await owned(experiment_id, ports, identity, "trial resumed")
        return await trial_pause.resume_trial(
            ports.ledger, ports.coordinator, experiment_id, trial_id
        )

    @router.post("/experiments/{experiment_id}/trials/{trial_id}/retry", status_code=202)
    async def retry(
        experiment_id: str, trial_id: str, ports: PortsDep, identity: IdentityDep
    ) -> dict[str, Any]:
        """Run one finished trial again as a new run (as `trialbus retry --json`)."""
        await owned(experiment_id, ports, identity, "trial retried")
        folders = posted_task_folders(settings)
        with client_paths(folders):
            return await retry_trial(ports, experiment_id, trial_id, folders=folders)

    @router.post("/experiments/{experiment_id}/retry-unscored", status_code=202)
    async def retry_all_unscored(
        experiment_id: str, ports: PortsDep, identity: IdentityDep
    ) -> dict[str, Any]:
        """Run every unscored finished trial again, each as a new run (as `trialbus
        retry EXP --unscored --json`); 409 in a cancelled experiment."""
        await owned(experiment_id, ports, identity, "unscored trials retried")
        folders = posted_task_folders(settings)
        with client_paths(folders):
            return await retry_unscored(ports, experiment_id, folders=folders)

    @router.get("/experiments")
    async def experiments(request: Request, ports: PortsDep) -> list[dict[str, Any]]:
        """Every experiment, newest first: id, name, submitter, its counts by state,
        started, duration, priority class and team (as `trialbus experiments --json`)."""
        live = LiveFeeds(request.app.state.nats.nc, settings.topology)
        lookups = lookups_of(ports.coordinator, quotas=ports.quotas, live=live)
        rows = await queries.experiment_rows(ports.ledger, lookups, cache=ports.reports)
        return [row.as_dict() for row in rows]

    @router.get("/experiments/{experiment_id}/status")
    async def status(
        request: Request, experiment_id: str, ports: PortsDep
    ) -> dict[str, bool | int | str]:
        """Counts by state (while trials have no record: `running` and `queued`), spend
        against a budget, whether it is paused (and
        `paused_trials`: how many unfinished trials are paused one by one),
        `team_spend_capped` (true, while trials wait and its team reached its
        max_spend_usd_per_day), and the priority class its manifest names (as
        `trialbus status --json`)."""
        # bool first: pydantic's union keeps True a bool rather than reading it as 1.
        live = LiveFeeds(request.app.state.nats.nc, settings.topology)
        lookups = lookups_of(ports.coordinator, quotas=ports.quotas, live=live)
        return await queries.experiment_status(ports.ledger, experiment_id, lookups)

    @router.get("/experiments/{experiment_id}/leaderboard")
    async def board(experiment_id: str, ports: PortsDep) -> list[dict[str, Any]]:
        """The leaderboard rows (as `trialbus leaderboard --json`)."""
        _, rows = await queries.experiment_leaderboard(
            ports.ledger, experiment_id, cache=ports.reports
        )
        return rows

    @router.get("/experiments/{experiment_id}/trials")
    async def trial_list(
        request: Request,
        experiment_id: str,
        ports: PortsDep,
        where: Annotated[TrialFilter, Depends()],
    ) -> list[dict[str, Any]]:
        """Every trial running (first) or recorded, by task, agent and repetition: only
        unscored ones, one task's or one agent's (agent@model, or the agent) on request
        (as `trialbus trials --json`)."""
        live = LiveFeeds(request.app.state.nats.nc, settings.topology)
        _, lines = await experiment_trials(
            ports.ledger, experiment_id, cache=ports.reports, starts_of=live.started_trials
        )
        return select(lines, where)

    @router.get("/experiments/{experiment_id}/trials.xml")
    async def trials_junit(
        experiment_id: str, ports: PortsDep, where: Annotated[TrialFilter, Depends()]
    ) -> Response:
        """The trials (filtered as `/trials`) as a JUnit XML report: a test case per
        trial, a reward below a pass a failure, an unscored trial an error, a cancelled
        one skipped (as `trialbus trials --junit`)."""
        _, xml = await experiment_junit(ports.ledger, experiment_id, where, ports.reports)
        return Response(xml, media_type="application/xml")

    @router.get("/experiments/{experiment_id}/report")
    async def report(experiment_id: str, ports: PortsDep) -> dict[str, Any]:
        """The full report (as `trialbus report --json`)."""
        return await queries.experiment_report(ports.ledger, experiment_id, cache=ports.reports)

    @router.get("/experiments/{experiment_id}/report.html")
    async def report_html(experiment_id: str, ports: PortsDep) -> HTMLResponse:
        """The report as a self-contained HTML page (as `trialbus report --html`)."""
        return HTMLResponse(
            render_html(
                await queries.experiment_report(ports.ledger, experiment_id, cache=ports.reports)
            )
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

    @router.get("/runners")
    async def runners(request: Request) -> list[dict[str, Any]]:
        """The runner fleet (as `trialbus runners --json`): each live runner's host,
        pool, capabilities, concurrency, trials in flight, attempts done and failed,
        last heartbeat, and whether it is stale (missed its heartbeats)."""
        return [r.as_dict() for r in await fleet(await request.app.state.nats.registry())]

    @router.get("/queue")
    async def queue(request: Request, ports: PortsDep) -> dict[str, Any]:
        """What waits (as `trialbus queue --json`): queued trials per pool, priority
        class and team, and per experiment why they wait: `paused`, `team_spend_cap`
        (its team spent its max_spend_usd_per_day), `no_runner` (no live runner of its
        pool offers what it needs), `concurrency_limit` (its n_concurrent_trials are
        running), `over_share` (its team runs more than its fair share while another
        team waits) or `priority` (behind other work)."""
        return (await read_queue(request.app.state.nats, ports.ledger, ports.quotas)).as_dict()

    return router
