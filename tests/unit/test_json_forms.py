"""The JSON forms (``as_dict``) that ``--json``, the HTTP API and the live updates print:
every key, in its order, with its value. A client may read them by position (a CSV
export of ``--json``), so the order is pinned too, not only the keys: each expected
form below is written out in the order it is printed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from services.reports.progress import ExperimentRow, Progress
from services.reports.queue import QueueGroup, QueueView, WaitingExperiment
from services.submitter.follow import LogLine
from services.submitter.submit import SubmitResult

PROGRESS = Progress(
    total=10, done=4, running=2, queued=4, scored=3, unscored=1, cancelled=0, paused=True
)
PROGRESS_JSON = {
    "total": 10,
    "done": 4,
    "running": 2,
    "queued": 4,
    "scored": 3,
    "unscored": 1,
    "state": "paused",
}


def items(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """The pairs in their order (dict equality ignores the order)."""
    return list(data.items())


def test_progress_carries_the_counts_and_the_state_not_its_inputs() -> None:
    assert items(PROGRESS.as_dict()) == items(PROGRESS_JSON)


def test_an_experiment_row_flattens_its_progress_and_writes_times_as_iso() -> None:
    row = ExperimentRow(
        experiment_id="exp",
        name="demo",
        submitted_by="alice (red)",
        progress=PROGRESS,
        started=datetime(2026, 11, 26, 8, 0, 0, tzinfo=UTC),
        duration_s=12.5,
        priority_class="batch",
        team="red",
    )
    assert items(row.as_dict()) == [
        ("experiment_id", "exp"),
        ("name", "demo"),
        ("submitted_by", "alice (red)"),
        *items(PROGRESS_JSON),
        ("started", "2026-11-26T08:00:00+00:00"),
        ("duration_s", 12.5),
        ("priority_class", "batch"),
        ("team", "red"),
    ]


def test_the_queue_names_each_field_as_the_manifest_does() -> None:
    waiting_json: dict[str, Any] = {
        "experiment_id": "exp",
        "name": "demo",
        "pool": "gpu",
        "priority_class": "batch",
        "team": "red",
        "user": "alice",
        "queued": 5,
        "running": 2,
        "n_concurrent_trials": 2,
        "paused_trials": 1,
        "reason": "concurrency_limit",
        "detail": "2 of 2 running",
    }
    group_json: dict[str, Any] = {
        "pool": "gpu",
        "priority_class": "batch",
        "team": "red",
        "queued": 5,
        "running": 2,
        "experiments": 1,
        "by_reason": {"concurrency_limit": 5},
    }
    waiting = WaitingExperiment(**waiting_json)
    view = QueueView([QueueGroup(**group_json)], [waiting]).as_dict()
    assert list(view) == ["queued", "groups", "experiments"]
    assert view["queued"] == 5
    assert [items(g) for g in view["groups"]] == [items(group_json)]
    assert [items(e) for e in view["experiments"]] == [items(waiting_json)]


def test_a_submission_reports_its_counts_not_its_trial_ids() -> None:
    counts: dict[str, Any] = {
        "experiment_id": "exp",
        "name": "demo",
        "n_trials": 3,
        "n_published": 2,
        "n_duplicates": 0,
        "n_already_scored": 1,
        "correlation_id": "c0ffee",
    }
    result = SubmitResult(**counts, trial_ids=["t1", "t2", "t3"], published_ids=["t1", "t2"])
    assert items(result.as_dict()) == items(counts)


def test_a_log_line_is_its_three_fields() -> None:
    line = LogLine("agent", "stdout", "hello\n")
    assert items(line.as_dict()) == [("phase", "agent"), ("stream", "stdout"), ("text", "hello\n")]
