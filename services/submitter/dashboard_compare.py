"""The compare page's view: ``queries.comparison``'s JSON (``trialbus compare --json``,
``GET /compare``) as text rows and a per-task difference figure. Pure.

Every number is one of the JSON's, worded as ``trialbus compare`` prints it
(services.reports.formatting); the only arithmetic is a task's difference A - B of
the two mean rewards the JSON gives for it, and placing it on the figure's scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final
from urllib.parse import urlencode

from markupsafe import Markup, escape

from services.reports.formatting import comparison_notes, comparison_rows, num

DIFF_WIDTH: Final = 160
_HALF, _HEIGHT = DIFF_WIDTH / 2, 14


def compare_url(
    a: str, b: str | None = None, agent_a: str | None = None, agent_b: str | None = None
) -> str:
    """The compare page's path with its query (the JSON API's ``/compare`` parameters)."""
    params = {"a": a, "b": b, "agent_a": agent_a, "agent_b": agent_b}
    return "/ui/compare?" + urlencode({k: v for k, v in params.items() if v})


def experiment_compare_url(experiment_id: str, agents: Sequence[str]) -> str:
    """The experiment page's link: its first two leaderboard rows (``AGENT@MODEL``)
    compared, or the form prefilled with the experiment when it has one agent."""
    if len(agents) >= 2:
        return compare_url(experiment_id, None, agents[0], agents[1])
    return compare_url(experiment_id)


def _side(score: dict[str, Any]) -> str:
    return f"{num(score['mean_reward'])} ({score['n_passed']}/{score['n_scored']} passed)"


def diff_bar(diff: float, scale: float, label: str) -> Markup:
    """One task's difference as a bar from the middle line: right (class ``pos``) when A
    scored higher, left (``neg``) when B did, none at 0; ``scale`` is the largest
    difference drawn at full half-width."""
    width = abs(diff) / scale * (_HALF - 2) if scale else 0.0
    x = _HALF if diff >= 0 else _HALF - width
    kind = "pos" if diff > 0 else "neg" if diff < 0 else "zero"
    return Markup(
        f'<svg class="diff" xmlns="http://www.w3.org/2000/svg" width="{DIFF_WIDTH}" '
        f'height="{_HEIGHT}" viewBox="0 0 {DIFF_WIDTH} {_HEIGHT}" role="img" '
        f'aria-label="{escape(label)}"><title>{escape(label)}</title>'
        f'<rect class="{kind}" x="{x:.1f}" y="2" width="{width:.1f}" height="{_HEIGHT - 4}"/>'
        f'<line class="axis" x1="{_HALF}" x2="{_HALF}" y1="0" y2="{_HEIGHT}"/></svg>'
    )


def task_rows(cmp: dict[str, Any]) -> list[dict[str, Any]]:
    """Per task both sides scored: A's and B's mean reward (passed / scored), the
    difference A - B with its bar (on a scale of at least 1: rewards in [0, 1] keep
    their size across pages), and which side alone solved it."""
    diffs = [t["a"]["mean_reward"] - t["b"]["mean_reward"] for t in cmp["per_task"]]
    scale = max([1.0, *(abs(d) for d in diffs)])
    only_a, only_b = set(cmp["solved_only_by_a"]), set(cmp["solved_only_by_b"])
    rows = []
    for t, d in zip(cmp["per_task"], diffs, strict=True):
        label = f"{t['task']}: A - B = {d:+.3f}"
        solved = "A only" if t["task"] in only_a else "B only" if t["task"] in only_b else ""
        rows.append(
            {
                "task": t["task"],
                "a": _side(t["a"]),
                "b": _side(t["b"]),
                "diff": f"{d:+.3f}",
                "bar": diff_bar(d, scale, label),
                "solved": solved,
            }
        )
    return rows


def comparison_view(cmp: dict[str, Any]) -> dict[str, Any]:
    """The compare page's context from ``queries.comparison``'s JSON."""
    return {
        "a_label": cmp["a"]["label"],
        "b_label": cmp["b"]["label"],
        "summary": comparison_rows(cmp),
        "n_paired": cmp["n_paired_tasks"],
        "notes": comparison_notes(cmp),
        "verdict": cmp["verdict"],
        "tasks": task_rows(cmp),
    }
