"""The experiment page's figures: error bars, the task x agent matrix, cost and budget.

Pure: the report's JSON (``services.reports.report.build_report``, as served by
``GET /experiments/{id}/report``) in, text and inline SVG out. No arithmetic beyond
placing numbers on a scale and counting them: every figure's words come from
``services.reports.formatting``, as the CLI's tables do, so a bar's label, a cell's
count and a cost read as ``trialbus report`` prints them.

The SVG is server-rendered and styled by classes from dashboard.css (the page's CSP
allows no inline style), so the figures need no JavaScript. Nothing is told by colour
alone: the markers differ in shape (circle: mean reward, square: pass rate) and each
matrix cell carries a symbol and words (Okabe-Ito palette besides).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from markupsafe import Markup, escape

from services.reports import formatting
from services.reports.formatting import row_agent

BAR_WIDTH: Final = 220
_PAD, _MEAN_Y, _RATE_Y, _AXIS_Y, _HEIGHT = 10, 9, 21, 30, 34
MATRIX_TASKS_MAX: Final = 200
"""Tasks shown in the matrix (by name); ``trialbus report`` lists every one."""
SYMBOLS: Final = {
    "passed": "✓",
    "failed": "✗",
    "mixed": "◐",
    "unscored": "⊘",
    "pending": "…",
}
"""Each matrix outcome's symbol (services.reports.report.cell_outcome's words)."""
TOKEN_FIELDS: Final = (
    ("n_input_tokens", "input tokens"),
    ("n_cache_tokens", "cache tokens"),
    ("n_output_tokens", "output tokens"),
)


def mean_scale(rows: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """The mean rewards' axis, shared by every row: [0, 1], widened to hold every
    interval (rewards need not lie in [0, 1])."""
    ends = [v for r in rows if r.get("mean_reward_ci") for v in r["mean_reward_ci"]]
    ends += [r["mean_reward"] for r in rows if r.get("mean_reward") is not None]
    lo, hi = min([0.0, *ends]), max([1.0, *ends])
    return (lo, hi if hi > lo else lo + 1.0)


def _x(value: float, scale: tuple[float, float]) -> float:
    lo, hi = scale
    return _PAD + (value - lo) / (hi - lo) * (BAR_WIDTH - 2 * _PAD)


def _bar(
    kind: str, y: int, value: float, ci: Sequence[float] | None, scale: tuple[float, float]
) -> str:
    parts = []
    if ci:
        x0, x1 = _x(ci[0], scale), _x(ci[1], scale)
        parts.append(
            f'<line class="ci {kind}" x1="{x0:.1f}" x2="{x1:.1f}" y1="{y}" y2="{y}"/>'
            f'<line class="cap {kind}" x1="{x0:.1f}" x2="{x0:.1f}" y1="{y - 4}" y2="{y + 4}"/>'
            f'<line class="cap {kind}" x1="{x1:.1f}" x2="{x1:.1f}" y1="{y - 4}" y2="{y + 4}"/>'
        )
    x = _x(value, scale)
    if kind == "mean":
        parts.append(f'<circle class="point mean" cx="{x:.1f}" cy="{y}" r="4"/>')
    else:
        parts.append(
            f'<rect class="point rate" x="{x - 3.5:.1f}" y="{y - 3.5}" width="7" height="7"/>'
        )
    return "".join(parts)


def bars_label(row: dict[str, Any]) -> str:
    """What a row's error bars show, in the leaderboard's words."""
    mean = formatting.with_ci(row["mean_reward"], row.get("mean_reward_ci"))
    rate = formatting.with_ci(row["pass_rate"], row.get("pass_rate_ci"), pct=True)
    return f"mean reward {mean}; pass rate {rate}"


def error_bars(row: dict[str, Any], scale: tuple[float, float]) -> Markup:
    """A leaderboard row's 95% intervals as error bars: the mean reward (circle) on
    ``scale``, the pass rate (square) on [0, 1] drawn along the same axis when
    ``scale`` is [0, 1]. Greyed (class ``too-few``) below the minimum scored trials;
    empty for a row with no scored trial (it has no estimate)."""
    if row.get("mean_reward") is None:
        return Markup("")
    label = bars_label(row)
    few = " too-few" if row.get("too_few") else ""
    axis = "".join(
        f'<line class="tick" x1="{_x(t, scale):.1f}" x2="{_x(t, scale):.1f}" '
        f'y1="{_AXIS_Y - 3}" y2="{_AXIS_Y + 3}"/>'
        for t in (scale[0], (scale[0] + scale[1]) / 2, scale[1])
    )
    rate = ""
    if row.get("pass_rate") is not None:
        rate = _bar("rate", _RATE_Y, row["pass_rate"], row.get("pass_rate_ci"), (0.0, 1.0))
    return Markup(
        f'<svg class="bars{few}" xmlns="http://www.w3.org/2000/svg" width="{BAR_WIDTH}" '
        f'height="{_HEIGHT}" viewBox="0 0 {BAR_WIDTH} {_HEIGHT}" role="img" '
        f'aria-label="{escape(label)}"><title>{escape(label)}</title>'
        f'<line class="axis" x1="{_PAD}" x2="{BAR_WIDTH - _PAD}" y1="{_AXIS_Y}" y2="{_AXIS_Y}"/>'
        f"{axis}"
        f"{_bar('mean', _MEAN_Y, row['mean_reward'], row.get('mean_reward_ci'), scale)}"
        f"{rate}</svg>"
    )


def bars_legend(scale: tuple[float, float]) -> str:
    """The bars' key: shapes and the axis (the pass rate's own when it differs)."""
    axis = f"{formatting.num(scale[0])} to {formatting.num(scale[1])}"
    text = f"Error bars: 95% intervals, axis {axis}; ● mean reward, ■ pass rate"
    if scale != (0.0, 1.0):
        text += " (on its own axis, 0% to 100%)"
    return text + "; greyed: too few scored trials."


def matrix_cell(cell: dict[str, Any]) -> dict[str, str]:
    """One task x agent cell: its outcome, symbol and words (``2/3 passed``, ``unscored:
    2 infrastructure``, ``+1 unscored: verifier``)."""
    outcome = cell["outcome"]
    causes = ", ".join(f"{n} {c}" for c, n in cell["unscored_by_cause"].items())
    if outcome in ("passed", "failed", "mixed"):
        text = f"{cell['n_passed']}/{cell['n_scored']} passed"
        extra = f"+{cell['n_recorded'] - cell['n_scored']} unscored: {causes}" if causes else ""
    elif outcome == "unscored":
        text, extra = f"unscored: {causes}", ""
    else:
        text, extra = "no record yet", ""
    return {"outcome": outcome, "symbol": SYMBOLS[outcome], "text": text, "extra": extra}


def matrix(report: dict[str, Any], max_tasks: int = MATRIX_TASKS_MAX) -> dict[str, Any]:
    """The task x agent matrix: ``agents`` (the leaderboard's order), ``rows`` (a task
    and its cells, the first ``max_tasks`` tasks by name) and ``hidden`` (tasks left out)."""
    tasks = report["tasks"]
    rows = [
        {
            "task": t["task"],
            "cells": [{**matrix_cell(c), "agent": row_agent(c)} for c in t["cells"]],
        }
        for t in tasks[:max_tasks]
    ]
    return {
        "agents": [row_agent(r) for r in report["leaderboard"]],
        "rows": rows,
        "hidden": max(0, len(tasks) - max_tasks),
    }


def usage_rows(board: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """Cost and tokens per agent, each with the trials it covers (as ``trialbus report``):
    ``$0.42 over 10 of 12 trials; 2 unknown ($0.041/scored)``. Empty when no trial
    reports usage and no agent names a model (oracle and nop cost nothing)."""
    reported = any(
        (u or {}).get("n_reported") for r in board for u in (r.get("usage") or {}).values()
    )
    if not (reported or formatting.shows_cost(board)):
        return []
    return [
        {
            "agent": row_agent(r),
            "cost": formatting.cost(r, "/scored"),
            **{
                name: formatting.usage_cell(name, (r.get("usage") or {}).get(name))
                for name, _ in TOKEN_FIELDS
            },
        }
        for r in board
    ]


def budget_meters(budget: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The budget's limits against the spend, for ``<meter>`` elements: label, value,
    max, and the share as text; a limit whose spend is unknown has no value."""
    if budget is None:
        return []
    meters = []
    for what, spent, limit in (
        ("cost (USD)", budget["cost_usd"], budget["max_cost_usd"]),
        ("tokens (input + output)", budget["tokens"], budget["max_tokens"]),
    ):
        if limit is None:
            continue
        share = "unknown" if spent is None else f"{spent / limit:.0%}" if limit else "-"
        meters.append({"what": what, "value": spent, "max": limit, "share": share})
    return meters


def unscored_causes(board: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Unscored trials by cause per agent (the leaderboard's ``unscored_by_cause``):
    ``causes`` (the columns, every cause some agent has, sorted) and ``rows`` (per
    agent: a count per cause, the unscored total, the pending trials, the recorded
    trials). Counts, as ``trialbus leaderboard`` prints them in its Unscored column."""
    causes = sorted({c for r in board for c in r["unscored_by_cause"]})
    rows = [
        {
            "agent": row_agent(r),
            "counts": [r["unscored_by_cause"].get(c, 0) for c in causes],
            "unscored": sum(r["unscored_by_cause"].values()),
            "pending": r["n_pending"],
            "recorded": r["n_recorded"],
        }
        for r in board
    ]
    return {"causes": causes, "rows": rows, "any": any(r["unscored"] for r in rows)}


def pass_at_k(board: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """pass@k per agent, as ``trialbus report``'s pass@k table: ``ks`` (every k some
    agent has), and per agent the tasks it is averaged over and each k's value (3
    decimals, "-" where the agent has no such k: too few scored trials, or fewer
    attempts per task than k)."""
    ks = sorted({int(k) for r in board for k in r.get("pass_at_k") or {}})
    rows = [
        {
            "agent": row_agent(r),
            "tasks": r["pass_at_k_tasks"],
            "values": [formatting.num((r.get("pass_at_k") or {}).get(str(k))) for k in ks],
            "note": formatting.too_few(r) if r.get("too_few") else "",
        }
        for r in board
    ]
    return {"ks": ks, "rows": rows}
