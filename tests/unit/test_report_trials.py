"""An experiment's trials, one line each (services/reports/trials.py)."""

from __future__ import annotations

from services.reports.trials import EVERY_TRIAL, TrialFilter, lines_value, select
from services.submitter.dashboard_views import record_rows
from tests.support.records import report_record, single_reward

RECORDS = [
    report_record(single_reward(1.0), task="b", agent="oracle", model="m1"),
    report_record(single_reward(0.0), task="a", agent="oracle", model="m2"),
    report_record(single_reward(None, "agent", "AgentTimeoutError"), task="a", label="mine"),
]


def test_a_line_says_what_the_record_says() -> None:
    lines = lines_value("exp", None, RECORDS)
    assert [(t["task"], t["agent"]) for t in lines] == [
        ("a", "mine"),
        ("a", "oracle@m2"),
        ("b", "oracle@m1"),
    ]
    timed_out = lines[0]
    assert (timed_out["scored"], timed_out["reward"], timed_out["failure_class"]) == (
        False,
        None,
        "agent",
    )
    assert timed_out["exception_type"] == "AgentTimeoutError"
    assert (lines[1]["scored"], lines[1]["reward"]) == (True, 0.0)  # a 0 is a score
    # The dashboard's trial table shows the same trials in the same order.
    assert [r.trial_id for r in record_rows(RECORDS)] == [t["trial_id"] for t in lines]


def test_the_filters_keep_what_they_name_and_nothing_else() -> None:
    lines = lines_value("exp", None, RECORDS)
    assert select(lines, EVERY_TRIAL) == lines  # the control: no filter keeps every line

    def ids(chosen: list[dict[str, object]]) -> list[object]:
        return [t["trial_id"] for t in chosen]

    assert ids(select(lines, TrialFilter(unscored=True))) == [lines[0]["trial_id"]]
    assert ids(select(lines, TrialFilter(task="a"))) == ids(lines[:2])
    assert ids(select(lines, TrialFilter(agent="oracle"))) == ids(lines[1:])
    assert ids(select(lines, TrialFilter(agent="oracle@m1"))) == [lines[2]["trial_id"]]
    assert (
        select(lines, TrialFilter(agent="orac")) == []
        and select(lines, TrialFilter(task="c")) == []
    )
