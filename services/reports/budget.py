"""An experiment's spend against its manifest's budget, as ``trialbus status`` shows it.

The figures are the ledger's: the recorded trials' tokens (input + output) and cost.
The runners enforce the budget on their own running total (services/runner/guards.py),
which also counts retried attempts, so it can be a little higher than the ledger's.
Unknown cost is never read as zero: trials without a price are counted and named.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from schemas.record import TrialRecord
from services.common.ports import ExperimentInfo


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
    budget = budget_of(info)
    if budget is None:
        return None
    # Trials that never ran (stopped, cancelled) used nothing: only those that report
    # usage can lack a price.
    used = [r for r in records if _used(r)]
    costs = [r.usage.cost_usd for r in used if r.usage.cost_usd is not None]
    unknown = len(used) - len(costs)
    out: dict[str, Any] = {
        "max_cost_usd": budget.get("max_cost_usd"),
        "cost_usd": math.fsum(costs) if costs or not unknown else None,
        "n_used": len(used),
        "n_cost_unknown": unknown,
        "max_tokens": budget.get("max_tokens"),
        "tokens": sum(
            (r.usage.n_input_tokens or 0) + (r.usage.n_output_tokens or 0) for r in records
        ),
        "reached": any(r.evaluation.exception_type == "BudgetExceeded" for r in records),
    }
    out["line"] = _line(out)
    return out


def spent_line(records: Sequence[TrialRecord], info: ExperimentInfo | None) -> str | None:
    """``$0.0600 of $0.05 USD (2 of 8 trials that used tokens have no price); 3600 of
    5000 tokens``.

    None when the manifest sets no budget.
    """
    usage = budget_usage(records, info)
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


def _used(record: TrialRecord) -> bool:
    usage = record.usage
    return any(v is not None for v in (usage.n_input_tokens, usage.n_output_tokens, usage.cost_usd))
