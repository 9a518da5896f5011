"""An experiment's running totals: what ``status`` shows, kept as sums over records.

A record's *tally* is a few named numbers (it is recorded, complete or partial,
scored or unscored by cause, what it spent); an experiment's tally is the sum over
its stored records. Sums can be kept up to date at write time (the ledger adds the new
record's tally and subtracts the replaced one's: ``Ledger.experiment_tally``), so
``trialbus status`` and the dashboard read one small document instead of every record.

The counts and the budget line are built from a tally by the same functions whether
it was summed from records (``tally_of``) or kept by the ledger, so the two cannot
disagree: ``services.reports.leaderboard.status_counts`` and
``services.reports.budget.budget_usage`` are these functions over ``tally_of``.
Counts are exact integers. ``cost_usd`` is a float sum: the ledger's running sum can
differ from ``math.fsum`` over the records in the last bits (about 1e-12 of a dollar
per record), far below the four decimals shown.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Final

from schemas.record import TrialRecord
from services.reports.scoring import scored_reward, unscored_cause

Tally = dict[str, float]
"""Name -> sum. A name absent is 0. Names are plain words (they are document fields)."""

UNSCORED_PREFIX: Final = "unscored_"
BUDGET_EXCEPTION: Final = "BudgetExceeded"


def record_tally(record: TrialRecord) -> Tally:
    """What one stored record adds to its experiment's tally.

    ``recorded``; ``complete`` or ``partial``; ``scored`` or ``unscored_<cause>``
    (``scoring.unscored_cause``); ``used`` when it reports any usage, ``cost_known``
    and ``cost_usd`` when it has a price, ``tokens`` (input + output),
    ``budget_exceeded`` when the budget stopped it (services/reports/budget.py).
    """
    usage = record.usage
    tally: Tally = {"recorded": 1, record.status: 1}
    if scored_reward(record) is not None:
        tally["scored"] = 1
    else:
        tally[UNSCORED_PREFIX + unscored_cause(record)] = 1
    if any(v is not None for v in (usage.n_input_tokens, usage.n_output_tokens, usage.cost_usd)):
        tally["used"] = 1
    if usage.cost_usd is not None:
        tally["cost_known"] = 1
        tally["cost_usd"] = usage.cost_usd
    tokens = (usage.n_input_tokens or 0) + (usage.n_output_tokens or 0)
    if tokens:
        tally["tokens"] = tokens
    if record.evaluation.exception_type == BUDGET_EXCEPTION:
        tally["budget_exceeded"] = 1
    return tally


def tally_of(records: Iterable[TrialRecord]) -> Tally:
    """The experiment's tally summed from its records (``cost_usd`` with ``math.fsum``)."""
    total: Tally = {}
    costs: list[float] = []
    for record in records:
        for name, value in record_tally(record).items():
            if name == "cost_usd":
                costs.append(value)
            else:
                total[name] = total.get(name, 0) + value
    if costs:
        total["cost_usd"] = math.fsum(costs)
    return total


def difference(new: Mapping[str, float], old: Mapping[str, float]) -> Tally:
    """``new - old`` per name, without the names whose difference is 0."""
    out: Tally = {}
    for name in set(new) | set(old):
        delta = new.get(name, 0) - old.get(name, 0)
        if delta:
            out[name] = delta
    return out


def count(tally: Mapping[str, float], name: str) -> int:
    """A count of the tally (0 when absent)."""
    return round(tally.get(name, 0))
