"""The dashboard's live parts: Server-Sent Events streams and the fragments they carry.

- ``experiment_stream``: on connect, then at most once per ``UPDATE_INTERVAL_S`` after
  any event of the experiment, a ``progress`` event (counts, state, and the
  leaderboard and the trial table's page the browser shows, rendered again from the
  ledger through the one read path; of those, only what changed since the
  connection's last event: ``Shown``);
  each event of the experiment also as a short ``trial`` line. The
  subscription opens before the first snapshot, so no event between them is missed.
- ``log_stream``: a trial's ``trial_log`` events (oldest the logs stream holds first),
  as ``log`` events.

Both send a comment every ``KEEPALIVE_S`` while quiet (proxies drop idle connections)
and end when the browser goes away (Starlette cancels the generator, whose
subscription is then closed).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from typing import Any

from schemas.events import (
    Envelope,
    ExperimentCompleted,
    ResultImported,
    TrialCompleted,
    TrialFailed,
    TrialLog,
    TrialStarted,
)
from schemas.record import TrialRecord
from services.common.ports import ExperimentInfo, Ledger
from services.reports import formatting, queries, stored
from services.reports.progress import Recorded, experiment_row, recorded_of
from services.reports.report_cache import ReportCache
from services.reports.stored import Codec
from services.submitter import dashboard_charts as charts
from services.submitter import dashboard_views as views
from services.submitter.dashboard_compare import experiment_compare_url
from services.submitter.live_feeds import LiveFeeds, StartedTrials

UPDATE_INTERVAL_S = 1.0
KEEPALIVE_S = 15.0
PARTS = ("leaderboard", "causes", "passk", "matrix", "usage", "trials")
"""The experiment page's live sections (element ids, and their ``_<id>.html`` templates)."""

MatrixShape = tuple[tuple[str, ...], tuple[str, ...], int]
"""What places the matrix's cells: its agents, its tasks shown, and the tasks hidden."""


@dataclass(frozen=True, slots=True)
class Sections:
    """The experiment page's live tables: their template context, and as HTML."""

    context: dict[str, Any]

    def render(self, part: str) -> str:
        """One section's fragment (the content of the element with id ``part``)."""
        return views.PAGES.get_template(f"_{part}.html").render(**self.context)

    def html(self) -> dict[str, str]:
        """Element id -> the fragment that replaces its content."""
        return {part: self.render(part) for part in PARTS}

    def matrix_cells(self) -> tuple[MatrixShape, dict[str, str]]:
        """The matrix's shape, and each cell's ``<td>`` by its ``data-cell`` key
        (``row-column``), rendered by the macro the whole matrix uses."""
        m = self.context["matrix"]
        cell = views.PAGES.get_template("_matrix_cell.html").module.cell  # type: ignore[attr-defined]
        cells = {
            f"{r}-{c}": str(cell(row["task"], value, f"{r}-{c}"))
            for r, row in enumerate(m["rows"])
            for c, value in enumerate(row["cells"])
        }
        shape = (tuple(m["agents"]), tuple(row["task"] for row in m["rows"]), m["hidden"])
        return shape, cells


@dataclass(slots=True)
class Shown:
    """What one page (one SSE connection) shows already, so an update sends only what
    changed: each section's HTML, and the matrix's shape and cells. The matrix is
    the page's largest part (~290 KB at 200 tasks x 4 agents) and a new record
    changes one of its cells: while its shape holds, only the changed cells go."""

    html: dict[str, str] = field(default_factory=dict)
    shape: MatrixShape | None = None
    cells: dict[str, str] = field(default_factory=dict)

    def changes(self, parts: Sections) -> dict[str, Any]:
        """``sections``: element id -> fragment, for the sections that changed (all
        on the first call); ``cells``: ``data-cell`` key -> ``<td>``, for the matrix
        cells that changed while the matrix kept its shape."""
        sections: dict[str, str] = {}
        for part in PARTS:
            if part == "matrix":
                continue
            html = parts.render(part)
            if self.html.get(part) != html:
                sections[part] = self.html[part] = html
        shape, cells = parts.matrix_cells()
        changed: dict[str, str] = {}
        if shape != self.shape:  # new tasks or agents: the whole table again
            sections["matrix"] = parts.render("matrix")
        else:
            changed = {key: td for key, td in cells.items() if self.cells.get(key) != td}
        self.shape, self.cells = shape, cells
        return {"sections": sections, "cells": changed}


async def sections(
    ledger: Ledger,
    experiment_id: str,
    records: Sequence[TrialRecord],
    started: Mapping[str, TrialStarted],
    page: int = 1,
) -> Sections:
    """The leaderboard with its error bars, the failure causes, pass@k, the task x
    agent matrix, cost and budget (``queries.experiment_report``, as the JSON API's
    report) and page ``page`` of the trials."""
    report = await queries.experiment_report(ledger, experiment_id, required=False)
    running = views.running_rows(started, {r.trial_id for r in records})
    table = views.trial_page(running, views.record_rows(records), page)
    return _context(experiment_id, report, table)


@dataclass(frozen=True, slots=True)
class PageView:
    """What the experiment page shows that the records decide, computed once per
    content version (``page_view``; kept in the submitter's ReportCache and in the
    ledger): the report, the progress basis and every row of the trial table (each
    page and live update shows ``PAGE_ROWS`` of them), not the records."""

    info: ExperimentInfo | None
    report: dict[str, Any]
    recorded: Recorded
    rows: tuple[views.TrialRow, ...]


def page_view_of(
    experiment_id: str, info: ExperimentInfo | None, records: list[TrialRecord]
) -> PageView:
    """The ``PageView`` of an experiment's metadata and records (pure)."""
    return PageView(
        info=info,
        report=queries.report_value(experiment_id, info, records),
        recorded=recorded_of(records, info),
        rows=tuple(views.record_rows(records)),
    )


_ROW_FIELDS = tuple(f.name for f in fields(views.TrialRow))

PAGE_CODEC: Codec[PageView] = Codec(
    lambda v: {
        "info": stored.info_to_json(v.info),
        "report": v.report,
        "recorded": stored.recorded_to_json(v.recorded),
        # Rows as lists (the field names once): ~40 % of the JSON at 10,000 trials.
        "rows": [[getattr(r, f) for f in _ROW_FIELDS] for r in v.rows],
    },
    lambda d: PageView(
        info=stored.info_of_json(d["info"]),
        report=d["report"],
        recorded=stored.recorded_of_json(d["recorded"]),
        rows=tuple(views.TrialRow(*r) for r in d["rows"]),
    ),
)
"""How a ``PageView`` is kept in the ledger (services/reports/stored.py)."""


async def page_view(
    ledger: Ledger, experiment_id: str, cache: ReportCache | None, *, required: bool = True
) -> PageView:
    """The experiment's ``PageView`` through the one read path (``queries.derived``)."""
    _, view = await queries.derived(
        ledger,
        experiment_id,
        "page",
        page_view_of,
        cache=cache,
        required=required,
        codec=PAGE_CODEC,
    )
    return view


def page_row(
    experiment_id: str,
    view: PageView,
    started: Mapping[str, TrialStarted],
    paused: bool = False,
) -> views.ExperimentRow:
    """The experiment's row (progress, started, duration) as the list shows it."""
    return experiment_row(experiment_id, view.info, view.recorded, started, paused=paused)


def view_sections(
    experiment_id: str, view: PageView, started: Mapping[str, TrialStarted], page: int = 1
) -> Sections:
    """``sections`` of a ``PageView``: page ``page`` of the running trials, then its rows."""
    running = views.running_rows(started, view.recorded.trial_ids)
    return _context(experiment_id, view.report, views.trial_page(running, view.rows, page))


def _context(experiment_id: str, report: dict[str, Any], table: views.TrialPage) -> Sections:
    board = report["leaderboard"]
    scale = charts.mean_scale(board)
    return Sections(
        {
            "board": [
                {**views.leaderboard_cells(r), "bars": charts.error_bars(r, scale)} for r in board
            ],
            "bars_legend": charts.bars_legend(scale),
            "causes": charts.unscored_causes(board),
            "failures": report["failures"],
            "passk": charts.pass_at_k(board),
            "min_scored": report["scoring"]["min_scored"],
            "matrix": charts.matrix(report),
            "usage": charts.usage_rows(board),
            "total_cost": formatting.total_cost(report) if formatting.shows_cost(board) else "",
            "budget": report["budget"],
            "meters": charts.budget_meters(report["budget"]),
            "trials": [{**asdict(t), "url": views.trial_url(t.trial_id)} for t in table.rows],
            "pager": table.pager(experiment_id),
            "experiment_id": experiment_id,
            "compare_url": experiment_compare_url(
                experiment_id, [formatting.row_agent(r) for r in board]
            ),
        }
    )


def sse(event: str, data: Any) -> str:
    """One Server-Sent Event; JSON on one line (it escapes every newline)."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def describe(event: Envelope) -> dict[str, Any] | None:
    """The live events list's line for an experiment event; None for other events."""
    detail: str
    if isinstance(event, TrialStarted):
        detail = f"attempt {event.attempt} on {event.host}"
    elif isinstance(event, TrialCompleted):
        detail = f"attempt {event.attempt} finished"
    elif isinstance(event, TrialFailed):
        detail = f"{event.failure_class}: {event.error_type}" + ("" if event.final else " (retry)")
    elif isinstance(event, ResultImported):
        detail = f"{event.status}, reward {formatting.num(event.main_reward)}"
        detail = detail if event.scored else f"{event.status}, unscored"
    elif isinstance(event, ExperimentCompleted):
        detail = f"{event.n_scored} of {event.n_trials} scored"
    else:
        return None
    return {
        "type": str(getattr(event, "type", "")),
        "trial_id": event.trial_id,
        "at": event.occurred_at.strftime("%H:%M:%S"),
        "detail": detail,
    }


@dataclass(frozen=True, slots=True)
class PageSources:
    """Where the experiment page's live feed reads: the ledger, through ``cache`` (the
    submitter's ReportCache: an unchanged experiment is not read again); the bus's
    live feeds (the experiment's events, its started trials); and the coordinator's
    ``lookups`` (its pause flag, for the state)."""

    ledger: Ledger
    live: LiveFeeds
    lookups: queries.Lookups = queries.NOTHING_KNOWN
    cache: ReportCache | None = None


async def progress_event(
    sources: PageSources,
    experiment_id: str,
    tracked: StartedTrials,
    shown: Shown | None = None,
    page: int = 1,
) -> str:
    """The ``progress`` event: counts and the tables, as the ledger holds them now;
    ``tracked``: the started trials as the page's feed keeps them; with ``shown``,
    what the page shows already, only what changed since (``Shown.changes``), else
    every section; ``page``: the trial table's page the browser shows (only it is
    sent)."""
    view = await page_view(sources.ledger, experiment_id, sources.cache, required=False)
    started = await tracked.current()
    parts = view_sections(experiment_id, view, started, page)
    paused_of = sources.lookups.paused_of
    paused = paused_of is not None and await paused_of(experiment_id)
    row = page_row(experiment_id, view, started, paused=paused)
    counts = {
        **row.progress.as_dict(),
        "started": views.when(row.started),
        "duration": views.duration(row.duration_s),
    }
    update = (shown or Shown()).changes(parts)
    return sse("progress", {"progress": counts, **update})


async def experiment_stream(
    sources: PageSources, experiment_id: str, page: int = 1
) -> AsyncIterator[str]:
    """The experiment page's live feed (see the module doc), for the trial table's
    page ``page``."""
    shown = Shown()  # this page's own: a reconnect starts afresh and gets everything
    tracked = StartedTrials(sources.live, experiment_id)  # kept current from the feed
    progress = partial(progress_event, sources, experiment_id, tracked, shown, page)
    async with sources.live.experiment_events(experiment_id) as feed:
        yield await progress()
        dirty, last = False, time.monotonic()
        while True:
            since = time.monotonic() - last
            event = await feed.next(max(0.05, UPDATE_INTERVAL_S - since) if dirty else KEEPALIVE_S)
            tracked.seen(event)
            line = describe(event) if event is not None else None
            if line is not None:
                yield sse("trial", line)
                dirty = True
            if dirty and time.monotonic() - last >= UPDATE_INTERVAL_S:
                yield await progress()
                dirty, last = False, time.monotonic()
            elif event is None and not dirty:
                yield ": keepalive\n\n"


async def log_stream(live: LiveFeeds, trial_id: str) -> AsyncIterator[str]:
    """A trial's live log (see the module doc)."""
    async with live.trial_log(trial_id) as feed:
        yield ": following\n\n"  # the browser knows at once that the stream is open
        while True:
            event = await feed.next(KEEPALIVE_S)
            if isinstance(event, TrialLog) and event.trial_id == trial_id:
                yield sse("log", {"phase": event.phase, "stream": event.stream, "text": event.text})
            elif event is None:
                yield ": keepalive\n\n"
