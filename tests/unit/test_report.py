"""The full report (services.reports.report) and its renderings: rich tables and HTML."""

from __future__ import annotations

import json
import re

import pytest
from rich.console import Console

from schemas.record import FailureClass, TrialRecord, Usage
from services.common.adapters.memory import InMemoryLedger
from services.common.errors import UserInputError
from services.common.ports import ExperimentInfo
from services.reports.compare import Side, compare
from services.reports.html import heat_colour, render_html
from services.reports.queries import comparison, experiment_report
from services.reports.report import build_report
from services.reports.tables import comparison_renderable, report_renderable
from tests.support.records import report_record, single_reward


def rec(
    task: str,
    agent: str,
    reward: float | None,
    failure: FailureClass = "none",
    exception: str | None = None,
) -> TrialRecord:
    return report_record(single_reward(reward, failure, exception), task=task, agent=agent)


def demo_records() -> list[TrialRecord]:
    """The example experiment's shape: 4 tasks x 2 agents x 3, one broken verifier."""
    out = []
    for agent, reward in (("oracle", 1.0), ("nop", 0.0)):
        for task in ("hello-file", "count-words", "multi-metric"):
            out += [rec(task, agent, reward) for _ in range(3)]
        out += [
            rec("broken-verifier", agent, None, "verifier", "RewardFileNotFoundError")
            for _ in range(3)
        ]
    out.append(rec("hello-file", "nop", 0.0, "agent", "AgentTimeoutError"))
    return out


INFO = ExperimentInfo("exp", "examples-demo", 26, {"agents": [{"name": "oracle"}, {"name": "nop"}]})


def test_report_holds_leaderboard_tasks_failures_and_rules() -> None:
    report = build_report("exp", demo_records(), INFO)
    json.dumps(report)  # JSON-ready as it is
    assert [r["agent"] for r in report["leaderboard"]] == ["oracle", "nop"]
    oracle = report["leaderboard"][0]
    assert (oracle["n_scored"], oracle["n_trials"], oracle["mean_reward"]) == (9, 13, 1.0)
    assert oracle["n_pending"] == 1 and oracle["unscored_by_cause"] == {"verifier": 3}
    assert report["status"]["pending"] == 1 and report["scoring"]["min_scored"] == 5
    assert [t["task"] for t in report["tasks"]] == [
        "broken-verifier",
        "count-words",
        "hello-file",
        "multi-metric",
    ]
    broken = report["tasks"][0]["cells"][0]
    assert (broken["n_recorded"], broken["n_scored"], broken["pass_rate"]) == (3, 0, None)
    hello_nop = report["tasks"][2]["cells"][1]
    assert (hello_nop["n_scored"], hello_nop["n_passed"], hello_nop["too_few"]) == (4, 0, True)
    assert report["failures"] == [
        {
            "failure_class": "verifier",
            "exception_type": "RewardFileNotFoundError",
            "scored": False,
            "count": 6,
            "by_agent": {"nop": 3, "oracle": 3},
        },
        {
            "failure_class": "agent",
            "exception_type": "AgentTimeoutError",
            "scored": True,
            "count": 1,
            "by_agent": {"nop": 1},
        },
    ]


def test_html_is_self_contained_and_escapes_names() -> None:
    records = [*demo_records(), rec("t<script>", "<img src=x onerror=alert(1)>", 1.0)]
    page = render_html(build_report("exp", records, INFO))
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page and "<img" not in page and "<link" not in page
    # The only URL is the SVG namespace: nothing is fetched.
    assert set(re.findall(r"https?://[^\"' )]+", page)) == {"http://www.w3.org/2000/svg"}
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "<svg" in page and "1.000 [0.701, 1.000]" in page
    assert "too few scored (1 &lt; 5)" in page  # the injected row has one trial
    assert "RewardFileNotFoundError" in page


def test_heat_colours_span_light_to_dark() -> None:
    assert heat_colour(0.0) == ("#f7fbff", "#1b1f24")
    assert heat_colour(1.0) == ("#08306b", "#ffffff")


def test_cli_tables_render_every_section() -> None:
    console = Console(record=True, width=220)
    console.print(report_renderable(build_report("exp", demo_records(), INFO)))
    text = console.export_text()
    for expected in (
        "9 / 13",
        "1.000 [0.701, 1.000]",
        "100.0% [70.1%, 100.0%]",
        "pass@k",
        "3 verifier; 1 pending",
        "failure causes",
        "yes (agent's fault)",
    ):
        assert expected in text, expected


def test_cli_tables_show_names_as_written_not_as_rich_markup() -> None:
    # A label or model may hold '[...]', which the console reads as a style tag.
    label, model = "mine [v2]", "openai/[bold]gpt"
    odd = [
        report_record(single_reward(1.0), task=t, agent="a", label=label, model=model)
        for t in ("hello-file", "count-words")
    ]
    info = ExperimentInfo("exp", "sweep [draft]", 2, {})
    console = Console(record=True, width=300)
    console.print(report_renderable(build_report("exp", odd, info)))
    text = console.export_text()
    assert label in text and model in text and "report: exp (sweep [draft])" in text
    assert f"{label} ({model})" in text  # the per-task table's column


def test_comparison_renders_its_verdict() -> None:
    records = demo_records()
    cmp = compare(
        Side("exp", "oracle", None),
        [r for r in records if r.provenance.agent_name == "oracle"],
        Side("exp", "nop", None),
        [r for r in records if r.provenance.agent_name == "nop"],
    ).as_dict()
    assert cmp["a"]["label"] == "oracle @ exp"
    console = Console(record=True, width=200)
    console.print(comparison_renderable(cmp))
    text = console.export_text()
    assert "verdict: too few tasks scored by both sides (3 < 5)" in text
    assert "solved only by A: count-words, hello-file, multi-metric" in text
    # Each side on a line of its own, whole: as the narrow table's title, a long
    # experiment id wrapped in the middle of a name.
    long_id = "an-experiment-with-a-rather-long-name-0123456789"
    cmp["a"]["label"], cmp["b"]["label"] = f"oracle @ {long_id}", f"nop @ {long_id}"
    console = Console(record=True, width=200)
    console.print(comparison_renderable(cmp))
    lines = console.export_text().splitlines()
    assert lines[:2] == [f"A = oracle @ {long_id}", f"B = nop @ {long_id}"]


# -- through the Ledger port (what the CLI and the HTTP API call) ------------------------------


async def test_queries_build_reports_and_comparisons_from_a_ledger() -> None:
    ledger = InMemoryLedger()
    await ledger.upsert_records(demo_records())
    await ledger.upsert_experiment(INFO)
    report = await experiment_report(ledger, None)  # None: the latest experiment
    assert report == build_report("exp", await ledger.records_for("exp"), INFO)
    cmp = await comparison(ledger, "exp", None, "oracle", "nop")
    assert (cmp["a"]["agent"], cmp["b"]["agent"], cmp["n_paired_tasks"]) == ("oracle", "nop", 3)
    with pytest.raises(UserInputError, match="needs both agents"):
        await comparison(ledger, "exp", None, "oracle", None)
    with pytest.raises(UserInputError, match="both sides are oracle @ exp"):
        await comparison(ledger, "exp", None, "oracle", "oracle")
    with pytest.raises(UserInputError, match="no experiment 'nope'"):
        await experiment_report(ledger, "nope")


def test_html_shows_cost_only_where_harbor_reported_it() -> None:
    plain = render_html(build_report("exp", demo_records(), INFO))
    assert "cost (per scored trial)" not in plain
    paid = [r.model_copy(update={"usage": Usage(cost_usd=0.5)}) for r in demo_records()]
    page = render_html(build_report("exp", paid, INFO))
    assert "cost (per scored trial)" in page and "$6.50 over 13 trials ($0.500)" in page
