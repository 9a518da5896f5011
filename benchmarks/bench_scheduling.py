"""11. Scheduling on a shared fleet: an urgent team behind a deep batch queue, two batch teams.

A fresh embedded stack (nats-server, the ledger, importer, watcher, submitter and R
runner processes of C slots each: R x C slots, the instant executor waiting S seconds
per trial, as in the capacity benchmark) runs two scenarios, each judged from the
events' own timestamps (``occurred_at`` of ExperimentSubmitted, TrialStarted,
TrialCompleted and ResultImported, read by a JetStream ordered consumer), never from
polling:

- **Priority**, twice: with team A's batch experiment ``compute.preemptible: true``
  (the headline: how an operator runs a sweep that must yield) and without it
  (figures ``nonpreempt_*``). Team B submits U urgent trials to the empty fleet (B
  alone); then team A submits the issue's 10,000 batch trials
  (``compute.priority_class: batch``), and once A fills the fleet in steady state, B
  submits U urgent trials again. B's **first start** (its ExperimentSubmitted to its
  first TrialStarted) and **completion** (to its last trial's first ResultImported)
  are compared with B alone (the issue's target: within 10 %); B's last
  TrialCompleted (``finished``) is compared too, which leaves out the importer's lag.
  A's start rate in the window where B waits for slots, against the same length
  before B arrived, gives **A's throughput loss**, and A's completions short of its
  rate before (over B's run and a while after) the **trials A lost**. Every trial of
  A handed back by a preemption (a non-final TrialFailed ``cancelled`` /
  ``Preempted``) must start again at attempt 1 and be recorded once, scored, with
  ``attempts`` 1 (benchmarks.scheduling_preemption); the non-preemptible variant
  must show none. B's share of the starts while both wait is compared with what the
  runners' weighted round robin promises (``weight_urgent / (weight_urgent +
  weight_batch)``).
- **Shares.** On another fresh stack, team A then team B each submit a batch
  experiment larger than a minute of the fleet's starts; over a minute that starts
  one trial length after B's submission, each team's share of the starts is
  compared with its configured share (the issue's target: within 5 points). The
  configured shares go to the quotas file (``TRIALBUS_QUOTAS_FILE``, field
  ``SHARE_FIELD``, read by the submitter: fair share, docs/scheduling.md). The
  slots each team keeps busy and the batch durable's deliveries a second (starts
  plus fair share's hand-backs) say where the time goes.

Quick mode (``make bench-quick``) uses smaller sizes; ``TRIALBUS_BENCH_SCHEDULING``
overrides them as ``A:U:R:C:S:W`` (batch trials, urgent trials, runners, slots per
runner, trial seconds, share window seconds).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from benchmarks import scheduling_math as sm
from benchmarks.harness import BenchResult, Context, fresh_dir, load_average
from benchmarks.scheduling_figures import (
    SHARES,
    PriorityOutcome,
    SharesOutcome,
    Sizes,
    UrgentRun,
    result,
)
from benchmarks.scheduling_preemption import judge, preempted_trials
from benchmarks.scheduling_run import (
    SchedulingStack,
    Tap,
    classed_manifest,
    share_quotas,
)
from services.common.priority import DEFAULT_CLASSES, PriorityClasses

ENV = "TRIALBUS_BENCH_SCHEDULING"
FULL = Sizes(batch=10_000, urgent=100, runners=2, slots=10, trial_s=2.0, window_s=60.0)
QUICK = Sizes(batch=400, urgent=8, runners=1, slots=8, trial_s=1.0, window_s=5.0)


def sizes(quick: bool) -> Sizes:
    """This run's sizes: the mode's, or ``TRIALBUS_BENCH_SCHEDULING``."""
    raw = os.environ.get(ENV)
    if not raw:
        return QUICK if quick else FULL
    a, u, r, c, s, w = raw.split(":")
    return Sizes(int(a), int(u), int(r), int(c), float(s), float(w))


def _urgent_run(tap: Tap, exp: str) -> UrgentRun:
    t0 = tap.submitted_at(exp)
    return UrgentRun(
        tap.first_start(exp) - t0,
        tap.last_start(exp) - t0,
        tap.last_completion(exp) - t0,
        tap.last_import(exp) - t0,
    )


async def _priority(ctx: Context, z: Sizes, run_dir: Path, preemptible: bool) -> PriorityOutcome:
    deadline = 120 + 20 * z.trial_s * (1 + z.urgent / z.fleet)
    async with SchedulingStack(run_dir, z.runners, z.slots, z.trial_s) as st:
        await st.warm_up(run_dir)
        tap = st.tap
        alone = await st.submit(classed_manifest(run_dir, "b-alone", z.urgent, "urgent", z.urgent))
        await tap.wait(
            lambda: tap.imported(alone) >= st.published[alone], deadline, f"{alone} imported"
        )
        # A runs twice B's time alone before B comes: the window before B is steady state.
        lead_s = max(2 * (tap.last_completion(alone) - tap.submitted_at(alone)), 6 * z.trial_s)
        kind = "preemptible" if preemptible else "non-preemptible"
        ctx.log(f"scheduling: B alone done; submitting A's {z.batch:,} {kind} batch trials")
        batch = await st.submit(
            classed_manifest(run_dir, "a-batch", z.batch, "batch", z.batch, preemptible=preemptible)
        )
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
        # A's trials started in waves and keep that rhythm, so its rate is counted over
        # whole trial lengths: any such window holds as many waves, whatever its phase.
        span = sm.whole_trials(max(contended.seconds, 4 * z.trial_s), z.trial_s)
        # A's completions are counted up to one span after B: by then A runs as before.
        lent = sm.Window(b_sub, b_sub + sm.whole_trials(b_done + span - b_sub, z.trial_s))
        await tap.wait(
            lambda: min(tap.latest(batch), tap.latest_completion(batch)) >= lent.end,
            deadline,
            f"{batch} after B",
        )
        # Every preempted trial of A must run again and be recorded (none lost).
        handed = preempted_trials(tap.history(batch))
        await tap.wait(
            lambda: all(tap.is_imported(batch, t) for t in handed),
            deadline,
            f"{batch}'s {len(handed)} preempted trials recorded",
        )
        check = judge(tap.history(batch), await st.records(handed))
        a_starts, b_starts = tap.start_times(batch), tap.start_times(urgent)
        # Never A's first wave: its starts all came at once, not at the steady rate.
        steady_s = b_sub - (tap.first_start(batch) + z.trial_s)
        before = sm.Window(b_sub - min(span, z.trial_s * (steady_s // z.trial_s)), b_sub)
        after = sm.Window(b_done, b_done + span)
        both = [("A", t) for t in a_starts] + [("B", t) for t in b_starts]
        a_done = tap.completion_times(batch)
        return PriorityOutcome(
            alone=_urgent_run(tap, alone),
            contended=_urgent_run(tap, urgent),
            urgent_share=sm.shares_in(both, contended).get("B", 0.0),
            a_before=sm.rate(a_starts, before),
            a_during=sm.rate(a_starts, contended),
            a_after=sm.rate(a_starts, after),
            fleet_during=sm.rate(a_starts + b_starts, contended),
            window_s=contended.seconds,
            a_trials_lost=sm.rate(a_done, before) * lent.seconds - sm.count_in(a_done, lent),
            preemption=check,
        )


async def _shares(ctx: Context, z: Sizes, run_dir: Path) -> SharesOutcome:
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
        await tap.wait(lambda: max(tap.latest(e) for e in exps) >= t0, deadline, "the window")
        # The durable's deliveries over the window: each start, and each hand-back.
        sent0 = await st.deliveries("batch")
        w0 = time.time()
        await tap.wait(
            lambda: max(tap.latest(e) for e in exps) >= window.end, deadline, "the share window"
        )
        sent1 = await st.deliveries("batch")
        wall = time.time() - w0
        starts = [(team, t) for e, team in exps.items() for t in tap.start_times(e)]
        if any(tap.started(e) >= st.published[e] for e in exps):
            raise RuntimeError(f"a team ran out of work ({n} trials) before the window ended")
        now = time.time()
        return SharesOutcome(
            shares=sm.shares_in(starts, window),
            in_flight={team: sm.in_flight(tap.spans(e, now), window) for e, team in exps.items()},
            deliveries_per_s=(sent1 - sent0) / wall,
            starts_per_s=sm.count_in((t for _, t in starts), window) / window.seconds,
            fair_share_on=quotas_file is not None,
        )


def run(ctx: Context) -> BenchResult:
    """Both scenarios once per run; the figures are medians over runs."""
    z = sizes(ctx.quick)
    weights = PriorityClasses.parse(os.environ.get("TRIALBUS_PRIORITY_CLASSES", DEFAULT_CLASSES))
    rule = sm.class_share(
        {c: weights.weight(c) for c in weights.names}, ["urgent", "batch"], "urgent"
    )
    prio: list[PriorityOutcome] = []
    fifo: list[PriorityOutcome] = []
    shares: list[SharesOutcome] = []
    loads: list[float] = []
    for i in range(ctx.runs):
        ctx.log(f"scheduling run {i + 1}/{ctx.runs}: {z.batch:,} batch + {z.urgent} urgent")
        prio.append(asyncio.run(_priority(ctx, z, fresh_dir(ctx.path(f"sched-preempt-{i}")), True)))
        loads.append(load_average()[0])
        fifo.append(asyncio.run(_priority(ctx, z, fresh_dir(ctx.path(f"sched-prio-{i}")), False)))
        loads.append(load_average()[0])
        measured = asyncio.run(_shares(ctx, z, fresh_dir(ctx.path(f"sched-share-{i}"))))
        shares.append(measured)
        loads.append(load_average()[0])
        for label, p in (("preemptible A", prio[-1]), ("non-preemptible A", fifo[-1])):
            ctx.log(
                f"scheduling, {label}: B first start {p.contended.first_start_s:.2f}s vs "
                f"{p.alone.first_start_s:.2f}s alone, completion "
                f"{p.contended.completion_s:.1f}s vs {p.alone.completion_s:.1f}s; "
                f"A lost {p.a_trials_lost:.0f} trials; {p.preemption}"
            )
        ctx.log(f"scheduling: shares {measured}")
    return result(z, prio, fifo, shares, loads, rule, ctx.runs)
