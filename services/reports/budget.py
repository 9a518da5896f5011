"""An experiment's spend against its manifest's budget, as ``trialbus status`` shows it.

The figures are the ledger's: the recorded trials' tokens (input + output) and cost.
The runners enforce the budget on their own running total (services/runner/guards.py),
which also counts retried attempts, so it can be a little higher than the ledger's.
Unknown cost is never read as zero: trials without a price are counted and named.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from schemas.record import TrialRecord
from services.common.ports import ExperimentInfo
from services.reports.tally import count, tally_of


def budget_of(info: ExperimentInfo | None) -> dict[str, Any] | None:
    """The manifest's budget section, or None when it sets none."""
    if info is None:
        return None
    budget = info.manifest.get("budget")
    return budget if isinstance(budget, dict) and budget else None


def budget_usage(
    records: Sequence[TrialRecord], info: ExperimentInfo | None
) -> dict[str, Any] | None:
    """The manifest's budget against the recorded trials' spend, as JSON; None when the
    manifest sets no budget.

    ``max_cost_usd``/``max_tokens``: the limits (None when not set); ``cost_usd``: the sum
    of the known costs (None when no trial that used tokens has a price);
    ``n_used``: trials that report usage; ``n_cost_unknown``: those of them without a
    price; ``tokens``: input + output tokens; ``reached``: some trial was stopped by
    the budget; ``line``: all of it in words (``spent_line``).
    """
    return budget_of_tally(tally_of(records), info)


def budget_of_tally(
    tally: Mapping[str, float], info: ExperimentInfo | None
) -> dict[str, Any] | None:
    """``budget_usage`` from an experiment's tally (``services.reports.tally``)."""
    budget = budget_of(info)
    if budget is None:
        return None
    # Trials that never ran (stopped, cancelled) used nothing: only those that report
    # usage can lack a price.
    used, known = count(tally, "used"), count(tally, "cost_known")
    unknown = used - known
    out: dict[str, Any] = {
        "max_cost_usd": budget.get("max_cost_usd"),
        "cost_usd": float(tally.get("cost_usd", 0.0)) if known or not unknown else None,
        "n_used": used,
        "n_cost_unknown": unknown,
        "max_tokens": budget.get("max_tokens"),
        "tokens": count(tally, "tokens"),
        "reached": count(tally, "budget_exceeded") > 0,
    }
    out["line"] = _line(out)
    return out


def spent_line(records: Sequence[TrialRecord], info: ExperimentInfo | None) -> str | None:
    """``$0.0600 of $0.05 USD (2 of 8 trials that used tokens have no price); 3600 of
    5000 tokens``.

    None when the manifest sets no budget.
    """
    return spent_line_of_tally(tally_of(records), info)


def spent_line_of_tally(tally: Mapping[str, float], info: ExperimentInfo | None) -> str | None:
    """``spent_line`` from an experiment's tally."""
    usage = budget_of_tally(tally, info)
    return None if usage is None else str(usage["line"])


def _line(usage: dict[str, Any]) -> str:
    parts: list[str] = []
    max_cost, max_tokens = usage["max_cost_usd"], usage["max_tokens"]
    if max_cost is not None:
        line = (
            f"${usage['cost_usd']:.4f} of ${max_cost:g} USD"
            if usage["cost_usd"] is not None
            else f"cost unknown of ${max_cost:g} USD"
        )
        if unknown := usage["n_cost_unknown"]:
            line += f" ({unknown} of {usage['n_used']} trials that used tokens have no price)"
        parts.append(line)
    if max_tokens is not None:
        parts.append(f"{usage['tokens']} of {max_tokens} tokens")
    spent = "; ".join(parts)
    reached = " — reached: trials not started were stopped" if usage["reached"] else ""
    return f"{spent}{reached}"
