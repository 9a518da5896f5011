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


def spent_line(records: Sequence[TrialRecord], info: ExperimentInfo | None) -> str | None:
    """``$0.0600 of $0.05 USD (2 of 8 trials that used tokens have no price); 3600 of
    5000 tokens``.

    None when the manifest sets no budget.
    """
    budget = budget_of(info)
    if budget is None:
        return None
    parts: list[str] = []
    max_cost, max_tokens = budget.get("max_cost_usd"), budget.get("max_tokens")
    if max_cost is not None:
        # Trials that never ran (stopped, cancelled) used nothing: only those that
        # report usage can lack a price.
        used = [r for r in records if _used(r)]
        costs = [r.usage.cost_usd for r in used if r.usage.cost_usd is not None]
        unknown = len(used) - len(costs)
        line = (
            f"${math.fsum(costs):.4f} of ${max_cost:g} USD"
            if costs or not unknown
            else f"cost unknown of ${max_cost:g} USD"
        )
        if unknown:
            line += f" ({unknown} of {len(used)} trials that used tokens have no price)"
        parts.append(line)
    if max_tokens is not None:
        tokens = sum(
            (r.usage.n_input_tokens or 0) + (r.usage.n_output_tokens or 0) for r in records
        )
        parts.append(f"{tokens} of {max_tokens} tokens")
    spent = "; ".join(parts)
    reached = any(r.evaluation.exception_type == "BudgetExceeded" for r in records)
    return f"{spent}{' — reached: trials not started were stopped' if reached else ''}"


def _used(record: TrialRecord) -> bool:
    usage = record.usage
    return any(v is not None for v in (usage.n_input_tokens, usage.n_output_tokens, usage.cost_usd))
