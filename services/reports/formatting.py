"""How a report's numbers read, for every rendering (the CLI tables and the HTML page).

Text only, no markup: the HTML page escapes and wraps these strings, the tables print
them as they are, so a figure reads the same in both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def num(value: float | None, pct: bool = False) -> str:
    """A number as shown: 3 decimals, or a percentage; "-" for None."""
    if value is None:
        return "-"
    return f"{value:.1%}" if pct else f"{value:.3f}"


def agent_at(agent: str, model: str | None) -> str:
    """An agent as every report names it: ``agent@model``, or the agent alone."""
    return f"{agent}@{model}" if model else agent


def row_agent(row: dict[str, Any]) -> str:
    """A leaderboard row's (or matrix cell's) agent, as ``agent_at`` names it."""
    return agent_at(str(row["agent"]), row.get("model"))


def with_ci(value: float | None, ci: Sequence[float] | None, pct: bool = False) -> str:
    """``value [low, high]``; the value alone without an interval; "-" for None."""
    if value is None:
        return "-"
    if not ci:
        return num(value, pct)
    return f"{num(value, pct)} [{num(ci[0], pct)}, {num(ci[1], pct)}]"


def too_few(row: dict[str, Any], wording: str = "too few") -> str:
    """Why a leaderboard row shows no estimate: none scored, or fewer than the minimum."""
    if not row["n_scored"]:
        return "no scored trial"
    return f"{wording} ({row['n_scored']} < {row['min_scored']})"


def unscored(row: dict[str, Any], cause: Callable[[str], str] = str) -> str:
    """``3 verifier, 1 infrastructure; 2 pending`` ("-" when all are scored).

    ``cause`` renders a cause's name (the HTML page escapes it).
    """
    text = ", ".join(f"{n} {cause(c)}" for c, n in row["unscored_by_cause"].items()) or "-"
    if row["n_pending"]:
        text += f"; {row['n_pending']} pending"
    return text


def _trials(n: int) -> str:
    return f"{n} trial" + ("" if n == 1 else "s")


def covered(total: str, usage: dict[str, Any]) -> str:
    """``<total> over 10 of 12 trials; 2 unknown``: a sum and the trials it covers."""
    n, k = usage["n_recorded"], usage["n_reported"]
    if k == n:
        return f"{total} over {_trials(n)}"
    return f"{total} over {k} of {_trials(n)}; {n - k} unknown"


def cost(row: dict[str, Any], per_scored: str = "") -> str:
    """``$0.42 over 10 of 12 trials; 2 unknown ($0.041<per_scored>)``.

    The total says how many trials it covers; a cost no trial reported (no price for
    the model, or no usage from the agent) reads "unknown", never $0 or a blank. The
    mean per scored trial names its own coverage when some scored trials lack a cost.
    "-" only for a row with no recorded trial.
    """
    usage = (row.get("usage") or {}).get("cost_usd")
    if usage is None:
        n = row.get("n_recorded", 0)
        return f"unknown ({_trials(n)})" if n else "-"
    if usage["sum"] is None:
        return f"unknown ({_trials(usage['n_recorded'])})"
    text = covered(f"${usage['sum']:.2f}", usage)
    per = usage["mean_per_scored"]
    if per is not None:
        k, n = usage["n_scored_reported"], usage["n_scored"]
        part = "" if k == n else f", {k} of {n} scored priced"
        text += f" (${per:.3f}{per_scored}{part})"
    return text


def usage_cell(name: str, usage: dict[str, Any] | None) -> str:
    """A usage figure with its coverage: ``12,345 over 10 of 12 trials; 2 unknown``."""
    if usage is None:
        return "-"
    if usage["sum"] is None:
        return f"unknown ({_trials(usage['n_recorded'])})"
    fmt = "${:,.4f}" if name == "cost_usd" else "{:,.0f}"
    text = covered(fmt.format(usage["sum"]), usage)
    mean = usage["mean_per_scored"]
    return text + (f" ({fmt.format(mean)})" if mean is not None else "")


def shows_cost(rows: Sequence[dict[str, Any]]) -> bool:
    """Whether a table of these rows has a cost column: some trial reported a cost, or
    some row names a model (an LLM agent, whose cost a reader expects: shown as
    "unknown" rather than hidden). Oracle/nop-only tables stay without one."""
    return any(
        r.get("model") or ((r.get("usage") or {}).get("cost_usd") or {}).get("n_reported")
        for r in rows
    )


def total_cost(report: dict[str, Any]) -> str:
    """The experiment's cost over every recorded trial, with its coverage."""
    usage = (report.get("usage") or {}).get("cost_usd")
    if usage is None:
        return "unknown (no trial recorded)"
    return cost({"usage": {"cost_usd": usage}, "n_recorded": usage["n_recorded"]}, "/scored")


def comparison_rows(cmp: dict[str, Any]) -> list[dict[str, str]]:
    """A comparison's mean reward and pass rate: A, B and the mean of the per-task
    differences A - B with its 95% interval ("-" when too few tasks), as ``trialbus
    compare``'s table and the dashboard's compare page show them."""
    rows = []
    for name, key, pct in (("mean reward", "mean_reward", False), ("pass rate", "pass_rate", True)):
        d = cmp.get(key)
        if d is None:
            continue
        diff = "-" if d["difference"] is None else with_ci(d["difference"], d["ci"], pct)
        rows.append({"name": name, "a": num(d["a"], pct), "b": num(d["b"], pct), "diff": diff})
    return rows


def comparison_notes(cmp: dict[str, Any]) -> list[str]:
    """McNemar's test and the tasks one side alone solved or scored, as lines (the
    CLI's compare table and the dashboard's compare page print the same ones)."""
    lines = []
    if cmp.get("mcnemar"):
        m = cmp["mcnemar"]
        lines.append(
            f"McNemar exact test: {m['only_a']} tasks only A solved, {m['only_b']} only B "
            f"solved, p = {m['p_value']:.3g}"
        )
    for side, key in (("A", "solved_only_by_a"), ("B", "solved_only_by_b")):
        if cmp[key]:
            lines.append(f"solved only by {side}: {', '.join(cmp[key])}")
    for side, key in (("A", "tasks_only_a_scored"), ("B", "tasks_only_b_scored")):
        if cmp[key]:
            lines.append(f"scored only by {side} (not compared): {', '.join(cmp[key])}")
    return lines
