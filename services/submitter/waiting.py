"""Following a submission until its trials are recorded (``trialbus submit --wait``).

``follow`` counts this submission's trials as their ResultImported events arrive and
reads the ledger for the rest; it prints progress, each failed attempt of the
submission's trials (``failure_line``) and, when interrupted, what became of the
experiment. services.submitter.handlers.submit_and_wait submits, then calls it.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from schemas.events import ResultImported, TrialFailed, parse_event
from services.common.ports import Ledger
from services.reports.leaderboard import status_counts
from services.reports.queries import load_experiment
from services.submitter.submit import SubmitResult

# How often the ledger is read while waiting: events say when to look sooner.
LEDGER_CHECK_INTERVAL_S = 2.0


class EventFeed(Protocol):
    """The events of one experiment, from the moment the feed was opened."""

    async def next_payload(self, timeout_s: float) -> bytes | None:
        """The next event's bytes, or None when none arrived within ``timeout_s``."""


class Printer(Protocol):
    """Where progress lines go (a rich Console)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        """Print one line."""


async def follow(
    feed: EventFeed,
    ledger: Ledger,
    result: SubmitResult,
    timeout_s: float,
    progress: Printer | None,
) -> dict[str, int]:
    """Wait until every trial of this submission is recorded (or the timeout).

    Trials this submission published count once their ResultImported carrying this
    submission's correlation id arrives (a re-run replaces an older record, so the
    ledger alone cannot tell). The others (already scored, or queued by a concurrent
    submission) count once the ledger holds a record for them.
    """
    deadline = time.monotonic() + timeout_s
    waiting = set(result.published_ids)
    others = set(result.trial_ids) - waiting
    last_line, next_check = "", 0.0
    counts: dict[str, int] = {}
    while True:
        now = time.monotonic()
        if now >= next_check or not waiting:
            _, info, records = await load_experiment(ledger, result.experiment_id, required=False)
            others -= {r.trial_id for r in records}
            counts = status_counts(records, info)
            counts["total"] = max(counts["total"], result.n_trials)
            counts["pending"] = len(waiting) + len(others)
            done = result.n_trials - counts["pending"]
            line = f"{done}/{result.n_trials} done, {counts['scored']} scored"
            if progress is not None and line != last_line:
                progress.print(f"[dim]{result.experiment_id}[/dim] {line}", highlight=False)
                last_line = line
            next_check = now + LEDGER_CHECK_INTERVAL_S
            if counts["pending"] <= 0 or now >= deadline:
                return counts
        data = await feed.next_payload(max(0.05, min(1.0, deadline - now)))
        if data is None:
            continue
        try:
            ev = parse_event(data)
        except ValueError:
            continue  # not ours to judge: the importer terminates poison
        if isinstance(ev, ResultImported) and ev.correlation_id == result.correlation_id:
            if ev.trial_id in waiting:
                waiting.discard(ev.trial_id)
                next_check = 0.0 if not waiting else next_check
        elif (
            isinstance(ev, TrialFailed)
            and progress is not None
            and ev.correlation_id == result.correlation_id
            and ev.failure_class != "cancelled"  # a cancellation says so itself
        ):
            # Plain text: a message may hold brackets ([redacted:NAME]) rich would read.
            progress.print(failure_line(ev), highlight=False, markup=False)


RETRY_DETAIL_CHARS = 160
"""How much of a retried attempt's message ``submit --wait`` shows (its first line)."""


def say(progress: Printer | None, line: str) -> None:
    """One plain line on ``progress`` (none with ``--json``)."""
    if progress is not None:
        progress.print(line, highlight=False, markup=False)


def failure_line(ev: TrialFailed) -> str:
    """The progress line of a failed attempt: the trial, which attempt, whether it is
    retried or the trial ends unscored, the error type and the first line of its
    message (the runner redacted it)."""
    first = ev.message.strip().split("\n", 1)[0] if ev.message else ""
    if len(first) > RETRY_DETAIL_CHARS:
        first = first[: RETRY_DETAIL_CHARS - 3] + "..."
    detail = f": {first}" if first else ""
    if ev.final:
        return (
            f"  {ev.trial_id} ended unscored ({ev.failure_class}) at attempt {ev.attempt}: "
            f"{ev.error_type}{detail}"
        )
    return f"  retrying {ev.trial_id} after attempt {ev.attempt}: {ev.error_type}{detail}"
