"""Judge an experiment's outcome from what the system itself recorded.

Counting ledger records per trial_id proves nothing: the ledger's unique index makes
that count 1 by construction. What can really go wrong after a fault is judged here
from the events stream and the ledger together:

- **duplicates**: a result accepted more than once. A run (one work message, keyed by
  ``run_id``) that ended more than once (two TrialCompleted, or a TrialCompleted and a
  final TrialFailed), or a trial whose ledger record was changed by more
  ResultImported(changed=true) than it had runs (a second result overwrote the first).
- **stale**: a record whose content is not the last finished run's: its attempt, trial
  folder or finish time belong to another run, or it differs from what the importer
  last announced for it (a record written behind the importer's back).
- **missing**: submitted trials without a record; **unexpected**: records of trials
  nobody submitted.

The check is a pure function, so its negative controls can plant each defect in
otherwise healthy data (tests/e2e/test_ledger_check.py).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from schemas.events import (
    Event,
    ResultImported,
    TrialCompleted,
    TrialFailed,
    TrialStarted,
)
from schemas.record import TrialRecord

CLOCK_SLACK = timedelta(seconds=0.5)
"""Tolerance when a result's finish time is placed inside its run (one host clock)."""

Outcome = TrialCompleted | TrialFailed


@dataclass
class LedgerCheck:
    """What a fault test reports; ``ok`` only when nothing went wrong."""

    submitted: int
    ledgered: int
    duplicates: int
    stale: int
    missing: int
    unexpected: int
    reruns: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No duplicate, stale, missing or unexpected result."""
        return not (self.duplicates or self.stale or self.missing or self.unexpected)

    def explain(self, limit: int = 20) -> str:
        """The first ``limit`` problems, one a line (for assertion messages)."""
        more = len(self.problems) - limit
        lines = self.problems[:limit] + ([f"... and {more} more"] if more > 0 else [])
        return "\n".join(lines) or "no problems"


def _run_key(event: TrialStarted | Outcome) -> str:
    return event.run_id or event.trial_id


def _final_outcomes(events: Iterable[Event]) -> list[Outcome]:
    return [
        e
        for e in events
        if isinstance(e, TrialCompleted) or (isinstance(e, TrialFailed) and e.final)
    ]


def _describe(outcome: Outcome, start: TrialStarted | None) -> str:
    """``completed@2 runner-1 12:00:01.250-12:00:02.300``: what ended, who ran it, when."""
    kind = "completed" if isinstance(outcome, TrialCompleted) else "failed(final)"
    who = f" {start.runner_id} {start.occurred_at:%H:%M:%S.%f}"[:-3] if start else ""
    return f"{kind}@{outcome.attempt}{who}-{outcome.occurred_at:%H:%M:%S.%f}"[:-3]


def check_ledger(
    experiment_id: str,
    expected: set[str],
    events: Sequence[Event],
    records: Sequence[TrialRecord],
) -> LedgerCheck:
    """Compare the experiment's events with its ledger records (see the module doc)."""
    evs = [e for e in events if e.experiment_id == experiment_id]
    problems: list[str] = []

    # One final outcome per run.
    by_run: dict[str, list[Outcome]] = defaultdict(list)
    runs_of: dict[str, set[str]] = defaultdict(set)
    starts: dict[tuple[str, int], TrialStarted] = {}
    for e in evs:
        if isinstance(e, TrialStarted):
            runs_of[e.trial_id].add(_run_key(e))
            starts.setdefault((_run_key(e), e.attempt), e)
    for o in _final_outcomes(evs):
        by_run[_run_key(o)].append(o)
        runs_of[o.trial_id].add(_run_key(o))
    duplicates = 0
    for run, outcomes in by_run.items():
        if len(outcomes) > 1:
            duplicates += len(outcomes) - 1
            seen = ", ".join(_describe(o, starts.get((run, o.attempt))) for o in outcomes)
            problems.append(f"duplicate: run {run} ended {len(outcomes)} times ({seen})")

    # A record changed at most once per run of its trial.
    imports = [e for e in evs if isinstance(e, ResultImported)]
    accepted = Counter(e.trial_id for e in imports if e.changed)
    for trial, n in accepted.items():
        allowed = max(1, len(runs_of.get(trial, ())))
        if n > allowed:
            duplicates += n - allowed
            problems.append(
                f"duplicate: trial {trial}: record changed by {n} imports for {allowed} run(s)"
            )

    # Each record is the last finished run's, as the importer announced it.
    last_outcome: dict[str, Outcome] = {}
    for o in _final_outcomes(evs):
        last_outcome[o.trial_id] = o
    last_import: dict[str, ResultImported] = {e.trial_id: e for e in imports}
    stale = 0
    for rec in records:
        why = _staleness(rec, last_outcome.get(rec.trial_id), last_import.get(rec.trial_id), starts)
        if why:
            stale += 1
            problems.append(f"stale: trial {rec.trial_id}: {why}")

    ids = {r.trial_id for r in records}
    missing = sorted(expected - ids)
    unexpected = sorted(ids - expected)
    problems += [f"missing: trial {t} has no record" for t in missing]
    problems += [f"unexpected: trial {t} was never submitted" for t in unexpected]
    started = Counter(e.trial_id for e in evs if isinstance(e, TrialStarted))
    return LedgerCheck(
        submitted=len(expected),
        ledgered=len(ids),
        duplicates=duplicates,
        stale=stale,
        missing=len(missing),
        unexpected=len(unexpected),
        reruns=sum(n - 1 for n in started.values()),
        problems=problems,
    )


def _staleness(
    rec: TrialRecord,
    outcome: Outcome | None,
    announced: ResultImported | None,
    starts: dict[tuple[str, int], TrialStarted],
) -> str | None:
    """Why ``rec`` is not the last finished run's result, or None when it is."""
    if outcome is None:
        return "no run of this trial ended on the bus"
    if rec.attempts != outcome.attempt:
        return f"record is attempt {rec.attempts}, the last run ended at attempt {outcome.attempt}"
    if isinstance(outcome, TrialFailed):
        if rec.evaluation.failure_class != outcome.failure_class:
            return (
                f"record says {rec.evaluation.failure_class!r}, the run failed "
                f"{outcome.failure_class!r}"
            )
    else:
        stored = rec.artifacts.archive
        if stored != outcome.result:
            named = stored.name if stored else None
            return f"record was built from {named}, the run stored {outcome.result.name}"
        finished = rec.timing.finished_at
        if finished is not None and finished > outcome.occurred_at + CLOCK_SLACK:
            return f"result finished at {finished}, after its run completed"
        start = starts.get((_run_key(outcome), outcome.attempt))
        began = start.occurred_at if start is not None else None
        if finished is not None and began is not None and finished < began - CLOCK_SLACK:
            return f"result finished at {finished}, before its run started"
    if announced is None:
        return "the importer never announced this record"
    said = (announced.status, announced.scored, announced.main_reward)
    has = (rec.status, rec.evaluation.reward_valid, rec.evaluation.main_reward)
    if said != has:
        return f"record (status, scored, reward) {has} != announced {said}"
    return None
