"""The scheduling benchmark's sizes, outcomes and the figures made of them (no I/O)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from benchmarks import scheduling_math as sm
from benchmarks.harness import BenchResult, Figure, median
from services.common.priority import DEFAULT_CLASSES

SHARES = {"team-a": 1, "team-b": 3}
"""The configured shares of the two batch teams (team-a gets 1/4 while both wait)."""


@dataclass(frozen=True, slots=True)
class Sizes:
    """How big a run is (benchmarks.bench_scheduling says what each size is for)."""

    batch: int
    urgent: int
    runners: int
    slots: int
    trial_s: float
    window_s: float

    @property
    def fleet(self) -> int:
        """Slots of the whole fleet."""
        return self.runners * self.slots

    @property
    def share_trials(self) -> int:
        """Each batch team's trials in the shares scenario: more than the fleet starts in
        the window and the trial before it, so neither team runs dry (a multiple of 400,
        which ``many_trials`` makes exactly)."""
        starts = self.fleet * (self.window_s + 3 * self.trial_s) / self.trial_s
        return 400 * (int(starts * 1.5) // 400 + 1)


@dataclass(frozen=True, slots=True)
class UrgentRun:
    """One urgent experiment's times from its ExperimentSubmitted, in seconds: its first
    and last TrialStarted, its last TrialCompleted (the runners are done) and its last
    trial's first ResultImported (the ledger has every result: the user's view)."""

    first_start_s: float
    last_start_s: float
    finished_s: float
    completion_s: float


@dataclass(frozen=True, slots=True)
class PriorityOutcome:
    """The priority scenario's measurements."""

    alone: UrgentRun
    contended: UrgentRun
    urgent_share: float
    a_before: float
    a_during: float
    a_after: float
    fleet_during: float
    window_s: float


def added(p: PriorityOutcome) -> float:
    """What B's first start lost to A: its wait behind A minus its wait alone."""
    return p.contended.first_start_s - p.alone.first_start_s


def result(
    z: Sizes,
    prio: list[PriorityOutcome],
    shares: list[dict[str, float]],
    loads: list[float],
    rule: float,
    fair_share_on: bool,
    runs: int,
) -> BenchResult:
    """The benchmark's result: B's completion ratio (median over runs) as the headline,
    every other figure beside it, each with its per-run values where it has a target."""
    completion = [sm.latency_ratio(p.contended.completion_s, p.alone.completion_s) for p in prio]
    finished = [sm.latency_ratio(p.contended.finished_s, p.alone.finished_s) for p in prio]
    first = [sm.latency_ratio(p.contended.first_start_s, p.alone.first_start_s) for p in prio]
    deviation = [sm.share_deviation(s, SHARES) for s in shares]
    alone_finished = median([p.alone.finished_s for p in prio])
    alone_last_start = median([p.alone.last_start_s for p in prio])
    configured = sm.normalise(SHARES)

    def med(values: list[float]) -> float:
        return median(values)

    def each(values: list[float], unit: str = "") -> str:
        return "per run: " + ", ".join(f"{v:.3g}{unit}" for v in values)

    peers = [
        Figure("first_start_ratio", med(first), "ratio", each(first), 1.10, "<="),
        Figure(
            "b_first_start_s",
            med([p.contended.first_start_s for p in prio]),
            "s",
            "B's ExperimentSubmitted -> its first TrialStarted, behind A",
        ),
        Figure(
            "b_first_start_alone_s",
            med([p.alone.first_start_s for p in prio]),
            "s",
            "the same on the empty fleet",
        ),
        Figure(
            "b_first_start_added_s",
            med([added(p) for p in prio]),
            "s",
            f"the wait for a slot to free (trials last {z.trial_s:g} s, no preemption) plus "
            "a busy runner's look at other classes (at most 1 s)",
        ),
        Figure(
            "b_completion_s",
            med([p.contended.completion_s for p in prio]),
            "s",
            "B's ExperimentSubmitted -> its last first ResultImported, behind A",
        ),
        Figure(
            "b_completion_alone_s",
            med([p.alone.completion_s for p in prio]),
            "s",
            "the same on the empty fleet",
        ),
        Figure(
            "finished_ratio",
            med(finished),
            "ratio",
            "B's last TrialCompleted behind A over alone: the fleet's part of the headline, "
            "without the importer's lag (" + each(finished) + ")",
            1.10,
            "<=",
        ),
        Figure(
            "b_finished_s",
            med([p.contended.finished_s for p in prio]),
            "s",
            f"B's last TrialCompleted, behind A (alone {alone_finished:.1f} s)",
        ),
        Figure(
            "b_last_start_s",
            med([p.contended.last_start_s for p in prio]),
            "s",
            f"B's last TrialStarted, behind A (alone {alone_last_start:.1f} s)",
        ),
        Figure(
            "b_completion_model_s",
            med([sm.trickle_s(z.urgent, z.fleet, z.trial_s, rule, added(p)) for p in prio]),
            "s",
            f"the rule's estimate behind A: the wait above, then {rule:.3f} of the starts "
            f"as slots free evenly (alone: {sm.waves_s(z.urgent, z.fleet, z.trial_s):g} s "
            "in waves)",
        ),
        Figure(
            "b_share_of_starts",
            med([p.urgent_share for p in prio]),
            "fraction",
            f"while B waited for slots ({each([p.window_s for p in prio], ' s')}); "
            f"the runners' rule gives {rule:.3f}",
        ),
        Figure(
            "a_loss_while_b_waits",
            med([sm.loss(p.a_before, p.a_during) for p in prio]),
            "fraction",
            "A's start rate while B waits, against the same length before B",
        ),
        Figure(
            "fleet_loss_while_b_waits",
            med([sm.loss(p.a_before, p.fleet_during) for p in prio]),
            "fraction",
            "A + B start rate then, against A's before: what scheduling itself lost",
        ),
        Figure(
            "a_loss_after_b",
            med([sm.loss(p.a_before, p.a_after) for p in prio]),
            "fraction",
            "A's start rate after B's last import, against before",
        ),
        Figure(
            "a_starts_per_s_before",
            med([p.a_before for p in prio]),
            "starts/s",
            f"the fleet's ideal is {z.fleet / z.trial_s:g}/s ({z.fleet} slots / {z.trial_s:g} s)",
        ),
        Figure("share_deviation", med(deviation), "fraction", each(deviation), 0.05, "<="),
        *(
            Figure(
                f"share_{team}",
                med([s.get(team, 0.0) for s in shares]),
                "fraction",
                f"configured {configured[team]:.3f}",
            )
            for team in SHARES
        ),
        Figure("load_average_during", max(loads), "load", "1-minute, highest after a scenario"),
    ]
    return BenchResult(
        name="scheduling",
        title=f"Scheduling: {z.urgent} urgent trials behind {z.batch:,} batch ones, "
        "B's completion against B alone",
        value=med(completion),
        unit="ratio",
        target=1.10,
        target_op="<=",
        runs=completion,
        peers=peers,
        config={
            "batch_trials": z.batch,
            "urgent_trials": z.urgent,
            "runners": z.runners,
            "slots_per_runner": z.slots,
            "trial_s": z.trial_s,
            "share_window_s": z.window_s,
            "share_trials_per_team": z.share_trials,
            "configured_shares": SHARES,
            "fair_share": "on (quotas file)"
            if fair_share_on
            else "not in this code: FIFO measured",
            "priority_classes": os.environ.get("TRIALBUS_PRIORITY_CLASSES", DEFAULT_CLASSES),
            "runs": runs,
        },
    )
