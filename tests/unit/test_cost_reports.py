"""Cost in reports: an unknown cost reads "unknown", a total says which trials it covers.

A record's ``usage.cost_usd`` is None when the model has no price or the agent reported
no usage (services.importer.records; terminus-2 reports a zero cost as none). Reports
used to leave such trials out of the sum silently and show "-" when none had a cost.
"""

from __future__ import annotations

import re

from rich.console import Console

from schemas.record import FailureClass, TrialRecord, Usage
from services.common.ports import ExperimentInfo
from services.reports.formatting import cost, shows_cost, total_cost, usage_cell
from services.reports.html import render_html
from services.reports.leaderboard import leaderboard
from services.reports.report import build_report
from services.reports.tables import leaderboard_table, report_renderable
from tests.support.records import report_record, single_reward

MODEL = "openai/gpt-x"


def rec(
    agent: str, cost_usd: float | None, *, model: str | None = MODEL, reward: float | None = 1.0
) -> TrialRecord:
    failure: FailureClass = "none" if reward is not None else "infrastructure"
    return report_record(
        single_reward(reward, failure, None if reward is not None else "E"),
        task="hello-file",
        agent=agent,
        model=model,
        usage=Usage(cost_usd=cost_usd, n_input_tokens=None if cost_usd is None else 1000),
    )


def rows_of(records: list[TrialRecord]) -> list[dict[str, object]]:
    return [r.as_dict() for r in leaderboard(records, min_scored=1)]


def text(renderable: object) -> str:
    console = Console(record=True, width=400)
    console.print(renderable)
    return re.sub(r"\s+", " ", console.export_text())


def test_a_mix_of_priced_and_unpriced_trials_says_how_many_the_sum_covers() -> None:
    records = [rec("terminus-2", 0.042) for _ in range(10)] + [rec("terminus-2", None)] * 2
    [row] = rows_of(records)
    assert cost(row) == "$0.42 over 10 of 12 trials; 2 unknown ($0.042, 10 of 12 scored priced)"
    usage = row["usage"]["cost_usd"]  # type: ignore[index]
    assert (usage["n_reported"], usage["n_unknown"]) == (10, 2)


def test_no_price_at_all_reads_unknown_never_zero() -> None:
    [row] = rows_of([rec("terminus-2", None) for _ in range(3)])
    assert row["usage"]["cost_usd"]["sum"] is None  # type: ignore[index]
    assert cost(row) == "unknown (3 trials)"
    assert shows_cost([row])  # an LLM agent: the column is there, saying so
    board = text(leaderboard_table([row], "t"))
    assert "unknown (3 trials)" in board and "$0.00" not in board
    assert usage_cell("n_input_tokens", row["usage"]["n_input_tokens"]) == "unknown (3 trials)"  # type: ignore[index]


def test_negative_control_a_known_zero_cost_stays_zero_and_all_priced_says_all() -> None:
    [free] = rows_of([rec("local-model", 0.0) for _ in range(3)])
    assert cost(free) == "$0.00 over 3 trials ($0.000)"
    [paid] = rows_of([rec("terminus-2", 0.5) for _ in range(4)])
    assert cost(paid, "/scored") == "$2.00 over 4 trials ($0.500/scored)"
    assert "unknown" not in cost(paid)


def test_unscored_trials_cost_money_and_count_in_the_coverage() -> None:
    records = [
        rec("terminus-2", 0.25),
        rec("terminus-2", 0.25, reward=None),
        rec("terminus-2", None),
    ]
    [row] = rows_of(records)
    # Both priced trials are summed; the mean per scored trial covers 1 of 2 scored.
    assert cost(row) == "$0.50 over 2 of 3 trials; 1 unknown ($0.250, 1 of 2 scored priced)"


def test_oracle_and_nop_tables_have_no_cost_column() -> None:
    rows = rows_of([rec("oracle", None, model=None), rec("nop", None, model=None)])
    assert not shows_cost(rows)
    assert "cost" not in text(leaderboard_table(rows, "t"))
    # Shown beside an LLM agent, a model-less agent's cost is unknown too, not blank.
    rows = rows_of([rec("oracle", None, model=None), rec("terminus-2", 0.1)])
    assert shows_cost(rows)
    assert {cost(r) for r in rows} == {"unknown (1 trial)", "$0.10 over 1 trial ($0.100)"}


def test_report_totals_cover_every_row_and_say_so() -> None:
    records = [
        *(rec("terminus-2", 0.042) for _ in range(10)),
        rec("terminus-2", None),
        rec("other", None, model="anthropic/x"),
    ]
    info = ExperimentInfo(
        "exp", "demo", 12, {"agents": [{"name": "terminus-2"}, {"name": "other"}]}
    )
    report = build_report("exp", records, info, min_scored=1)
    assert report["usage"]["cost_usd"]["n_unknown"] == 2
    assert total_cost(report).startswith("$0.42 over 10 of 12 trials; 2 unknown")
    cli = text(report_renderable(report))
    assert "cost $0.42 over 10 of 12 trials; 2 unknown" in cli
    assert "unknown (1 trial)" in cli  # the unpriced row
    page = render_html(report)
    assert "Cost: $0.42 over 10 of 12 trials; 2 unknown" in page
    assert "$0.42 over 11 trials" not in page and "$0.42 over 12 trials" not in page
