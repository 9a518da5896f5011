"""Pure views shared by the dashboard and the CLI (services/reports/progress.py) and the
CLI's renderings of them (services/cli_live.py): rate and ETA, stale runners, tables."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rich.console import Console

from schemas.events import TrialStarted
from schemas.record import Evaluation, PhaseTiming, Provenance, TrialRecord
from schemas.runners import RunnerInfo
from services.cli_live import experiments_table, runners_table, status_line, status_text
from services.common.ports import ExperimentInfo
from services.reports.progress import (
    STALE_AFTER_HEARTBEATS,
    experiment_row,
    rate_and_eta,
    recorded_of,
    runner_rows,
)
from services.submitter import dashboard_views

NOW = datetime(2026, 11, 26, 8, 0, 0, tzinfo=UTC)
INFO = ExperimentInfo("exp", "demo <b>", 10, {"submitted_by": {"user": "alice", "team": "red"}})


def _rec(i: int, start_s: float, end_s: float) -> TrialRecord:
    return TrialRecord(
        trial_id=f"t{i}",
        experiment_id="exp",
        status="complete",
        provenance=Provenance(task_name="task", agent_name="oracle"),
        evaluation=Evaluation(
            rewards={"reward": 1.0}, main_reward_key="reward", main_reward=1.0, reward_valid=True
        ),
        timing=PhaseTiming(
            started_at=NOW - timedelta(seconds=start_s),
            finished_at=NOW - timedelta(seconds=end_s),
        ),
    )


def _text(renderable: object) -> str:
    console = Console(width=250, record=True)
    console.print(renderable)
    return console.export_text()


def test_rate_and_eta_from_the_first_start_while_running() -> None:
    # 4 of 10 recorded, the first started 120 s ago: 2 a minute, 6 left: 180 s.
    recs = [_rec(i, 120, 60 - i) for i in range(4)]
    row = experiment_row("exp", INFO, recorded_of(recs, INFO), ["t4", "t5"], NOW)
    assert (row.progress.done, row.progress.running, row.progress.queued) == (4, 2, 4)
    rate, eta = rate_and_eta(row)
    assert rate == 2.0 and eta == 180.0
    line = status_line(row)
    assert (line["rate_per_min"], line["eta_s"], line["submitted_by"]) == (
        2.0,
        180.0,
        "alice (red)",
    )
    assert status_text(line) == "2 running, 4 queued, 0 unscored, 2.0/min, ETA 3m 00s, running"


def test_no_rate_before_a_record_and_no_time_left_when_complete() -> None:
    waiting = experiment_row("exp", INFO, recorded_of([], INFO), ["t0"], NOW)
    assert rate_and_eta(waiting) == (None, None)
    two = ExperimentInfo("exp", "d", 2, {})
    done = experiment_row("exp", two, recorded_of([_rec(0, 60, 30), _rec(1, 50, 0)], two), [], NOW)
    assert done.progress.state == "complete" and done.duration_s == 60.0  # to the last end
    assert rate_and_eta(done) == (2.0, 0.0)


def test_the_dashboard_uses_the_shared_functions() -> None:
    # One implementation: the dashboard's names are the reports' functions, not copies.
    assert dashboard_views.experiment_row is experiment_row
    assert dashboard_views.Progress is type(
        experiment_row("e", None, recorded_of([], None), []).progress
    )


def test_a_runner_is_stale_after_two_missed_heartbeats() -> None:
    beat = 10.0
    ages = {"on-time": beat, "edge": STALE_AFTER_HEARTBEATS * beat, "late": 2.5 * beat}
    infos = [
        RunnerInfo(runner_id=name, host="h", concurrency=1, last_seen=NOW - timedelta(seconds=age))
        for name, age in ages.items()
    ]
    rows = {r.runner_id: r for r in runner_rows(infos, beat, NOW)}
    assert {k: r.stale for k, r in rows.items()} == {"on-time": False, "edge": False, "late": True}
    assert rows["late"].as_dict()["age_s"] == 25.0


def test_tables_show_the_rows_and_print_names_as_text() -> None:
    row = experiment_row("exp", INFO, recorded_of([_rec(0, 120, 60)], INFO), [], NOW)
    text = _text(experiments_table([row]))
    assert "demo <b>" in text and "alice (red)" in text and "running" in text
    runner = RunnerInfo(
        runner_id="h-1",
        host="[red]h[/red]",  # a host name is text, never markup
        capabilities=["local"],
        labels=["gpu"],
        concurrency=3,
        last_seen=NOW - timedelta(seconds=100),
    )
    text = _text(runners_table(runner_rows([runner], 10.0, NOW)))
    assert "[red]h[/red]" in text and "local, gpu (label)" in text and "stale" in text


def test_the_list_filter_finds_team_and_class() -> None:
    info = ExperimentInfo(
        "exp",
        "sweep",
        1,
        {"compute": {"priority_class": "batch"}, "submitted_by": {"user": "bo", "team": "blue"}},
    )
    row = experiment_row("exp", info, recorded_of([], info), [], NOW)
    assert (row.team, row.priority_class) == ("blue", "batch")
    assert row.matches("batch") and row.matches("BLUE")
    assert not row.matches("urgent")  # control: another class
    assert row.as_dict()["team"] == "blue"
    text = _text(experiments_table([row], "normal"))
    assert "blue" in text and "batch" in text
    one = ExperimentInfo("e2", "d", 1, {})
    unset = experiment_row("e2", one, recorded_of([], one), [], NOW)
    assert unset.class_shown("normal") == "normal" and unset.as_dict()["priority_class"] is None
    assert "normal" in _text(experiments_table([unset], "normal"))


def test_a_running_trial_s_row_names_its_task_and_agent_from_its_start() -> None:
    named = TrialStarted(
        experiment_id="exp", trial_id="t1", runner_id="r", host="node-a", attempt=2,
        task_name="hello-file", agent_label="t2", model="anthropic/claude-sonnet-4",
    )  # fmt: skip
    older = TrialStarted(experiment_id="exp", trial_id="t2", runner_id="r", host="h", attempt=1)
    done = older.model_copy(update={"trial_id": "t3"})
    rows = dashboard_views.running_rows({"t1": named, "t2": older, "t3": done}, {"t3"})
    cells = [(r.trial_id, r.task, r.agent, r.status, r.attempts, r.runner_host) for r in rows]
    assert cells == [
        ("t1", "hello-file", "t2@anthropic/claude-sonnet-4", "running", "2", "node-a"),
        # A runner older than the names: dashes, as before.
        ("t2", "-", "-", "running", "1", "h"),
    ]
