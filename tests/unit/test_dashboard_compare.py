"""The compare page's view (services/submitter/dashboard_compare.py) from
``compare``'s JSON: the CLI's words and numbers, per-task differences and their bars
(read back from the SVG), links, and the page escaping hostile task and agent names."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import parse_qs, urlsplit

from services.reports.compare import Side, compare
from services.reports.formatting import with_ci
from services.submitter import dashboard_compare as view
from services.submitter.dashboard_views import PAGES
from tests.support.records import report_record, single_reward

EVIL_TASK = "<script>alert('t')</script>"
EVIL_AGENT = '<img src=x onerror="alert(1)">'


def cmp_json(b_rewards: list[float], agent_b: str = "beta", task0: str = "t0") -> dict[str, Any]:
    """A (alpha) passes 6 tasks; B's reward per task is ``b_rewards``."""
    tasks = [task0, *(f"t{i}" for i in range(1, len(b_rewards)))]
    a = [report_record(single_reward(1.0), task=t, agent="alpha") for t in tasks]
    b = [
        report_record(single_reward(r), task=t, agent=agent_b)
        for t, r in zip(tasks, b_rewards, strict=True)
    ]
    side_a, side_b = Side("exp", "alpha", None), Side("exp", agent_b, None)
    return compare(side_a, a, side_b, b).as_dict()


B_REWARDS = [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def bar_rect(svg: str) -> ET.Element:
    (rect,) = ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}rect")
    return rect


def test_summary_and_notes_are_the_cli_s_words_and_the_json_s_numbers() -> None:
    cmp = cmp_json(B_REWARDS)
    v = view.comparison_view(cmp)
    mean, rate = v["summary"]
    assert (mean["name"], mean["a"], mean["b"]) == ("mean reward", "1.000", "0.333")
    d = cmp["mean_reward"]
    assert mean["diff"] == with_ci(d["difference"], d["ci"]) and mean["diff"].startswith("0.667 [")
    assert rate["a"] == "100.0%" and rate["diff"].startswith("66.7% [")
    assert v["n_paired"] == 6 and v["verdict"] == cmp["verdict"]
    assert v["notes"][0] == "McNemar exact test: 4 tasks only A solved, 0 only B solved, p = 0.125"
    assert v["notes"][1] == "solved only by A: t2, t3, t4, t5"
    # Negative control: B solving one more task moves every figure.
    other = view.comparison_view(cmp_json([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]))
    assert other["summary"][0]["b"] == "0.500" and other["summary"][0]["diff"] != mean["diff"]
    assert "3 tasks only A solved" in other["notes"][0]


def test_per_task_differences_are_shown_and_drawn_where_they_are() -> None:
    rows = {r["task"]: r for r in view.comparison_view(cmp_json(B_REWARDS))["tasks"]}
    assert list(rows) == [f"t{i}" for i in range(6)]
    assert rows["t0"]["a"] == "1.000 (1/1 passed)" and rows["t2"]["b"] == "0.000 (0/1 passed)"
    assert (rows["t0"]["diff"], rows["t2"]["diff"]) == ("+0.000", "+1.000")
    assert (rows["t0"]["solved"], rows["t2"]["solved"]) == ("", "A only")
    full = bar_rect(str(rows["t2"]["bar"]))
    assert full.get("class") == "pos"
    assert float(full.get("x", "")) == view.DIFF_WIDTH / 2
    assert float(full.get("width", "")) == view.DIFF_WIDTH / 2 - 2  # +1 on a scale of 1
    assert float(bar_rect(str(rows["t0"]["bar"])).get("width", "")) == 0.0
    # Negative controls: B scoring higher draws left of the line; half the difference,
    # half the bar.
    neg = bar_rect(str(view.diff_bar(-0.5, 1.0, "x")))
    assert neg.get("class") == "neg"
    assert float(neg.get("x", "")) + float(neg.get("width", "")) == view.DIFF_WIDTH / 2
    assert float(neg.get("width", "")) == (view.DIFF_WIDTH / 2 - 2) / 2
    other = view.comparison_view(cmp_json([1.0, 1.0, 0.5, 0.0, 0.0, 0.0]))["tasks"][2]
    assert other["diff"] == "+0.500" and "A - B = +0.500" in str(other["bar"])


def test_links_carry_the_json_api_s_parameters() -> None:
    url = view.experiment_compare_url("exp 1", ["oracle", "nop@gpt-x", "third"])
    assert urlsplit(url).path == "/ui/compare"
    assert parse_qs(urlsplit(url).query) == {
        "a": ["exp 1"],
        "agent_a": ["oracle"],
        "agent_b": ["nop@gpt-x"],
    }
    # One agent: the form, prefilled with the experiment (nothing to pair it with).
    assert view.experiment_compare_url("exp", ["oracle"]) == "/ui/compare?a=exp"
    assert "%3Cscript%3E" in view.compare_url("e", "f", EVIL_TASK)


def render(**context: Any) -> str:
    base = {"form": {"a": "exp", "b": "", "agent_a": "", "agent_b": ""}, "back_url": None}
    base.update({"cmp": None, "error": None}, **context)
    return PAGES.get_template("compare.html").render(
        identity=None, data={}, title="Compare", **base
    )


def test_the_page_escapes_task_and_agent_names() -> None:
    page = render(cmp=view.comparison_view(cmp_json(B_REWARDS, EVIL_AGENT, EVIL_TASK)))
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(&#39;t&#39;)&lt;/script&gt;" in page  # the task, in its row
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt; @ exp" in page  # side B's label
    assert 'id="per-task"' in page and page.count('<svg class="diff"') == 6
    # The form keeps what was asked, escaped too; an error is shown instead of numbers.
    failed = render(
        form={"a": EVIL_TASK, "b": "", "agent_a": "", "agent_b": ""}, error=f"no {EVIL_TASK}"
    )
    assert "<script>alert" not in failed and 'id="compare-error"' in failed
    assert 'id="per-task"' not in failed
