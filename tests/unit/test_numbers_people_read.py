"""Numbers people read: a few scored trials still give the estimate and its interval,
flagged ``too_few`` and greyed in every table; an invalid reward is named as such.

Each invariant has its control: five scored trials are not flagged nor greyed; an
unscored trial with a failure class keeps that class as its cause.
"""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from rich.text import Text

from schemas.record import Evaluation, FailureClass, TrialRecord
from services.reports.html import leaderboard_html
from services.reports.leaderboard import leaderboard, status_counts
from services.reports.report import build_report
from services.reports.scoring import estimate_mean, estimate_rate, unscored_cause
from services.reports.tables import leaderboard_table
from services.submitter.dashboard_views import leaderboard_cells
from tests.support.records import report_record


def _record(evaluation: Evaluation, agent: str = "oracle") -> TrialRecord:
    return report_record(evaluation, agent=agent)


def scored(reward: float, agent: str = "oracle") -> TrialRecord:
    return _record(
        Evaluation(
            rewards={"reward": reward},
            main_reward_key="reward",
            main_reward=reward,
            reward_valid=True,
        ),
        agent,
    )


def invalid_reward(agent: str = "oracle") -> TrialRecord:
    """What the importer records for a NaN, a string or a list as the reward
    (tests/unit/test_records.py: the key is kept, the value dropped)."""
    return _record(
        Evaluation(rewards={}, main_reward_key="reward", main_reward=None, reward_valid=False),
        agent,
    )


def failed(cause: FailureClass, agent: str = "oracle") -> TrialRecord:
    return _record(
        Evaluation(reward_valid=False, failure_class=cause, exception_type="SomeError"), agent
    )


# -- too few: given, flagged, greyed ------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_a_few_scored_trials_give_the_estimate_and_its_wilson_interval(n: int) -> None:
    [row] = leaderboard([scored(1.0)] * (n - 1) + [scored(0.0)])
    data = json.loads(json.dumps(row.as_dict()))  # as `leaderboard --json` prints it
    assert data["too_few"] is True
    assert data["mean_reward"] == data["pass_rate"] == pytest.approx((n - 1) / n)
    low, high = data["pass_rate_ci"]
    assert low <= (n - 1) / n <= high and high - low > 0.3  # wide, as it should be
    assert data["mean_reward_ci"] == data["pass_rate_ci"]
    assert data["mean_reward_ci_method"] == "wilson"


def test_control_five_scored_trials_are_not_flagged() -> None:
    [row] = leaderboard([scored(1.0)] * 5)
    assert row.too_few is False and row.mean_reward == 1.0 and row.pass_at_k


def test_no_scored_trial_gives_no_number() -> None:
    [row] = leaderboard([failed("infrastructure")])
    assert row.mean_reward is None and row.pass_rate is None
    assert row.mean_reward_ci is None and row.pass_rate_ci is None
    assert row.too_few


def test_one_graded_reward_has_a_mean_but_no_bootstrap_interval() -> None:
    one = estimate_mean([0.4])
    assert (one.value, one.interval, one.too_few) == (0.4, None, True)
    two = estimate_mean([0.4, 0.6])
    assert two.interval is not None and two.interval.method == "bootstrap" and two.too_few
    assert estimate_rate(0, 0).value is None


def _rows(records: list[TrialRecord]) -> list[dict[str, object]]:
    return [r.as_dict() for r in leaderboard(records)]


def _few_and_many() -> list[dict[str, object]]:
    return _rows([scored(1.0, "few")] * 3 + [scored(1.0, "many")] * 6)


def test_cli_table_greys_the_too_few_estimate_and_says_why() -> None:
    table = leaderboard_table(_few_and_many(), "t")
    mean_col = next(c for c in table.columns if str(c.header).startswith("mean reward"))
    many, few = list(mean_col.cells)  # enough trials rank first
    assert isinstance(few, Text) and few.style == "dim"
    assert "1.000 [0.439, 1.000]" in few.plain and "too few (3 < 5)" in few.plain
    assert not isinstance(many, Text)  # control: not greyed
    console = Console(width=200, record=True)
    console.print(table)
    assert "too few (3 < 5)" in console.export_text()


def test_html_report_shows_the_too_few_estimate_greyed() -> None:
    page = leaderboard_html(_few_and_many())
    few_row = next(tr for tr in page.split("<tr>") if ">few<" in tr)
    many_row = next(tr for tr in page.split("<tr>") if ">many<" in tr)
    assert '<span class="few">1.000 [0.439, 1.000]</span>' in few_row
    assert "too few scored (3 &lt; 5)" in few_row and "few-bar" in few_row
    assert 'class="few"' not in many_row and "1.000 [0.610, 1.000]" in many_row


def test_dashboard_cells_show_the_number_and_the_note() -> None:
    few, many = (
        leaderboard_cells(r) for r in sorted(_few_and_many(), key=lambda r: str(r["agent"]))
    )
    assert few["mean"] == "1.000 [0.439, 1.000]" and few["note"] == "too few (3 < 5)"
    assert many["note"] == ""  # control: the template greys rows with a note only


def test_too_few_rows_rank_after_rows_with_enough_trials() -> None:
    rows = leaderboard([scored(1.0, "few")] * 4 + [scored(0.0, "many")] * 5)
    assert [r.agent for r in rows] == ["many", "few"]


# -- the cause of an unscored trial ---------------------------------------------------


def test_an_invalid_reward_is_named_invalid_reward() -> None:
    recs = [scored(1.0), invalid_reward(), failed("verifier")]
    [row] = leaderboard(recs)
    assert row.unscored_by_cause == {"invalid_reward": 1, "verifier": 1}
    counts = status_counts(recs, None)
    assert counts["unscored_invalid_reward"] == 1 and "unscored_none" not in counts
    report = build_report("exp", recs, None)
    assert report["tasks"][0]["cells"][0]["unscored_by_cause"] == row.unscored_by_cause
    causes = {(f["failure_class"], f["exception_type"]) for f in report["failures"]}
    assert causes == {("invalid_reward", "-"), ("verifier", "SomeError")}


def test_causes_keep_the_failure_class_and_name_a_missing_reward() -> None:
    assert unscored_cause(failed("infrastructure")) == "infrastructure"  # control
    assert unscored_cause(failed("agent")) == "agent"
    no_reward = _record(Evaluation(reward_valid=False))
    assert unscored_cause(no_reward) == "no_reward"
    assert unscored_cause(invalid_reward()) == "invalid_reward"
