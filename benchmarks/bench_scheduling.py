"""11. Scheduling on a shared fleet: an urgent team behind a deep batch queue, two batch teams.

A fresh embedded stack (nats-server, the ledger, importer, watcher, submitter and R
runner processes of C slots each: R x C slots, the instant executor waiting S seconds
per trial, as in the capacity benchmark) runs two scenarios, each judged from the
events' own timestamps (``occurred_at`` of ExperimentSubmitted, TrialStarted and
ResultImported, read by a JetStream ordered consumer), never from polling:

- **Priority.** Team B submits U urgent trials to the empty fleet (B alone); then team
  A submits the issue's 10,000 batch trials (``compute.priority_class: batch``), and
  once A fills the fleet in steady state, B submits U urgent trials again. B's
  **first start** (its ExperimentSubmitted to its first TrialStarted) and
  **completion** (to its last trial's first ResultImported) are compared with B alone
  (the issue's target: within 10 %). A's start rate in the window where B waits for
  slots, against the same length before B arrived, gives **A's throughput loss**; the
  whole fleet's start rate in that window, the throughput the scheduling itself lost.
  B's share of the starts while both wait is compared with what the runners'
  weighted round robin promises (``weight_urgent / (weight_urgent + weight_batch)``).
- **Shares.** On another fresh stack, team A then team B each submit a batch
  experiment larger than a minute of the fleet's starts; over a minute that starts
  one trial length after B's submission, each team's share of the starts is
  compared with its configured share (the issue's target: within 5 points). The
  configured shares go to the quotas file (``TRIALBUS_QUOTAS_FILE``, field
  ``SHARE_FIELD``) when the code has that field (fair share, docs/scheduling.md);
  without it the benchmark measures the split as it is (FIFO) and says so.

Quick mode (``make bench-quick``) uses smaller sizes; ``TRIALBUS_BENCH_SCHEDULING``
overrides them as ``A:U:R:C:S:W`` (batch trials, urgent trials, runners, slots per
runner, trial seconds, share window seconds).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from benchmarks import scheduling_math as sm
from benchmarks.harness import BenchResult, Context, Figure, fresh_dir, load_average, median
from benchmarks.scheduling_run import (
    SchedulingStack,
    Tap,
    classed_manifest,
    share_quotas,
)
from services.common.priority import DEFAULT_CLASSES, PriorityClasses

ENV = "TRIALBUS_BENCH_SCHEDULING"
SHARES = {"team-a": 1, "team-b": 3}
"""The configured shares of the two batch teams (team-a gets 1/4 while both wait)."""


@dataclass(frozen=True, slots=True)
class Sizes:
    """How big a run is (see the module's docstring)."""

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


FULL = Sizes(batch=10_000, urgent=100, runners=2, slots=10, trial_s=2.0, window_s=60.0)
QUICK = Sizes(batch=800, urgent=20, runners=1, slots=8, trial_s=1.0, window_s=15.0)


def sizes(quick: bool) -> Sizes:
    """This run's sizes: the mode's, or ``TRIALBUS_BENCH_SCHEDULING``."""
    raw = os.environ.get(ENV)
    if not raw:
        return QUICK if quick else FULL
    a, u, r, c, s, w = raw.split(":")
    return Sizes(int(a), int(u), int(r), int(c), float(s), float(w))


@dataclass(frozen=True, slots=True)
class UrgentRun:
    """One urgent experiment's times from its ExperimentSubmitted, in seconds."""

    first_start_s: float
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


def _added(p: PriorityOutcome) -> float:
    """What B's first start lost to A: its wait behind A minus its wait alone."""
    return p.contended.first_start_s - p.alone.first_start_s


def _urgent_run(tap: Tap, exp: str) -> UrgentRun:
    t0 = tap.submitted_at(exp)
    return UrgentRun(tap.first_start(exp) - t0, tap.last_import(exp) - t0)


async def _priority(ctx: Context, z: Sizes, run_dir: Path) -> PriorityOutcome:
    deadline = 120 + 20 * z.trial_s * (1 + z.urgent / z.fleet)
    async with SchedulingStack(run_dir, z.runners, z.slots, z.trial_s) as st:
        await st.warm_up(run_dir)
        tap = st.tap
        alone = await st.submit(classed_manifest(run_dir, "b-alone", z.urgent, "urgent", z.urgent))
        await tap.wait(
            lambda: tap.imported(alone) >= st.published[alone], deadline, f"{alone} imported"
        )
        # A runs twice B's time alone before B comes: the window before B is steady state.
        lead_s = max(2 * (tap.last_import(alone) - tap.submitted_at(alone)), 4 * z.trial_s)
        ctx.log(f"scheduling: B alone done; submitting A's {z.batch:,} batch trials")
        batch = await st.submit(classed_manifest(run_dir, "a-batch", z.batch, "batch", z.batch))
        await tap.wait(
            lambda: tap.started(batch) > 0 and tap.latest(batch) - tap.first_start(batch) >= lead_s,
            deadline,
            f"{batch} steady",
        )
        ctx.log(f"scheduling: A at {tap.started(batch)} starts; submitting B's urgent trials")
        urgent = await st.submit(
            classed_manifest(run_dir, "b-urgent", z.urgent, "urgent", z.urgent)
        )
        await tap.wait(
            lambda: tap.imported(urgent) >= st.published[urgent], deadline, f"{urgent} imported"
        )
        b_sub, b_done = tap.submitted_at(urgent), tap.last_import(urgent)
        contended = sm.Window(b_sub, tap.last_start(urgent))
        lead = max(contended.seconds, 2 * z.trial_s)
        # A's rate after B: wait for A's starts a whole lead past B's last import.
        await tap.wait(lambda: tap.latest(batch) >= b_done + lead, deadline, f"{batch} after B")
        a_starts, b_starts = tap.start_times(batch), tap.start_times(urgent)
        # Never A's first wave: its starts all came at once, not at the steady rate.
        before = sm.Window(max(b_sub - lead, tap.first_start(batch) + z.trial_s), b_sub)
        after = sm.Window(b_done, b_done + lead)
        both = [("A", t) for t in a_starts] + [("B", t) for t in b_starts]
        return PriorityOutcome(
            alone=_urgent_run(tap, alone),
            contended=_urgent_run(tap, urgent),
            urgent_share=sm.shares_in(both, contended).get("B", 0.0),
            a_before=sm.rate(a_starts, before),
            a_during=sm.rate(a_starts, contended),
            a_after=sm.rate(a_starts, after),
            fleet_during=sm.rate(a_starts + b_starts, contended),
            window_s=contended.seconds,
        )


async def _shares(ctx: Context, z: Sizes, run_dir: Path) -> tuple[dict[str, float], bool]:
    quotas_file = share_quotas(SHARES, run_dir / "quotas.yaml")
    n = z.share_trials
    deadline = 120 + 3 * (z.window_s + z.trial_s)
    async with SchedulingStack(run_dir, z.runners, z.slots, z.trial_s, quotas_file) as st:
        await st.warm_up(run_dir)
        tap = st.tap
        exps: dict[str, str] = {}
        for team in SHARES:  # team-a first: under FIFO it would take the whole fleet
            manifest = classed_manifest(run_dir, f"share-{team}", n, "batch", n)
            exps[await st.submit(manifest, team=team)] = team
        ctx.log(f"scheduling: both teams queued {n} trials each; measuring {z.window_s:g} s")
        t0 = max(tap.submitted_at(e) for e in exps) + z.trial_s
        window = sm.Window(t0, t0 + z.window_s)
        await tap.wait(
            lambda: max(tap.latest(e) for e in exps) >= window.end, deadline, "the share window"
        )
        starts = [(team, t) for e, team in exps.items() for t in tap.start_times(e)]
        if any(tap.started(e) >= st.published[e] for e in exps):
            raise RuntimeError(f"a team ran out of work ({n} trials) before the window ended")
        return sm.shares_in(starts, window), quotas_file is not None


def run(ctx: Context) -> BenchResult:
    """Both scenarios once per run; the figures are medians over runs."""
    z = sizes(ctx.quick)
    weights = PriorityClasses.parse(os.environ.get("TRIALBUS_PRIORITY_CLASSES", DEFAULT_CLASSES))
    rule = sm.class_share(
        {c: weights.weight(c) for c in weights.names}, ["urgent", "batch"], "urgent"
    )
    prio: list[PriorityOutcome] = []
    shares: list[dict[str, float]] = []
    loads: list[float] = []
    fair_share_on = False
    for i in range(ctx.runs):
        ctx.log(f"scheduling run {i + 1}/{ctx.runs}: {z.batch:,} batch + {z.urgent} urgent")
        prio.append(asyncio.run(_priority(ctx, z, fresh_dir(ctx.path(f"sched-prio-{i}")))))
        loads.append(load_average()[0])
        measured, fair_share_on = asyncio.run(
            _shares(ctx, z, fresh_dir(ctx.path(f"sched-share-{i}")))
        )
        shares.append(measured)
        loads.append(load_average()[0])
        p = prio[-1]
        ctx.log(
            f"scheduling: B first start {p.contended.first_start_s:.2f}s vs "
            f"{p.alone.first_start_s:.2f}s alone, completion "
            f"{p.contended.completion_s:.1f}s vs {p.alone.completion_s:.1f}s; "
            f"shares {measured}"
        )
    return _result(z, prio, shares, loads, rule, fair_share_on, ctx.runs)


def _result(
    z: Sizes,
    prio: list[PriorityOutcome],
    shares: list[dict[str, float]],
    loads: list[float],
    rule: float,
    fair_share_on: bool,
    runs: int,
) -> BenchResult:
    completion = [sm.latency_ratio(p.contended.completion_s, p.alone.completion_s) for p in prio]
    first = [sm.latency_ratio(p.contended.first_start_s, p.alone.first_start_s) for p in prio]
    deviation = [sm.share_deviation(s, SHARES) for s in shares]
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
            med([_added(p) for p in prio]),
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
            "b_completion_model_s",
            med([sm.trickle_s(z.urgent, z.fleet, z.trial_s, rule, _added(p)) for p in prio]),
            "s",
            f"the rule's floor behind A: the wait above, then {rule:.3f} of the starts as "
            f"slots free (alone: {sm.waves_s(z.urgent, z.fleet, z.trial_s):g} s in waves)",
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
