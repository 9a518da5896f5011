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


def cost(row: dict[str, Any], per_scored: str = "") -> str:
    """``$1.23 ($0.041<per_scored>)``: total cost, and the mean per scored trial."""
    total = (row.get("usage") or {}).get("cost_usd")
    if not total:
        return "-"
    per = total["mean_per_scored"]
    return f"${total['sum']:.2f}" + (f" (${per:.3f}{per_scored})" if per is not None else "")
