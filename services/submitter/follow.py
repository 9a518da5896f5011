"""The CLI's live views: ``trialbus experiments``, ``status --follow``, ``trials``,
``logs``, ``runners`` and ``queue``. Each opens what it needs (connections.py), reads, and closes.

What the ledger knows is read through services.reports.queries (the one read path,
shared with the dashboard); what only the bus knows (trials running now, live log
lines, the runner registry) through the submitter's NATS connection, with the rights
the submitter role already has: following the events and logs streams (read only)
and reading the runners bucket (infra/nats_permissions.py).

About 410 lines because each live view is a few lines of reading over the same
connections; split by view, each module would repeat the opening and closing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from infra.nats_permissions import kv_stream
from schemas.events import Envelope, TrialFailed, TrialLog
from services.common.adapters.nats_registry import NatsRunnerRegistry
from services.common.errors import UserInputError
from services.common.fair_share import SHARE_MARK, TeamShare, current_share
from services.common.ports import Coordinator, ExperimentInfo, Ledger
from services.common.quotas import Quotas, load_quotas
from services.common.settings import CommonSettings, SubmitterSettings
from services.reports import queries
from services.reports.progress import ExperimentRow, RunnerRow, runner_rows
from services.reports.queue import (
    QueueView,
    capped_teams,
    lease_counts,
    parse_work_subject,
    queue_view,
    share_judge,
)
from services.reports.report_cache import ReportCache
from services.reports.trials import experiment_trials
from services.submitter.api_tokens import owner_from_record
from services.submitter.connections import NatsSide, open_ledger, open_nats, try_open_nats
from services.submitter.live_feeds import (
    LiveFeeds,
    StartedTrials,
    valid_experiment_id,
    valid_trial_id,
)

UPDATE_INTERVAL_S = 0.5
"""``status --follow`` redraws at most this often while events arrive."""
REFRESH_S = 5.0
"""... and at least this often when none does (duration, rate and ETA move on)."""
LOG_QUIET_S = 1.0
"""``logs -f`` asks the ledger whether the trial has its record after this long quiet."""
HISTORY_READ_S = 5.0
"""Reading the lines a stream holds may take at most this long."""
QUEUE_READS_AT_ONCE = 16
"""``read_queue`` reads this many experiments side by side (one after another, 100
took 0.5-0.65 s on the loaded test machine: a ledger and two KV round trips each)."""


def started_of(live: LiveFeeds) -> queries.StartedOf:
    """The ids of an experiment's started trials, from its TrialStarted events."""

    async def started(experiment_id: str) -> Iterable[str]:
        if not valid_experiment_id(experiment_id):
            return ()  # an imported job's id may not be one the bus can carry
        return (await live.started_trials(experiment_id)).keys()

    return started


def spend_capped_of(coordinator: Coordinator, quotas: Quotas | None) -> queries.TeamCappedOf | None:
    """Whether a team's rolling 24-h spend tally reached its ``max_spend_usd_per_day``
    in ``quotas`` (None without a quotas file: nothing to judge by)."""
    if quotas is None:
        return None
    known = quotas

    async def capped(team: str) -> bool:
        quota = known.for_team(team)
        cap = quota.max_spend_usd_per_day if quota else None
        return cap is not None and await coordinator.tally("spend", team, fresh=True) >= cap

    return capped


def lookups_of(
    coordinator: Coordinator, *, quotas: Quotas | None = None, live: LiveFeeds | None = None
) -> queries.Lookups:
    """The reports' ``queries.Lookups`` from the coordinator: its pause flags, and with
    ``quotas`` the teams' spend caps (``spend_capped_of``); with ``live``, the started
    trials (``started_of``)."""
    return queries.Lookups(
        started_of=started_of(live) if live is not None else None,
        paused_of=coordinator.is_paused,
        paused_trials_of=coordinator.paused_trials,
        team_capped_of=spend_capped_of(coordinator, quotas),
    )


def cli_quotas(settings: CommonSettings) -> Quotas | None:
    """The submitter's quotas file (``TRIALBUS_QUOTAS_FILE``), read as ``submit`` does;
    None when unset."""
    sub = SubmitterSettings(**settings.model_dump())
    return load_quotas(sub.quotas_file) if sub.quotas_file is not None else None


async def list_experiments(settings: CommonSettings) -> list[ExperimentRow]:
    """``trialbus experiments``: every experiment's row, newest first."""
    async with (
        open_nats(settings, "trialbus-experiments") as nats,
        open_ledger(settings) as ledger,
    ):
        live = LiveFeeds(nats.nc, nats.settings.topology)
        return await queries.experiment_rows(
            ledger, lookups_of(await nats.coordinator(), live=live)
        )


async def experiment_status(
    settings: CommonSettings, experiment_id: str
) -> tuple[dict[str, int | str | bool], bool]:
    """``trialbus status EXP``: (the counts of ``queries.experiment_status`` with
    ``paused``, whether NATS answered). The pause flag lives on the bus (the control
    bucket); the counts need only the ledger, so without NATS they still come, with
    ``paused`` absent (unknown) rather than False. With a quotas file,
    ``team_spend_capped`` when its team reached its spend cap."""
    quotas = cli_quotas(settings)
    async with (
        open_ledger(settings) as ledger,
        try_open_nats(settings, "trialbus-status") as nats,
    ):
        lookups = queries.NOTHING_KNOWN
        if nats is not None:
            live = LiveFeeds(nats.nc, nats.settings.topology)
            lookups = lookups_of(await nats.coordinator(), quotas=quotas, live=live)
        status = await queries.experiment_status(ledger, experiment_id, lookups)
        return status, nats is not None


async def trial_list(
    settings: CommonSettings, experiment_id: str | None
) -> tuple[str, list[dict[str, Any]], bool]:
    """``trialbus trials``: (experiment id, its trials' lines with the running ones
    first, whether NATS answered). The starts live on the bus; without it the recorded
    trials still come."""
    async with (
        open_ledger(settings) as ledger,
        try_open_nats(settings, "trialbus-trials") as nats,
    ):
        live = LiveFeeds(nats.nc, nats.settings.topology) if nats is not None else None
        starts_of = live.started_trials if live is not None else None
        exp_id, lines = await experiment_trials(ledger, experiment_id, starts_of=starts_of)
        return exp_id, lines, nats is not None


async def follow_status(
    settings: CommonSettings,
    experiment_id: str,
    on_update: Callable[[ExperimentRow], None],
    *,
    timeout_s: float | None = None,
    on_line: Callable[[str, LogLine], None] | None = None,
    on_failure: Callable[[TrialFailed], None] | None = None,
) -> ExperimentRow:
    """``trialbus status EXP --follow``: call ``on_update`` with the experiment's row
    now and after its events, until every trial is recorded (or ``timeout_s``).
    ``trialbus attach EXP``: with ``on_line``, also each live log line of its trials
    (trial id, line) published from the call on; with ``on_failure``, each failed
    attempt of its trials (retried or final; cancellations are not).

    Subscribed to the experiment's events (and logs) before the first read, so no
    change slips between the read and the subscription. Raises ExperimentNotFound for
    an experiment the ledger does not know.
    """
    if not valid_experiment_id(experiment_id):
        raise UserInputError(f"{experiment_id!r} is not an experiment id")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    async with open_nats(settings, "trialbus-status") as nats, open_ledger(settings) as ledger:
        live = LiveFeeds(nats.nc, nats.settings.topology)
        # Started trials from the feed below, not a read of the history each redraw.
        started = StartedTrials(live, experiment_id)

        async def started_of(_experiment_id: str) -> Iterable[str]:
            return (await started.current()).keys()

        lookups = replace(lookups_of(await nats.coordinator()), started_of=started_of)
        # A refresh without a new record reads the content version, not every record.
        cache = ReportCache()
        async with (
            live.experiment_events(experiment_id) as feed,
            _lines(live, experiment_id, on_line),
        ):
            row = await queries.experiment_progress(ledger, experiment_id, lookups, cache=cache)
            on_update(row)
            while not row.progress.finished:
                left = REFRESH_S if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    break
                event = await feed.next(min(REFRESH_S, left))
                if event is not None:
                    # Gather what else arrives in the next moment: one redraw for a burst.
                    until = time.monotonic() + UPDATE_INTERVAL_S
                    while event is not None:
                        started.seen(event)
                        _failed(event, on_failure)
                        rest = until - time.monotonic()
                        event = await feed.next(rest) if rest > 0 else None
                row = await queries.experiment_progress(ledger, experiment_id, lookups, cache=cache)
                on_update(row)
    return row


def _failed(event: Envelope, on_failure: Callable[[TrialFailed], None] | None) -> None:
    """Pass a failed attempt to ``on_failure`` (a cancellation says so itself)."""
    if (
        on_failure is not None
        and isinstance(event, TrialFailed)
        and event.failure_class != "cancelled"
    ):
        on_failure(event)


@contextlib.asynccontextmanager
async def _lines(
    live: LiveFeeds, experiment_id: str, on_line: Callable[[str, LogLine], None] | None
) -> AsyncIterator[None]:
    """While open, pass the experiment's live log lines to ``on_line`` (None: nothing).
    On leaving, the lines still arriving are passed on until LOG_QUIET_S of quiet: a
    trial's lines are all published before its result, so none comes later."""
    if on_line is None:
        yield
        return
    async with live.experiment_logs(experiment_id) as logs:
        done = asyncio.Event()

        async def pump() -> None:
            while True:
                event = await logs.next(LOG_QUIET_S)
                if isinstance(event, TrialLog):
                    on_line(event.trial_id, LogLine(event.phase, event.stream, event.text))
                elif event is None and done.is_set():
                    return

        task = asyncio.create_task(pump())
        try:
            yield
        except BaseException:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise
        done.set()
        # Lines that keep coming after the experiment ended: stop anyway.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(task, LOG_QUIET_S + HISTORY_READ_S)


@dataclass(frozen=True, slots=True)
class LogLine:
    """One live log chunk of a trial."""

    phase: str
    stream: str
    text: str

    def as_dict(self) -> dict[str, str]:
        """JSON form (``logs --json``: one object per line)."""
        return asdict(self)


async def trial_logs(
    settings: CommonSettings, trial_id: str, on_line: Callable[[LogLine], None], *, follow: bool
) -> int:
    """``trialbus logs TRIAL [-f]``: the trial's live log lines, oldest first; the count.

    Without ``follow``: the lines the logs stream holds now (it keeps them 2 days).
    With it: those, then new ones until the trial's record is in the ledger (every
    line was published before the trial's result, so none comes after it).
    """
    if not valid_trial_id(trial_id):
        raise UserInputError(f"{trial_id!r} is not a trial id")
    topology = settings.topology
    async with open_nats(settings, "trialbus-logs") as nats, open_ledger(settings) as ledger:
        feeds = LiveFeeds(nats.nc, topology)
        subject = f"{topology.prefix}.logs.*.{trial_id}"

        async def held() -> int:
            return await feeds.held(topology.logs_stream, subject)

        seen = 0
        async with feeds.trial_log(trial_id) as feed:

            async def read_until(count: int, timeout_s: float) -> None:
                nonlocal seen
                async for event in feed.take(count - seen, time.monotonic() + timeout_s):
                    seen += 1
                    if isinstance(event, TrialLog):
                        on_line(LogLine(event.phase, event.stream, event.text))

            if not follow:
                await read_until(await held(), HISTORY_READ_S)
                return seen
            while True:
                # Lines as they come; after a quiet moment, ask whether the trial ended.
                await read_until(seen + 1_000_000, LOG_QUIET_S)
                if await ledger.get_record(trial_id) is not None:
                    await read_until(await held(), HISTORY_READ_S)
                    return seen


async def fleet(registry: NatsRunnerRegistry) -> list[RunnerRow]:
    """The runner fleet: the registry's live records, stale ones marked. The one read
    path of ``trialbus runners``, ``GET /runners`` and the dashboard's fleet page."""
    return runner_rows(await registry.live_runners(), registry.heartbeat_s)


async def list_runners(settings: CommonSettings) -> list[RunnerRow]:
    """``trialbus runners``: the fleet (``fleet``)."""
    async with open_nats(settings, "trialbus-runners") as nats:
        return await fleet(await nats.registry())


async def read_queue(nats: NatsSide, ledger: Ledger, quotas: Quotas | None = None) -> QueueView:
    """What waits, per pool, class and team, and why (services.reports.queue). The one
    read path of ``trialbus queue``, ``GET /queue`` and the dashboard's queue page.

    Two stream infos with a subject filter (the work stream's messages per subject,
    the leases bucket's keys, share marks included), then per experiment with queued
    work one ledger read, its pause flags (and a record read per trial paused one by
    one) and its team and share (fair share's ``over_share``: by the shares last
    published, as runners judge; ``current_share``), the runner registry
    once, and with ``quotas`` (the submitter's quotas file) the spend tally of each
    waiting team with a spend cap once: the cost grows with the
    experiments that wait, not with their trials. The subject details of one stream
    info stop at nats-server's limit (100,000 subjects), far beyond the experiments
    one installation queues at once.
    """
    topology = nats.settings.topology
    coordinator = await nats.coordinator()  # opens (or makes) the leases bucket too
    js = nats.nc.jetstream()
    work = await js.stream_info(topology.work_stream, subjects_filter=topology.work_wildcard)
    leases = await js.stream_info(
        kv_stream(topology.leases_bucket), subjects_filter=f"$KV.{topology.leases_bucket}.>"
    )
    counts = dict(work.state.subjects or {})
    experiments = sorted(
        {p[2] for s, n in counts.items() if n and (p := parse_work_subject(topology, s))}
    )

    at_once = asyncio.Semaphore(QUEUE_READS_AT_ONCE)

    async def about(exp: str) -> tuple[ExperimentInfo | None, bool, int, TeamShare | None]:
        async with at_once:
            paused_trials = set(await coordinator.paused_trials(exp))
            return (
                await ledger.get_experiment(exp),
                await coordinator.is_paused(exp),
                len(await queries.unrecorded(ledger, exp, paused_trials)),
                await coordinator.share_of(exp),
            )

    found = dict(zip(experiments, await asyncio.gather(*map(about, experiments)), strict=True))
    infos = {exp: f[0] for exp, f in found.items()}
    paused = {exp: f[1] for exp, f in found.items()}
    one_by_one = {exp: f[2] for exp, f in found.items()}
    head = f"$KV.{topology.leases_bucket}."
    lease_keys = leases.state.subjects or {}
    marks = {s[len(head) :]: n for s, n in lease_keys.items() if s.startswith(head + SHARE_MARK)}
    # Judged by the shares runners use: those last published (quota.limits), if any.
    limits = await coordinator.team_limits()
    shares = {
        exp: None if t is None else current_share(t, limits) for exp, (*_, t) in found.items()
    }
    judge = share_judge(topology, nats.settings.classes, counts, shares, paused, marks)
    runners = await (await nats.registry()).live_runners()
    capped: dict[str, str] = {}
    if quotas is not None:
        teams = {
            owner.team
            for info in infos.values()
            if info is not None
            and (owner := owner_from_record(info.manifest.get("submitted_by"))) is not None
            and owner.team is not None
            and (quota := quotas.for_team(owner.team)) is not None
            and quota.max_spend_usd_per_day is not None
        }
        spent = {team: await coordinator.tally("spend", team, fresh=True) for team in teams}
        capped = capped_teams(quotas, spent)
    return queue_view(
        topology,
        nats.settings.classes,
        counts,
        lease_counts(topology.leases_bucket, lease_keys),
        infos,
        paused,
        runners,
        one_by_one,
        capped,
        judge,
    )


async def list_queue(settings: CommonSettings) -> QueueView:
    """``trialbus queue``: what waits and why (``read_queue``), with the submitter's
    quotas file when one is set (``TRIALBUS_QUOTAS_FILE``, read as ``submit`` does)."""
    quotas = cli_quotas(settings)
    async with open_nats(settings, "trialbus-queue") as nats, open_ledger(settings) as ledger:
        return await read_queue(nats, ledger, quotas)
