"""The scheduling benchmark's sizes, outcomes and the figures made of them (no I/O)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks import scheduling_math as sm
from benchmarks.harness import BenchResult, Figure, TargetOp, median
from benchmarks.scheduling_preemption import PreemptionCheck
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
    """The priority scenario's measurements (one run of one variant)."""

    alone: UrgentRun
    contended: UrgentRun
    urgent_share: float
    a_before: float
    a_during: float
    a_after: float
    fleet_during: float
    window_s: float
    a_trials_lost: float
    """A's completions short of its rate before, from B's submission to a while after B."""
    preemption: PreemptionCheck


@dataclass(frozen=True, slots=True)
class SharesOutcome:
    """The shares scenario's measurements (one run)."""

    shares: dict[str, float]
    """Each team's fraction of the starts in the window."""
    in_flight: dict[str, float]
    """Each team's trials running at once, on average over the window."""
    deliveries_per_s: float
    """The batch durable's deliveries a second then (starts and hand-backs)."""
    starts_per_s: float
    """Both teams' starts a second in the window."""
    fair_share_on: bool


def added(p: PriorityOutcome) -> float:
    """What B's first start lost to A: its wait behind A minus its wait alone."""
    return p.contended.first_start_s - p.alone.first_start_s


def _each(values: list[float], unit: str = "") -> str:
    return "per run: " + ", ".join(f"{v:.3g}{unit}" for v in values)


def priority_figures(
    z: Sizes, prio: list[PriorityOutcome], rule: float, prefix: str, preemptible: bool
) -> list[Figure]:
    """The priority scenario's figures for one variant (A preemptible or not), each
    name led by ``prefix``."""
    completion = [sm.latency_ratio(p.contended.completion_s, p.alone.completion_s) for p in prio]
    finished = [sm.latency_ratio(p.contended.finished_s, p.alone.finished_s) for p in prio]
    first = [sm.latency_ratio(p.contended.first_start_s, p.alone.first_start_s) for p in prio]
    alone_finished = median([p.alone.finished_s for p in prio])
    alone_last_start = median([p.alone.last_start_s for p in prio])
    waves = sm.waves_s(z.urgent, z.fleet, z.trial_s)
    if preemptible:
        wait = "the next preemption look (0.5-1.5 s) and the victim's stop"
        model = [added(p) + waves for p in prio]
        model_what = (
            f"the wait above, then the whole fleet in waves as alone ({waves:g} s): "
            "A's preemptible trials are stopped for B's"
        )
    else:
        wait = (
            f"the wait for a slot to free (trials last {z.trial_s:g} s, not preemptible) plus "
            "a busy runner's look at other classes (at most 1 s)"
        )
        model = [sm.trickle_s(z.urgent, z.fleet, z.trial_s, rule, added(p)) for p in prio]
        model_what = (
            f"the rule's estimate: the wait above, then {rule:.3f} of the starts as slots "
            f"free evenly (alone: {waves:g} s in waves)"
        )
    check = [p.preemption for p in prio]

    def fig(
        name: str,
        values: list[float],
        unit: str,
        what: str,
        target: float | None = None,
        op: TargetOp | None = None,
    ) -> Figure:
        return Figure(prefix + name, median(values), unit, what, target, op)

    def behind_a_and_alone(
        name: str, time_of: Callable[[UrgentRun], float], what: str
    ) -> list[Figure]:
        """B's ``name`` time behind A (``what``), then the same time with B alone."""
        return [
            fig(f"b_{name}_s", [time_of(p.contended) for p in prio], "s", what),
            fig(f"b_{name}_alone_s", [time_of(p.alone) for p in prio], "s", "the same alone"),
        ]

    return [
        fig("completion_ratio", completion, "ratio", _each(completion), 1.10, "<="),
        fig("first_start_ratio", first, "ratio", _each(first), 1.10, "<="),
        *behind_a_and_alone(
            "first_start",
            lambda run: run.first_start_s,
            "B's ExperimentSubmitted -> its first TrialStarted, behind A",
        ),
        fig("b_first_start_added_s", [added(p) for p in prio], "s", wait),
        *behind_a_and_alone(
            "completion",
            lambda run: run.completion_s,
            "B's ExperimentSubmitted -> its last first ResultImported, behind A",
        ),
        fig(
            "finished_ratio",
            finished,
            "ratio",
            "B's last TrialCompleted behind A over alone: the fleet's part of the ratio, "
            "without the importer's lag (" + _each(finished) + ")",
            1.10,
            "<=",
        ),
        fig(
            "b_finished_s",
            [p.contended.finished_s for p in prio],
            "s",
            f"B's last TrialCompleted, behind A (alone {alone_finished:.1f} s)",
        ),
        fig(
            "b_last_start_s",
            [p.contended.last_start_s for p in prio],
            "s",
            f"B's last TrialStarted, behind A (alone {alone_last_start:.1f} s)",
        ),
        fig("b_completion_model_s", model, "s", model_what),
        fig(
            "b_share_of_starts",
            [p.urgent_share for p in prio],
            "fraction",
            f"while B waited for slots ({_each([p.window_s for p in prio], ' s')}); "
            f"the runners' weighted rule alone gives {rule:.3f}",
        ),
        fig(
            "a_loss_while_b_waits",
            [sm.loss(p.a_before, p.a_during) for p in prio],
            "fraction",
            "A's rate of new starts while B waits, against the same length before B",
        ),
        fig(
            "fleet_loss_while_b_waits",
            [sm.loss(p.a_before, p.fleet_during) for p in prio],
            "fraction",
            "A + B new starts a second then, against A's before (a preempted trial's "
            "restart is no new start)",
        ),
        fig(
            "a_loss_after_b",
            [sm.loss(p.a_before, p.a_after) for p in prio],
            "fraction",
            "A's start rate after B's last import, against before",
        ),
        fig(
            "a_starts_per_s_before",
            [p.a_before for p in prio],
            "starts/s",
            f"the fleet's ideal is {z.fleet / z.trial_s:g}/s ({z.fleet} slots / {z.trial_s:g} s)",
        ),
        fig(
            "a_trials_lost",
            [p.a_trials_lost for p in prio],
            "trials",
            "A's completions short of its rate before, from B's submission to one span after "
            f"B: B's own {z.urgent} trials of the same length are the slot time A lent",
        ),
        fig(
            "a_trials_wasted",
            [p.a_trials_lost - z.urgent for p in prio],
            "trials",
            f"A's lost completions beyond B's {z.urgent}: work thrown away (preempted trials' "
            "partial runs) and slots left idle",
        ),
        fig(
            "preempted_trials",
            [float(c.preempted) for c in check],
            "trials",
            f"A's trials handed back by a preemption (hand-backs: "
            f"{_each([float(c.handbacks) for c in check])}; most per trial: "
            f"{max(c.restarted_max for c in check)})"
            + ("" if preemptible else "; none may be: A did not opt in"),
            None if preemptible else 0.0,
            None if preemptible else "<=",
        ),
        fig(
            "preempted_lost",
            [float(len(c.lost)) for c in check],
            "trials",
            "preempted trials of A with no scored record once A ran on (ledger)",
            0.0,
            "<=",
        ),
        fig(
            "preempted_counted",
            [float(len(c.counted) + c.other_failures) for c in check],
            "trials",
            "preempted trials counted as a failed attempt (an attempt above 1, a final or "
            "other failure, a record of more than 1 attempt), plus A's other TrialFailed",
            0.0,
            "<=",
        ),
    ]


def share_figures(z: Sizes, shares: list[SharesOutcome]) -> list[Figure]:
    """The shares scenario's figures."""
    deviation = [sm.share_deviation(s.shares, SHARES) for s in shares]
    configured = sm.normalise(SHARES)
    busy = [sum(s.in_flight.values()) for s in shares]
    out = [Figure("share_deviation", median(deviation), "fraction", _each(deviation), 0.05, "<=")]
    for team in SHARES:
        out.append(
            Figure(
                f"share_{team}",
                median([s.shares.get(team, 0.0) for s in shares]),
                "fraction",
                f"configured {configured[team]:.3f}",
            )
        )
        out.append(
            Figure(
                f"in_flight_{team}",
                median([s.in_flight.get(team, 0.0) for s in shares]),
                "trials",
                f"running at once on average (the rule settles at "
                f"{z.fleet * configured[team]:.3g} of {z.fleet})",
            )
        )
    out += [
        Figure(
            "share_slots_busy",
            median(busy),
            "slots",
            f"both teams' trials running at once, of {z.fleet} ({_each(busy)})",
        ),
        Figure(
            "share_starts_per_s",
            median([s.starts_per_s for s in shares]),
            "starts/s",
            f"the fleet's ideal is {z.fleet / z.trial_s:g}/s",
        ),
        Figure(
            "share_deliveries_per_s",
            median([s.deliveries_per_s for s in shares]),
            "msgs/s",
            "the batch durable's deliveries a second (CONSUMER.INFO's delivered sequence): "
            "starts plus fair share's hand-backs",
        ),
    ]
    return out


def result(
    z: Sizes,
    prio: list[PriorityOutcome],
    fifo: list[PriorityOutcome],
    shares: list[SharesOutcome],
    loads: list[float],
    rule: float,
    runs: int,
) -> BenchResult:
    """The benchmark's result: B's completion ratio behind a preemptible A (median over
    runs) as the headline, every other figure beside it (the same behind a
    non-preemptible A under ``nonpreempt_``), each with its per-run values where it
    has a target."""
    completion = [sm.latency_ratio(p.contended.completion_s, p.alone.completion_s) for p in prio]
    fair_share_on = all(s.fair_share_on for s in shares)
    peers = [
        *priority_figures(z, prio, rule, "", preemptible=True)[1:],
        *priority_figures(z, fifo, rule, "nonpreempt_", preemptible=False),
        *share_figures(z, shares),
        Figure("load_average_during", max(loads), "load", "1-minute, highest after a scenario"),
    ]
    return BenchResult.ratio(
        "scheduling",
        f"Scheduling: {z.urgent} urgent trials behind {z.batch:,} preemptible batch ones, "
        "B's completion against B alone",
        completion,
        1.10,
        peers,
        {
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
            "batch_variants": "preemptible (headline), non-preemptible (nonpreempt_)",
            "runs": runs,
        },
    )
