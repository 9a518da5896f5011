"""Rich tables for the CLI, rendered from the JSON-ready report data (no arithmetic here)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Group, JustifyMethod, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from services.reports.formatting import (
    comparison_notes,
    comparison_rows,
    cost,
    num,
    shows_cost,
    too_few,
    total_cost,
    unscored,
    usage_cell,
    with_ci,
)
from services.reports.progress import duration


def _pass_at_k_brief(pass_at_k: dict[str, float]) -> str:
    if not pass_at_k:
        return "-"
    ks = sorted(int(k) for k in pass_at_k)
    shown = sorted({ks[0], ks[-1]})
    return ", ".join(f"@{k} {pass_at_k[str(k)]:.3f}" for k in shown)


def leaderboard_table(rows: Sequence[dict[str, Any]], title: str) -> Table:
    """The leaderboard: denominators, causes, estimates with 95% intervals, pass@k."""
    table = Table(title=title, caption="ranked by the lower bound of the mean reward's 95% CI")
    for col in (
        "#",
        "agent",
        "model",
        "scored / total",
        "unscored (cause)",
        "mean reward [95% CI]",
        "pass rate [95% CI]",
        "pass@k",
    ):
        table.add_column(col)
    with_cost = shows_cost(rows)
    if with_cost:
        table.add_column("cost")
    for i, r in enumerate(rows, 1):
        cells: list[str | Text] = [
            str(i),
            escape(r["agent"]),
            escape(r["model"] or "-"),
            f"{r['n_scored']} / {r['n_trials']}",
            unscored(r),
            _estimate(r, with_ci(r["mean_reward"], r.get("mean_reward_ci"))),
            _estimate(r, with_ci(r["pass_rate"], r.get("pass_rate_ci"), pct=True)),
            _pass_at_k_brief(r.get("pass_at_k") or {}),
        ]
        table.add_row(*cells, *([cost(r, "/scored")] if with_cost else []))
    return table


def trials_table(
    lines: Sequence[dict[str, Any]], title: str, every: Sequence[dict[str, Any]]
) -> Table:
    """An experiment's trials (``services.reports.trials``), one line each; the caption
    says how many of ``every`` line (running and recorded) the filters kept."""
    running = sum(1 for t in every if t["status"] == "running")
    caption = f"{len(lines)} of {len(every)} " + (
        f"trials: {len(every) - running} recorded, {running} running"
        if running
        else "recorded trials"
    )
    table = Table(title=title, caption=caption)
    for col in ("trial", "task", "agent", "rep", "status", "reward", "failure", "tries", "ran"):
        table.add_column(col)
    for t in lines:
        failure = t["failure_class"]
        if t["exception_type"]:
            failure = f"{failure} ({t['exception_type']})"
        table.add_row(
            escape(t["trial_id"]),
            escape(t["task"]),
            escape(t["agent"]),
            "-" if t["repetition"] is None else str(t["repetition"]),
            t["status"],
            _reward_cell(t),
            "-" if failure == "none" else escape(failure),
            str(t["attempts"]),
            f"{duration(t['seconds'])} on {escape(t['runner_host'] or '-')}",
        )
    return table


def _reward_cell(line: dict[str, Any]) -> str | Text:
    if line["scored"]:
        return num(line["reward"])
    return Text("-" if line["status"] == "running" else "unscored", style="dim")


def _estimate(row: dict[str, Any], text: str) -> str | Text:
    """An estimate's cell: as it is, or greyed with why when too few trials back it."""
    if not row.get("too_few"):
        return text
    if not row["n_scored"]:
        return Text(too_few(row), style="dim")
    return Text(f"{text}\n{too_few(row)}", style="dim")


def _per_agent_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[dict[str, Any]],
    cells: Callable[[dict[str, Any]], list[str]],
    justify: JustifyMethod = "left",
) -> Table:
    """One line per leaderboard row: agent, model, then ``cells(row)`` under ``columns``."""
    table = Table(title=title)
    table.add_column("agent")
    table.add_column("model")
    for col in columns:
        table.add_column(col, justify=justify)
    for r in rows:
        table.add_row(escape(r["agent"]), escape(r["model"] or "-"), *cells(r))
    return table


def pass_at_k_table(rows: Sequence[dict[str, Any]]) -> Table | None:
    """pass@k for every k (unbiased estimator, averaged over tasks)."""
    ks = sorted({int(k) for r in rows for k in r.get("pass_at_k") or {}})
    if not ks:
        return None

    def cells(r: dict[str, Any]) -> list[str]:
        pak = r.get("pass_at_k") or {}
        return [str(r["pass_at_k_tasks"]), *(num(pak.get(str(k))) for k in ks)]

    title = "pass@k (unbiased estimator, mean over tasks)"
    return _per_agent_table(title, ["tasks", *(f"@{k}" for k in ks)], rows, cells, "right")


def _key_estimate(est: dict[str, Any] | None) -> str:
    if est is None:
        return "-"
    if est["value"] is None:
        return f"none scored (n={est['n']})"
    few = ", too few" if est.get("too_few") else ""
    return f"{with_ci(est['value'], est['ci'])} (n={est['n']}{few})"


def reward_keys_table(rows: Sequence[dict[str, Any]]) -> Table | None:
    """Mean per reward key, shown when some row has several keys."""
    keys = sorted({k for r in rows for k in r.get("reward_keys") or {}})
    if len(keys) < 2:
        return None
    return _per_agent_table(
        "mean reward per key [95% CI] (n scored with the key)",
        keys,
        rows,
        lambda r: [_key_estimate((r.get("reward_keys") or {}).get(key)) for key in keys],
    )


_USAGE_FIELDS = ("cost_usd", "n_input_tokens", "n_cache_tokens", "n_output_tokens")


def usage_table(rows: Sequence[dict[str, Any]]) -> Table | None:
    """Tokens and cost per agent x model, each with the trials it covers."""
    reported = any(
        (u or {}).get("n_reported") for r in rows for u in (r.get("usage") or {}).values()
    )
    if not (reported or shows_cost(rows)):
        return None
    return _per_agent_table(
        "usage: sum over recorded trials that report it (mean per scored trial)",
        _USAGE_FIELDS,
        rows,
        lambda r: [usage_cell(f, (r.get("usage") or {}).get(f)) for f in _USAGE_FIELDS],
        "right",
    )


def task_table(report: dict[str, Any]) -> Table | None:
    """Per task x agent: passed / scored, and unscored trials."""
    tasks = report.get("tasks") or []
    if not tasks:
        return None
    table = Table(title="per task: passed / scored (+ unscored)")
    table.add_column("task")
    for row in report["leaderboard"]:
        table.add_column(escape(row["agent"] + (f" ({row['model']})" if row["model"] else "")))
    for t in tasks:
        cells = []
        for c in t["cells"]:
            text = f"{c['n_passed']}/{c['n_scored']}" if c["n_scored"] else "-"
            unscored = c["n_recorded"] - c["n_scored"]
            cells.append(text + (f" (+{unscored} unscored)" if unscored else ""))
        table.add_row(t["task"], *cells)
    return table


def failures_table(report: dict[str, Any]) -> Table | None:
    """Exceptions by failure class: counted as the agent's or left unscored."""
    failures = report.get("failures") or []
    if not failures:
        return None
    table = Table(title="failure causes")
    for col in ("class", "exception", "trials", "scored?", "by agent"):
        table.add_column(col)
    for f in failures:
        table.add_row(
            f["failure_class"],
            f["exception_type"],
            str(f["count"]),
            "yes (agent's fault)" if f["scored"] else "no",
            escape(", ".join(f"{a}: {n}" for a, n in f["by_agent"].items())),
        )
    return table


def report_renderable(report: dict[str, Any]) -> Group:
    """Everything ``trialbus report`` prints."""
    title = f"report: {report['experiment_id']}" + (
        f" ({escape(report['name'])})" if report.get("name") else ""
    )
    s = report["status"]
    parts: list[RenderableType] = [
        Text(
            f"{s['scored']} scored / {s['total']} trials; {s['unscored']} unscored, "
            f"{s['pending']} pending"
            + (f"; cost {total_cost(report)}" if shows_cost(report["leaderboard"]) else ""),
        ),
        leaderboard_table(report["leaderboard"], title),
    ]
    rows = report["leaderboard"]
    for extra in (
        pass_at_k_table(rows),
        reward_keys_table(rows),
        usage_table(rows),
        task_table(report),
        failures_table(report),
    ):
        if extra is not None:
            parts.append(extra)
    return Group(*parts)


def comparison_renderable(cmp: dict[str, Any]) -> Group:
    """Everything ``trialbus compare`` prints."""
    # The sides on lines of their own: as the table's title they wrapped to its width,
    # mid-name.
    sides = Text(f"A = {cmp['a']['label']}\nB = {cmp['b']['label']}")
    table = Table()
    for col in ("", "A", "B", "A - B [95% CI]"):
        table.add_column(col)
    for row in comparison_rows(cmp):
        table.add_row(row["name"], row["a"], row["b"], row["diff"])
    table.add_row("tasks compared", str(cmp["n_paired_tasks"]), "", "")
    lines = comparison_notes(cmp)
    lines.append(f"verdict: {cmp['verdict']}")
    return Group(sides, table, *(Text(line) for line in lines))
