"""Known answers and invariants of the statistics behind every score (services.reports.stats).

Known answers are published worked examples (Newcombe 1998 for the Wilson interval;
Chen et al. 2021's own estimator code for pass@k) or small cases computed by hand in
the comments. Invariants are checked with hypothesis.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.reports import stats

PROPERTY = settings(database=None, deadline=None, max_examples=150)
"""Settings of every property test here (no example database written to the repo)."""

rewards = st.floats(min_value=-10.0, max_value=10.0, allow_nan=False, allow_infinity=False)


# -- Wilson interval ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [
        # Newcombe (1998), Statistics in Medicine 17:857-872, Table II, method 3 (Wilson
        # score interval without continuity correction), 95%.
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0000, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_matches_newcombe_1998(successes: int, n: int, low: float, high: float) -> None:
    interval = stats.wilson_interval(successes, n)
    assert interval is not None
    assert (round(interval.low, 4), round(interval.high, 4)) == (low, high)
    assert interval.method == "wilson"


def test_wilson_by_hand_one_trial() -> None:
    # n = 1, p = 1: centre = (1 + z²/2) / (1 + z²), half = z / (1 + z²) * sqrt(z²/4),
    # so low = (1 + z²/2 - z²/2) / (1 + z²) = 1 / (1 + z²) = 1 / 4.8415 = 0.20654.
    z = stats.z_value()
    assert z == pytest.approx(1.959964, abs=1e-6)
    one = stats.wilson_interval(1, 1)
    zero = stats.wilson_interval(0, 1)
    assert one is not None and zero is not None
    assert one.low == pytest.approx(1 / (1 + z * z)) and one.high == 1.0
    assert zero.low == 0.0 and zero.high == pytest.approx(1 - 1 / (1 + z * z))


def test_wilson_edges_zero_of_n_and_n_of_n_keep_exact_bounds() -> None:
    for n in (1, 2, 9, 1000):
        none_passed, all_passed = stats.wilson_interval(0, n), stats.wilson_interval(n, n)
        assert none_passed is not None and all_passed is not None
        assert none_passed.low == 0.0 and none_passed.high > 0.0
        assert all_passed.high == 1.0 and all_passed.low < 1.0
    # 9/9 (the demo's oracle): 95% Wilson lower bound 0.7009, not a false 1.0.
    nine = stats.wilson_interval(9, 9)
    assert nine is not None and round(nine.low, 4) == 0.7009


def test_wilson_without_trials_is_none_and_bad_counts_are_refused() -> None:
    assert stats.wilson_interval(0, 0) is None
    with pytest.raises(ValueError):
        stats.wilson_interval(3, 2)
    with pytest.raises(ValueError):
        stats.wilson_interval(-1, 2)


@PROPERTY
@given(
    st.integers(min_value=1, max_value=5000).flatmap(
        lambda n: st.tuples(st.integers(0, n), st.just(n))
    )
)
def test_wilson_contains_the_proportion_and_is_symmetric(case: tuple[int, int]) -> None:
    s, n = case
    interval, mirror = stats.wilson_interval(s, n), stats.wilson_interval(n - s, n)
    assert interval is not None and mirror is not None
    assert 0.0 <= interval.low <= s / n <= interval.high <= 1.0
    assert interval.low == pytest.approx(1 - mirror.high, abs=1e-12)


# -- bootstrap interval of a mean ------------------------------------------------------------


def test_bootstrap_known_answers() -> None:
    # [0, 1]: resampled means are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4; both
    # 2.5% tails fall inside the end atoms, so the interval is [0, 1].
    two = stats.bootstrap_mean_interval([0.0, 1.0])
    assert two is not None and (two.low, two.high) == (0.0, 1.0)
    # [0, 0, 0, 1]: P(mean = 0) = (3/4)^4 = 0.32 > 2.5%, so low = 0; P(mean = 1) =
    # (1/4)^4 = 0.4% < 2.5% < P(mean >= 0.75) = 5.1%, so high = 0.75.
    four = stats.bootstrap_mean_interval([0.0, 0.0, 0.0, 1.0])
    assert four is not None and (four.low, four.high) == (0.0, 0.75)


def test_bootstrap_edges() -> None:
    assert stats.bootstrap_mean_interval([]) is None  # all unscored: no interval
    one = stats.bootstrap_mean_interval([0.4])
    assert one is not None and (one.low, one.high) == (0.4, 0.4)  # n = 1: a point
    same = stats.bootstrap_mean_interval([0.3] * 7)
    assert same is not None and (same.low, same.high) == (0.3, 0.3)


def test_bootstrap_is_seeded_and_independent_of_order() -> None:
    values = [0.1, 0.9, 0.5, 0.5, 0.25, 1.0, 0.0, 0.75]
    first = stats.bootstrap_mean_interval(values)
    assert first == stats.bootstrap_mean_interval(list(reversed(values)))
    assert first == stats.bootstrap_mean_interval(values, seed=stats.BOOTSTRAP_SEED)
    assert first != stats.bootstrap_mean_interval(values, seed=1)


@PROPERTY
@given(st.lists(rewards, min_size=1, max_size=40))
def test_bootstrap_interval_contains_the_mean_and_stays_within_the_data(
    values: list[float],
) -> None:
    interval = stats.bootstrap_mean_interval(values, resamples=300)
    assert interval is not None
    point = stats.mean(values)
    assert interval.contains(point)
    assert min(values) <= interval.low <= interval.high <= max(values)


# -- pass@k ----------------------------------------------------------------------------------


def chen_et_al_2021(n: int, c: int, k: int) -> float:
    """The estimator as published (Chen et al. 2021, Figure 3), in pure Python."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 5, 11 / 12),  # 1 - C(7,5)/C(10,5) = 1 - 21/252
        (3, 1, 1, 1 / 3),  # pass@1 = c / n
        (4, 0, 3, 0.0),  # never passed
        (5, 4, 2, 1.0),  # fewer failures than k: a pass is certain
        (1, 1, 1, 1.0),  # n = 1
        (1, 0, 1, 0.0),
    ],
)
def test_pass_at_k_task_known_answers(n: int, c: int, k: int, expected: float) -> None:
    assert stats.pass_at_k_task(n, c, k) == pytest.approx(expected, abs=1e-15)


def test_pass_at_k_task_equals_the_published_estimator_and_harbors() -> None:
    from harbor.utils.pass_at_k import _pass_at_k_for_task as harbor_pass_at_k

    for n in range(1, 16):
        for c in range(n + 1):
            for k in range(1, n + 1):
                ours = stats.pass_at_k_task(n, c, k)
                assert ours == pytest.approx(chen_et_al_2021(n, c, k), abs=1e-12)
                assert ours == pytest.approx(harbor_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_averages_tasks_for_every_k_up_to_the_fewest_attempts() -> None:
    # task a: 5 attempts, 2 passed; task b: 3 attempts, none passed.
    result = stats.pass_at_k({"a": (5, 2), "b": (3, 0)})
    assert list(result) == [1, 2, 3]
    assert result[1] == pytest.approx((2 / 5 + 0) / 2)
    assert result[2] == pytest.approx((0.7 + 0) / 2)
    assert result[3] == pytest.approx((1 - 1 / 10 + 0) / 2)  # 1 - C(3,3)/C(5,3)


def test_pass_at_k_edges() -> None:
    assert stats.pass_at_k({}) == {}
    assert stats.pass_at_k({"a": (0, 0)}) == {}  # all unscored
    assert stats.pass_at_k({"a": (4, 4), "b": (0, 0)}) == {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}
    with pytest.raises(ValueError):
        stats.pass_at_k_task(3, 1, 4)


attempts = st.integers(min_value=1, max_value=12).flatmap(
    lambda n: st.tuples(st.just(n), st.integers(0, n))
)


@PROPERTY
@given(st.dictionaries(st.text(min_size=1, max_size=5), attempts, min_size=1, max_size=8))
def test_pass_at_k_is_monotone_in_k_and_starts_at_the_pass_rate(
    per_task: dict[str, tuple[int, int]],
) -> None:
    result = stats.pass_at_k(per_task)
    values = [result[k] for k in sorted(result)]
    assert all(0.0 <= v <= 1.0 for v in values)
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(values))
    expected_1 = sum(c / n for n, c in per_task.values()) / len(per_task)
    assert result[1] == pytest.approx(expected_1)


# -- paired bootstrap difference ------------------------------------------------------------------


def test_paired_difference_known_answers() -> None:
    same = stats.paired_bootstrap_difference([0.2, 0.5, 1.0], [0.2, 0.5, 1.0])
    assert same is not None
    assert (same.difference, same.interval.low, same.interval.high) == (0.0, 0.0, 0.0)
    # A constant shift survives every resample: the interval is the point.
    shift = stats.paired_bootstrap_difference([1.0, 0.5, 0.75], [0.5, 0.0, 0.25])
    assert shift is not None
    assert (shift.difference, shift.interval.low, shift.interval.high) == (0.5, 0.5, 0.5)
    # Two tasks, differences +1 and 0: resampled means 0, 0.5, 1 -> [0, 1], spans 0.
    two = stats.paired_bootstrap_difference([1.0, 0.0], [0.0, 0.0])
    assert two is not None and two.difference == 0.5
    assert (two.interval.low, two.interval.high) == (0.0, 1.0) and two.interval.spans_zero()
    assert stats.paired_bootstrap_difference([], []) is None
    with pytest.raises(ValueError):
        stats.paired_bootstrap_difference([1.0], [])


unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@PROPERTY
@given(st.lists(st.tuples(unit, unit), min_size=1, max_size=30))
def test_paired_difference_is_antisymmetric(pairs: list[tuple[float, float]]) -> None:
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    ab = stats.paired_bootstrap_difference(a, b, resamples=300)
    ba = stats.paired_bootstrap_difference(b, a, resamples=300)
    assert ab is not None and ba is not None
    assert ab.difference == -ba.difference
    assert (ab.interval.low, ab.interval.high) == (-ba.interval.high, -ba.interval.low)
    assert ab.interval.contains(ab.difference)


# -- McNemar's exact test -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("only_a", "only_b", "p"),
    [
        (0, 0, 1.0),  # no discordant pair
        (3, 3, 1.0),  # 2 * P(X <= 3 | n=6) = 2 * 42/64 > 1, capped
        (0, 5, 0.0625),  # 2 * (1/2)^5
        (1, 9, 22 / 1024),  # 2 * (1 + 10) / 2^10
        (8, 2, 112 / 1024),  # 2 * (1 + 10 + 45) / 2^10
        (0, 1, 1.0),  # 2 * 1/2
    ],
)
def test_mcnemar_exact_known_answers(only_a: int, only_b: int, p: float) -> None:
    assert stats.mcnemar_exact(only_a, only_b) == pytest.approx(p, abs=1e-15)


@PROPERTY
@given(st.integers(0, 200), st.integers(0, 200))
def test_mcnemar_is_symmetric_and_a_probability(only_a: int, only_b: int) -> None:
    p = stats.mcnemar_exact(only_a, only_b)
    assert p == stats.mcnemar_exact(only_b, only_a)
    assert 0.0 < p <= 1.0
