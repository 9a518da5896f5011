"""The scheduling benchmark's arithmetic gives the figures it claims (and can fail).

``benchmarks.scheduling_math`` turns event timestamps into the published figures:
each team's share of starts over a window, the deviation from the configured shares,
the urgent team's latency ratio, rates and losses. Each is checked against values
computed by hand, with a negative control that must move the verdict.
"""

from __future__ import annotations

import pytest

from benchmarks import scheduling_math as sm

SHARES = {"a": 1, "b": 3}


def _starts(n_a: int, n_b: int, start: float = 100.0, step: float = 0.1) -> list[tuple[str, float]]:
    """``n_a`` starts of team a and ``n_b`` of team b, interleaved evenly from ``start``."""
    out: list[tuple[str, float]] = []
    t = start
    for i in range(max(n_a, n_b)):
        for team, n in (("a", n_a), ("b", n_b)):
            if i < n:
                out.append((team, t))
                t += step
    return out


def test_shares_count_only_the_starts_inside_the_half_open_window() -> None:
    starts = [("a", 9.99), ("a", 10.0), ("b", 10.5), ("b", 11.0), ("b", 19.99), ("a", 20.0)]
    # In [10, 20): a at 10.0; b at 10.5, 11.0, 19.99. The ends (9.99, 20.0) are out.
    assert sm.shares_in(starts, sm.Window(10.0, 20.0)) == {"a": 0.25, "b": 0.75}
    assert sm.count_in([t for _, t in starts], sm.Window(10.0, 20.0)) == 4


def test_configured_shares_met_within_five_points_and_a_fifo_split_is_not() -> None:
    window = sm.Window(0.0, 1000.0)
    fair = sm.shares_in(_starts(150, 450), window)  # 1:3, as configured
    assert fair == {"a": 0.25, "b": 0.75}
    assert sm.share_deviation(fair, SHARES) == pytest.approx(0.0)
    near = sm.shares_in(_starts(168, 432), window)  # a 0.28: 3 points off
    assert sm.share_deviation(near, SHARES) == pytest.approx(0.03)
    assert sm.share_deviation(near, SHARES) <= 0.05
    # Negative controls: FIFO (a alone in the window) and an even split miss the target.
    fifo = sm.shares_in(_starts(600, 0), window)
    assert fifo == {"a": 1.0}
    assert sm.share_deviation(fifo, SHARES) == pytest.approx(0.75)  # b's 0.75 counts as missing
    even = sm.shares_in(_starts(300, 300), window)
    assert sm.share_deviation(even, SHARES) == pytest.approx(0.25)
    assert sm.share_deviation(even, SHARES) > 0.05


def test_a_window_without_starts_or_shares_without_weight_are_refused() -> None:
    with pytest.raises(ValueError, match="no start in the window"):
        sm.shares_in([("a", 1.0)], sm.Window(2.0, 3.0))
    with pytest.raises(ValueError, match="empty window"):
        sm.Window(3.0, 3.0)
    with pytest.raises(ValueError, match="positive weights"):
        sm.normalise({"a": 0, "b": 1})
    assert sm.normalise({"a": 1, "b": 3}) == {"a": 0.25, "b": 0.75}


def test_latency_ratio_within_ten_percent_and_a_slower_run_outside() -> None:
    assert sm.latency_ratio(10.9, 10.0) == pytest.approx(1.09)
    assert sm.latency_ratio(10.9, 10.0) <= 1.10
    # Negative control: 12 s against 10 s alone is 20 % slower, past the target.
    assert sm.latency_ratio(12.0, 10.0) == pytest.approx(1.2)
    assert sm.latency_ratio(12.0, 10.0) > 1.10
    with pytest.raises(ValueError, match="must be positive"):
        sm.latency_ratio(1.0, 0.0)


def test_a_rate_over_whole_trial_lengths_does_not_depend_on_the_phase_of_waves() -> None:
    waves = [w * 2.0 + i * 0.001 for w in range(20) for i in range(10)]  # 10 every 2 s
    assert sm.whole_trials(5.0, 2.0) == 6.0
    assert sm.whole_trials(6.0, 2.0) == 6.0
    span = sm.whole_trials(5.0, 2.0)
    rates = {sm.rate(waves, sm.Window(t, t + span)) for t in (3.0, 3.5, 4.9, 10.0)}
    assert rates == {5.0}  # 30 starts in 6 s wherever the window falls
    # Negative control: a 5 s window holds 2 or 3 waves depending on where it falls.
    assert {sm.rate(waves, sm.Window(t, t + 5.0)) for t in (3.0, 3.9)} == {4.0, 6.0}
    with pytest.raises(ValueError, match="must be positive"):
        sm.whole_trials(5.0, 0.0)


def test_rates_and_losses() -> None:
    times = [0.5 * i for i in range(40)]  # 2 per second over [0, 20)
    assert sm.rate(times, sm.Window(0.0, 10.0)) == pytest.approx(2.0)
    assert sm.rate(times, sm.Window(10.0, 30.0)) == pytest.approx(1.0)  # only 10 s of them
    assert sm.loss(2.0, 2.0) == pytest.approx(0.0)
    assert sm.loss(2.0, 0.5) == pytest.approx(0.75)
    assert sm.loss(2.0, 3.0) == pytest.approx(-0.5)  # a rise is a negative loss
    with pytest.raises(ValueError, match="must be positive"):
        sm.loss(0.0, 1.0)


def test_class_share_follows_the_weights_of_the_waiting_classes_only() -> None:
    weights = {"urgent": 8, "normal": 3, "batch": 1}
    assert sm.class_share(weights, ["urgent", "batch"], "urgent") == pytest.approx(8 / 9)
    assert sm.class_share(weights, ["urgent", "normal", "batch"], "urgent") == pytest.approx(8 / 12)
    # Negative control: equal weights give an even split, not the urgent class's 8/9.
    assert sm.class_share({"urgent": 1, "batch": 1}, ["urgent", "batch"], "urgent") == 0.5
    with pytest.raises(ValueError, match="not among the waiting"):
        sm.class_share(weights, ["batch"], "urgent")


def test_the_model_separates_waves_alone_from_a_trickle_behind_a_full_fleet() -> None:
    alone = sm.waves_s(100, 20, 2.0)  # 100 trials of 2 s on 20 free slots: 5 waves
    assert alone == pytest.approx(10.0)
    assert sm.waves_s(101, 20, 2.0) == pytest.approx(12.0)  # a sixth wave for one trial
    # Behind batch work, 8/9 of 10 starts a second after a 2 s wait: 2 + 11.25 + 2.
    behind = sm.trickle_s(100, 20, 2.0, share=8 / 9, wait_s=2.0)
    assert behind == pytest.approx(15.25)
    assert sm.latency_ratio(behind, alone) > 1.10
    # Every start and no wait still trickles: 10 + 2 s, 20 % slower than the waves
    # (negative control for "strict priority alone would meet 10 %": it does not).
    assert sm.latency_ratio(sm.trickle_s(100, 20, 2.0, share=1.0, wait_s=0.0), alone) > 1.10
    with pytest.raises(ValueError, match="share must be"):
        sm.trickle_s(100, 20, 2.0, share=0.0, wait_s=0.0)


def test_in_flight_counts_each_spans_overlap_with_the_window() -> None:
    window = sm.Window(10.0, 20.0)
    # Two trials running the whole window, one half of it, one before, one after.
    spans = [(0.0, 30.0), (5.0, 25.0), (15.0, 40.0), (0.0, 10.0), (20.0, 22.0)]
    assert sm.in_flight(spans, window) == pytest.approx(2.5)
    # Negative control: a span ending inside the window counts less than a whole slot.
    assert sm.in_flight([(0.0, 12.0)], window) == pytest.approx(0.2)
    assert sm.in_flight([], window) == 0.0
