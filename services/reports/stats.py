"""The statistics behind every score trialbus shows. Pure functions, no I/O.

Each function is the textbook method, named and referenced (docs/scoring.md):

- ``wilson_interval``: the Wilson score interval for a binomial proportion
  (Wilson 1927; Newcombe 1998, method 3: no continuity correction).
- ``bootstrap_mean_interval``: the percentile bootstrap interval of a mean (Efron &
  Tibshirani 1993, ch. 13), from a seeded generator so the same data always gives the
  same interval.
- ``pass_at_k_task`` / ``pass_at_k``: the unbiased pass@k estimator of Chen et al.
  (2021, "Evaluating Large Language Models Trained on Code", eq. 1), averaged over tasks.
- ``paired_bootstrap_difference``: the mean of paired differences with a bootstrap
  interval that resamples the pairs (tasks).
- ``mcnemar_exact``: McNemar's exact (binomial) test on discordant pairs, two-sided.

Sums use ``math.fsum`` (correctly rounded, hence independent of order), so a mean of
the same multiset of values is the same float whatever the order: resampled means can
equal the point estimate exactly, and negating every difference negates every result.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import Final

CONFIDENCE: Final = 0.95
"""Coverage of every interval trialbus reports."""

BOOTSTRAP_RESAMPLES: Final = 2000
"""Resamples per bootstrap interval (Monte Carlo error of a 95% bound ~ 0.005 x spread)."""

BOOTSTRAP_SEED: Final = 20250101
"""Default seed: the same data always gives the same interval."""


@dataclass(frozen=True, slots=True)
class Interval:
    """A closed interval [low, high] with the method that produced it."""

    low: float
    high: float
    method: str

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies in the interval (bounds included)."""
        return self.low <= value <= self.high

    def spans_zero(self) -> bool:
        """Whether 0 lies in the interval: no detectable difference from zero."""
        return self.contains(0.0)

    def as_list(self) -> list[float]:
        """``[low, high]`` (the JSON form)."""
        return [self.low, self.high]


def z_value(confidence: float = CONFIDENCE) -> float:
    """The two-sided standard normal quantile (1.959964 for 95%)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean, correctly rounded (order-independent). Needs one value at least."""
    if not values:
        raise ValueError("the mean of no values is undefined")
    # The division can round past the data in the subnormal range: keep it inside.
    return min(max(math.fsum(values) / len(values), min(values)), max(values))


def wilson_interval(successes: int, n: int, confidence: float = CONFIDENCE) -> Interval | None:
    """Wilson score interval of a proportion ``successes / n``; None when ``n == 0``.

    Unlike the normal ("Wald") interval it never leaves [0, 1] and does not collapse
    to a point at 0/n or n/n.
    """
    if n < 0 or not 0 <= successes <= max(n, 0):
        raise ValueError(f"need 0 <= successes <= n, got {successes}/{n}")
    if n == 0:
        return None
    z = z_value(confidence)
    p = successes / n
    z2n = z * z / n
    centre = (p + z2n / 2.0) / (1.0 + z2n)
    half = z / (1.0 + z2n) * math.sqrt(p * (1.0 - p) / n + z2n / (4.0 * n))
    # The exact bounds at 0/n and n/n are 0 and 1; rounding must not move them.
    low = 0.0 if successes == 0 else max(0.0, min(p, centre - half))
    high = 1.0 if successes == n else min(1.0, max(p, centre + half))
    return Interval(low, high, "wilson")


def _percentile_bounds(sorted_values: Sequence[float], confidence: float) -> tuple[float, float]:
    # Symmetric order statistics (i-th smallest and i-th largest), so negating the
    # data negates the interval exactly.
    b = len(sorted_values)
    i = min(int((1.0 - confidence) / 2.0 * b), (b - 1) // 2)
    return sorted_values[i], sorted_values[b - 1 - i]


def _multinomial_mean(rng: random.Random, counts: Sequence[tuple[float, int]], n: int) -> float:
    """Mean of one resample with replacement, drawn as counts per distinct value.

    Drawing n values with replacement puts Multinomial(n, c_j / n) copies on the
    distinct values; sequential binomials draw exactly that, in O(distinct values)
    instead of O(n): rewards usually take a handful of values.
    """
    left, rest, parts = n, n, []
    for value, count in counts:
        drawn = rng.binomialvariate(left, count / rest) if left else 0
        parts.append(value * drawn)
        left, rest = left - drawn, rest - count
    return math.fsum(parts) / n


def bootstrap_mean_interval(
    values: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> Interval | None:
    """Percentile bootstrap interval of the mean; None for no values.

    The values are sorted first, so the interval depends on the multiset of values
    and the seed only, never on the order records came from the ledger. The interval
    is widened (if ever needed) to contain the mean itself, and kept within the data.
    Data with few distinct values (at most a quarter of n) is resampled as counts
    per value (``_multinomial_mean``): the same distribution, much faster.
    """
    if not values:
        return None
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    data = sorted(values)
    n = len(data)
    point = mean(data)
    rng = random.Random(seed)
    counts = sorted(Counter(data).items())
    if len(counts) * 4 <= n:
        means = sorted(_multinomial_mean(rng, counts, n) for _ in range(resamples))
    else:
        means = sorted(math.fsum(rng.choices(data, k=n)) / n for _ in range(resamples))
    low, high = _percentile_bounds(means, confidence)
    return Interval(max(min(low, point), data[0]), min(max(high, point), data[-1]), "bootstrap")


def pass_at_k_task(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task from ``n`` attempts of which ``c`` passed.

    ``1 - C(n - c, k) / C(n, k)``: the chance that k attempts drawn without
    replacement from the n include at least one pass. Exact integer arithmetic.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def pass_at_k(per_task: Mapping[str, tuple[int, int]]) -> dict[int, float]:
    """pass@k averaged over tasks, for every k from 1 to the fewest attempts of a task.

    ``per_task`` maps a task to (attempts, passes); tasks without attempts are left
    out (they have no estimate). Returns {} when no task has an attempt.
    """
    counted = {t: (n, c) for t, (n, c) in per_task.items() if n > 0}
    if not counted:
        return {}
    k_max = min(n for n, _ in counted.values())
    return {
        k: math.fsum(pass_at_k_task(n, c, k) for n, c in counted.values()) / len(counted)
        for k in range(1, k_max + 1)
    }


@dataclass(frozen=True, slots=True)
class PairedDifference:
    """Mean of the paired differences a - b, with its bootstrap interval."""

    n_pairs: int
    difference: float
    interval: Interval


def paired_bootstrap_difference(
    a: Sequence[float],
    b: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> PairedDifference | None:
    """Mean of ``a[i] - b[i]`` with a bootstrap interval that resamples pairs.

    Pairs stay together in every resample (tasks are the unit), so what the two sides
    share (a task's difficulty) cancels. Antisymmetric: swapping ``a`` and ``b``
    negates the difference and mirrors the interval. None for no pairs.
    """
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} != {len(b)}")
    if not a:
        return None
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    m = len(diffs)
    point = mean(diffs)
    rng = random.Random(seed)
    indexes = range(m)
    means = sorted(
        math.fsum(diffs[i] for i in rng.choices(indexes, k=m)) / m for _ in range(resamples)
    )
    low, high = _percentile_bounds(means, confidence)
    return PairedDifference(m, point, Interval(min(low, point), max(high, point), "bootstrap"))


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pair counts.

    Under "no difference" each discordant pair is equally likely to favour either
    side, so ``only_a ~ Binomial(only_a + only_b, 1/2)``; the p-value doubles the
    smaller tail (capped at 1). No discordant pair gives p = 1.
    """
    if only_a < 0 or only_b < 0:
        raise ValueError(f"counts must be >= 0, got {only_a}, {only_b}")
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**n)))
