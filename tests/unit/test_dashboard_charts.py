"""The experiment page's figures (services/submitter/dashboard_charts.py): error bars
placed where the leaderboard's intervals say, the task x agent matrix's outcomes, cost
and tokens with their coverage, the budget against the spend; and the page's fragments
(dashboard_stream.sections) built from the JSON API's report, escaped."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest

from schemas.record import Provenance, TrialRecord, Usage
from services.common.adapters.memory import InMemoryLedger
from services.common.ports import ExperimentInfo
from services.reports import queries
from services.reports.report import build_report, cell_outcome
from services.submitter import dashboard_charts as charts
from services.submitter.dashboard_stream import sections
from services.submitter.dashboard_views import leaderboard_cells
from tests.support.records import single_reward

SVG = "{http://www.w3.org/2000/svg}"


def row(
    mean: float | None, ci: list[float] | None, rate: float | None = None, **kw: Any
) -> dict[str, Any]:
    return {
        "agent": "a",
        "model": None,
        "mean_reward": mean,
        "mean_reward_ci": ci,
        "pass_rate": rate,
        "pass_rate_ci": kw.pop("rate_ci", None),
        "too_few": kw.pop("too_few", False),
        **kw,
    }


def value_at(x: float, scale: tuple[float, float]) -> float:
    """The inverse of the bars' placement: the value a pixel stands for."""
    lo, hi = scale
    return lo + (x - 10) / (charts.BAR_WIDTH - 20) * (hi - lo)


def parts(svg: str) -> dict[str, list[ET.Element]]:
    root = ET.fromstring(svg)
    out: dict[str, list[ET.Element]] = {}
    for el in root.iter():
        out.setdefault(el.get("class") or el.tag.removeprefix(SVG), []).append(el)
    return out


def test_error_bars_sit_where_the_intervals_are() -> None:
    r = row(0.5, [0.2, 0.8], 0.4, rate_ci=[0.1, 0.7])
    scale = (0.0, 1.0)
    drawn = parts(str(charts.error_bars(r, scale)))
    (mean_ci,) = drawn["ci mean"]
    (rate_ci,) = drawn["ci rate"]
    assert value_at(float(mean_ci.get("x1", "")), scale) == pytest.approx(0.2, abs=0.01)
    assert value_at(float(mean_ci.get("x2", "")), scale) == pytest.approx(0.8, abs=0.01)
    assert value_at(float(rate_ci.get("x1", "")), scale) == pytest.approx(0.1, abs=0.01)
    assert value_at(float(rate_ci.get("x2", "")), scale) == pytest.approx(0.7, abs=0.01)
    (point,) = drawn["point mean"]
    assert point.tag == f"{SVG}circle"  # the shape tells the series apart
    assert value_at(float(point.get("cx", "")), scale) == pytest.approx(0.5, abs=0.01)
    (square,) = drawn["point rate"]
    assert square.tag == f"{SVG}rect"
    assert len(drawn["cap mean"]) == len(drawn["cap rate"]) == 2
    # The label is the leaderboard's own wording of the same numbers.
    (title,) = drawn["title"]
    assert title.text == "mean reward 0.500 [0.200, 0.800]; pass rate 40.0% [10.0%, 70.0%]"
    assert drawn["bars"][0].get("aria-label") == title.text


def test_negative_controls_other_intervals_move_the_bars_and_no_estimate_draws_none() -> None:
    scale = (0.0, 1.0)
    a = parts(str(charts.error_bars(row(0.5, [0.2, 0.8]), scale)))["ci mean"][0]
    b = parts(str(charts.error_bars(row(0.5, [0.3, 0.6]), scale)))["ci mean"][0]
    assert (a.get("x1"), a.get("x2")) != (b.get("x1"), b.get("x2"))
    assert str(charts.error_bars(row(None, None), scale)) == ""  # no scored trial: no bar
    few = parts(str(charts.error_bars(row(1.0, [0.2, 1.0], too_few=True), scale)))
    assert few["bars too-few"]  # greyed, still drawn
    assert "bars" not in few
    # One value, no interval: a point without whiskers.
    lone = parts(str(charts.error_bars(row(0.7, None), scale)))
    assert "ci mean" not in lone and lone["point mean"]


def test_the_axis_widens_for_rewards_beyond_one_and_the_legend_says_so() -> None:
    rows = [row(2.0, [0.5, 3.0]), row(0.2, [-0.5, 0.4])]
    scale = charts.mean_scale(rows)
    assert scale == (-0.5, 3.0)
    assert "own axis" in charts.bars_legend(scale)
    assert "own axis" not in charts.bars_legend(charts.mean_scale([row(0.5, [0.2, 0.8])]))
    drawn = parts(str(charts.error_bars(rows[0], scale)))["ci mean"][0]
    assert value_at(float(drawn.get("x2", "")), scale) == pytest.approx(3.0, abs=0.01)


def rec(
    i: int,
    task: str,
    agent: str,
    reward: float | None,
    failure: str = "none",
    usage: Usage | None = None,
    model: str | None = None,
) -> TrialRecord:
    return TrialRecord(
        trial_id=f"{task}__{agent}__{i}",
        experiment_id="exp",
        status="complete" if reward is not None else "partial",
        provenance=Provenance(task_name=task, agent_name=agent, model=model),
        evaluation=single_reward(reward, failure),  # type: ignore[arg-type]
        usage=usage or Usage(),
    )


def matrix_records() -> list[TrialRecord]:
    return [
        rec(0, "alpha", "oracle", 1.0),
        rec(1, "alpha", "oracle", 1.0),
        rec(0, "alpha", "nop", 0.0),
        rec(1, "alpha", "nop", 0.0),
        rec(0, "beta", "oracle", 1.0),
        rec(1, "beta", "oracle", 0.0),
        rec(2, "beta", "oracle", None, "infrastructure"),
        rec(0, "beta", "nop", None, "verifier"),
        rec(0, "<script>x</script>", "oracle", 1.0),
    ]


def test_matrix_cells_name_their_outcome_with_a_symbol_and_words() -> None:
    report = build_report("exp", matrix_records(), None)
    m = charts.matrix(report)
    assert m["agents"] == ["oracle", "nop"]
    cells = {(r["task"], c["agent"]): c for r in m["rows"] for c in r["cells"]}
    assert cells[("alpha", "oracle")] == {
        "outcome": "passed",
        "symbol": "✓",
        "text": "2/2 passed",
        "extra": "",
        "agent": "oracle",
    }
    assert cells[("alpha", "nop")]["outcome"] == "failed"
    assert cells[("alpha", "nop")]["text"] == "0/2 passed"
    mixed = cells[("beta", "oracle")]
    assert (mixed["symbol"], mixed["text"], mixed["extra"]) == (
        "◐",
        "1/2 passed",
        "+1 unscored: 1 infrastructure",
    )
    unscored = cells[("beta", "nop")]
    assert (unscored["symbol"], unscored["text"]) == ("⊘", "unscored: 1 verifier")
    pending = cells[("<script>x</script>", "nop")]
    assert (pending["outcome"], pending["text"]) == ("pending", "no record yet")
    # Every outcome has its own symbol: never colour alone.
    assert len(set(charts.SYMBOLS.values())) == len(charts.SYMBOLS)


def test_cell_outcome_words_and_the_matrix_cap() -> None:
    assert cell_outcome(0, 0, 0) == "pending"
    assert cell_outcome(2, 0, 0) == "unscored"
    assert cell_outcome(3, 2, 2) == "passed"
    assert cell_outcome(2, 2, 0) == "failed"
    assert cell_outcome(2, 2, 1) == "mixed"
    report = build_report("exp", matrix_records(), None)
    capped = charts.matrix(report, max_tasks=2)
    assert len(capped["rows"]) == 2 and capped["hidden"] == 1
    assert charts.matrix(report)["hidden"] == 0


def priced(n: int, n_priced: int) -> list[TrialRecord]:
    return [
        rec(
            i,
            "alpha",
            "terminus",
            1.0,
            usage=Usage(
                n_input_tokens=100, n_output_tokens=10, cost_usd=0.042 if i < n_priced else None
            ),
            model="gpt-x",
        )
        for i in range(n)
    ]


def test_cost_and_tokens_per_agent_say_what_they_cover() -> None:
    board = build_report("exp", priced(12, 10), None)["leaderboard"]
    (usage,) = charts.usage_rows(board)
    assert usage["agent"] == "terminus@gpt-x"
    assert usage["cost"].startswith("$0.42 over 10 of 12 trials; 2 unknown")
    assert usage["n_input_tokens"].startswith("1,200 over 12 trials")
    assert usage["n_cache_tokens"] == "unknown (12 trials)"
    # Negative controls: every trial priced says so; oracle and nop have no usage table.
    (all_priced,) = charts.usage_rows(build_report("exp", priced(12, 12), None)["leaderboard"])
    assert "unknown" not in all_priced["cost"]
    assert charts.usage_rows(build_report("exp", matrix_records(), None)["leaderboard"]) == []


async def test_budget_on_the_page_is_the_status_line() -> None:
    ledger = InMemoryLedger()
    manifest = {"budget": {"max_cost_usd": 1.0, "max_tokens": 10000}}
    await ledger.upsert_experiment(ExperimentInfo("exp", "b", 12, manifest))
    await ledger.upsert_records(priced(12, 10))
    report = await queries.experiment_report(ledger, "exp")
    status = await queries.experiment_status(ledger, "exp")
    assert report["budget"]["line"] == status["budget"]
    assert report["budget"]["cost_usd"] == pytest.approx(0.42)
    meters = charts.budget_meters(report["budget"])
    assert [(m["what"], m["share"]) for m in meters] == [
        ("cost (USD)", "42%"),
        ("tokens (input + output)", "13%"),
    ]
    # Negative control: no budget, no line, no meter.
    await ledger.upsert_experiment(ExperimentInfo("exp", "b", 12, {}))
    report = await queries.experiment_report(ledger, "exp")
    assert report["budget"] is None and charts.budget_meters(None) == []


async def test_the_page_fragments_show_the_json_numbers_escaped() -> None:
    ledger = InMemoryLedger()
    await ledger.upsert_experiment(ExperimentInfo("exp", "m", 10, {}))
    records = matrix_records()
    await ledger.upsert_records(records)
    html = (await sections(ledger, "exp", records, {})).html()
    _, board = await queries.experiment_leaderboard(ledger, "exp")
    for r in board:
        cells = leaderboard_cells(r)
        assert f'data-label="Mean reward">{cells["mean"]}</td>' in html["leaderboard"]
        assert charts.bars_label(r) in html["leaderboard"]
    assert html["leaderboard"].count("<svg") == len(board)
    assert "&lt;script&gt;x&lt;/script&gt;" in html["matrix"]
    assert "<script>" not in html["matrix"]
    assert 'class="cell outcome-mixed"' in html["matrix"] and "1/2 passed" in html["matrix"]
    assert "No trial reports tokens or cost" in html["usage"]
