"""The watcher's decisions: when an experiment is complete; which external trials to announce.

Written against the ports (``EventBus``, ``Ledger``) only; ``services.watcher.app``
feeds it batches of events and timer ticks, and applies the verdicts it returns:

- poison is terminated (the importer logs it; the watcher only skips it);
- ExperimentSubmitted and ResultImported prompt a completion check of their
  experiment; everything else is acknowledged without work;
- a failed check naks the batch as ``settle_error`` says (ledger unreachable: the
  retry delay; a bug: the bug delay), its poison still terminated.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from pathlib import Path

from schemas.events import (
    EventDecodeError,
    ExperimentSubmitted,
    ResultImported,
    TrialCompleted,
    parse_event,
)
from services.common.errors import ACK, Settle, settle_error
from services.common.logging import bound_event, get_logger
from services.common.ports import EventBus, Ledger
from services.common.redaction import Redactor
from services.common.trial_folders import TrialFolders
from services.importer.jobdir import JobDirError, TrialDirInfo, scan_job_dir
from services.watcher.logic import RecordTally, completion_of, finished_external_jobs

log = get_logger(__name__)


class Watcher:
    """Publishes ExperimentCompleted; announces trials of external Harbor jobs.

    Holds, per experiment not yet complete, a RecordTally of the ResultImported events
    seen since the ledger was last counted, so most batches need no ledger query.
    ``redactor`` (services.watcher.secrets): the secrets redacted from what it stores,
    publishes and logs of external jobs (none: nothing redacted).
    """

    def __init__(
        self,
        ledger: Ledger,
        bus: EventBus,
        jobs_dir: Path,
        folders: TrialFolders,
        redactor: Redactor | None = None,
    ) -> None:
        self._ledger = ledger
        self._redactor = redactor or Redactor({})
        self._bus = bus
        self._jobs_dir = jobs_dir
        self._folders = folders
        self._announced_jobs: set[Path] = set()
        self._refused_reads: set[str] = set()  # logged once each, not on every scan
        self._tallies: dict[str, RecordTally] = {}
        self._correlation: dict[str, str] = {}
        # Trial id -> the experiment this process announced it for (external jobs),
        # until its record is seen: from then on the ledger says whose it is.
        self._claimed: dict[str, str] = {}

    @property
    def unrecorded_claims(self) -> int:
        """How many external trials this process announced that it has not seen
        recorded yet (what it remembers to keep a copied job from claiming them)."""
        return len(self._claimed)

    async def check(
        self,
        experiment_id: str,
        correlation_id: str,
        imported: Collection[str] = (),
        *,
        exact: bool = False,
    ) -> None:
        """Publish ExperimentCompleted if every trial is recorded.

        ``imported``: trial ids of the ResultImported events that prompted the check;
        the ledger is asked only when they may complete the experiment (``exact``
        always asks).
        """
        tally = self._tallies.setdefault(experiment_id, RecordTally())
        tally.since.update(imported)
        for trial_id in imported:  # recorded: the ledger knows whose it is now
            self._claimed.pop(trial_id, None)
        self._correlation[experiment_id] = correlation_id
        if exact:
            tally.counted = None
        done = await completion_of(self._ledger, experiment_id, correlation_id, tally)
        if done is None:
            return
        self._tallies.pop(experiment_id, None)
        self._correlation.pop(experiment_id, None)
        await self._bus.publish(done)
        log.info("experiment completed", experiment_id=experiment_id, n_scored=done.n_scored)

    async def recheck(self) -> None:
        """Ask the ledger about experiments with imports since their last count.

        A safety net for a tally that under-counts: with several watcher processes
        sharing the durable, each sees only part of the events.
        """
        for experiment_id, tally in list(self._tallies.items()):
            if tally.since:
                await self.check(experiment_id, self._correlation[experiment_id], exact=True)

    async def scan_external(self) -> int:
        """Announce the trials of finished Harbor jobs made outside trialbus.

        Returns how many TrialCompleted were published. A job is announced once per
        process, and a trial the ledger already holds is not announced again. Each
        trial folder is stored in the results bucket first: the importer may run on
        another machine. Trials that are another experiment's (a copied or renamed job
        folder: its folders' names are their trial ids) are left out of the job's
        experiment, with a warning, so that it can still complete (``_own_trials``).
        """
        n = 0
        refused: list[str] = []
        finished = await asyncio.to_thread(finished_external_jobs, self._jobs_dir, refused)
        redact = self._redactor.redact
        for problem in refused:
            if problem not in self._refused_reads:
                self._refused_reads.add(problem)
                log.warning("external job result not read", problem=redact(problem))
        for job in finished:
            if job in self._announced_jobs:
                continue
            try:
                trials = await asyncio.to_thread(scan_job_dir, job)
            except JobDirError as exc:
                # Not the job's to hold up the jobs after it; looked at again next scan
                # (the folder may be fixed), said once.
                if (problem := redact(str(exc))) not in self._refused_reads:
                    self._refused_reads.add(problem)
                    log.warning(
                        "external harbor job not announced: its folder cannot be imported",
                        job=redact(str(job)),
                        problem=problem,
                    )
                continue
            names = [job.name, *(t.trial_dir.name for t in trials)]
            if any(redact(name) != name for name in names):
                # Ids and names are made of these: a redacted one would not be an id.
                log.warning(
                    "external harbor job not announced: a folder name holds a secret "
                    "value; rename it",
                    job=redact(str(job)),
                )
                trials = []
            trials, recorded = await self._own_trials(job, trials)
            if not trials:
                self._announced_jobs.add(job)
                continue
            experiment_id = trials[0].context.experiment_id
            await self._bus.publish(
                ExperimentSubmitted(
                    experiment_id=experiment_id,
                    name=job.name,
                    n_trials=len(trials),
                    n_published=0,
                    manifest={"source": "external harbor job", "job_name": job.name, "agents": []},
                ),
                msg_id=f"{experiment_id}:external-submitted",
            )
            for t in trials:
                trial_id = t.context.trial_id
                if trial_id in recorded:
                    continue
                # Redacted as a runner's trial folders are (result.json, logs).
                stored = await self._folders.store_as(
                    f"external/{experiment_id}/{trial_id}.tar.gz",
                    t.trial_dir,
                    self._redactor.redact_file if self._redactor.needles else None,
                )
                await self._bus.publish(
                    TrialCompleted(
                        experiment_id=experiment_id,
                        trial_id=trial_id,
                        result=stored,
                        trial_name=t.trial_dir.name,
                        source="external",
                    )
                )
                n += 1
            self._announced_jobs.add(job)
            log.info("external harbor job announced", job=redact(str(job)), trials=len(trials))
        return n

    async def _own_trials(
        self, job: Path, trials: list[TrialDirInfo]
    ) -> tuple[list[TrialDirInfo], set[str]]:
        """(the trials of ``job`` that are its experiment's, the ids of those recorded).

        A trial is another experiment's when the ledger holds its record under that
        experiment, or when this process announced it for another job. The importer
        refuses to move a record between experiments, so announcing it here would leave
        the job's experiment waiting forever for a record it cannot get.
        """
        if not trials:
            return [], set()
        experiment_id = trials[0].context.experiment_id
        own: list[TrialDirInfo] = []
        recorded: set[str] = set()
        elsewhere: set[str] = set()
        for t in trials:
            trial_id = t.context.trial_id
            record = await self._ledger.get_record(trial_id)
            if record is None:
                owner = self._claimed.get(trial_id, experiment_id)
            else:
                owner = record.experiment_id
                self._claimed.pop(trial_id, None)
            if owner != experiment_id:
                elsewhere.add(owner)
                continue
            own.append(t)
            if record is not None:
                recorded.add(trial_id)
        if elsewhere:
            log.warning(
                "external harbor job: trials that are another experiment's are left out "
                "(a copied or renamed job folder?); `trialbus import --as-new` files the "
                "folder as a new experiment with trial ids of its own",
                job=self._redactor.redact(str(job)),
                experiment_id=experiment_id,
                left_out=len(trials) - len(own),
                other_experiments=sorted(elsewhere),
            )
        self._claimed.update(
            (t.context.trial_id, experiment_id) for t in own if t.context.trial_id not in recorded
        )
        return own, recorded


async def handle_batch(
    watcher: Watcher, payloads: Sequence[bytes], *, transient_delay_s: float
) -> list[Settle]:
    """Check the experiments a batch of events concerns; one verdict per message, in order."""
    settles: list[Settle] = []
    todo: dict[str, ExperimentSubmitted | ResultImported] = {}  # the latest per experiment
    imported: dict[str, set[str]] = {}
    for data in payloads:
        try:
            ev = parse_event(data)
        except EventDecodeError as exc:
            settles.append(settle_error(exc, transient_delay_s=transient_delay_s))
            continue
        settles.append(ACK)
        if isinstance(ev, ExperimentSubmitted | ResultImported):
            todo[ev.experiment_id] = ev
        if isinstance(ev, ResultImported):
            imported.setdefault(ev.experiment_id, set()).add(ev.trial_id)
    try:
        for experiment_id, ev in todo.items():
            with bound_event(ev):
                await watcher.check(
                    experiment_id, ev.correlation_id, imported.get(experiment_id, ())
                )
    except Exception as exc:  # noqa: BLE001 - settle_error decides; nothing is acked
        verdict = settle_error(exc, transient_delay_s=transient_delay_s)
        if verdict.reason == "transient":
            log.warning("ledger unavailable; batch will be redelivered", error=str(exc))
        else:
            log.error("completion check failed; batch will be redelivered", exc_info=exc)
        return [s if s.action == "term" else verdict for s in settles]
    return settles
