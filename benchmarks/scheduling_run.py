"""What the scheduling benchmark drives: a stack, a tap on its events, submissions by team.

:class:`SchedulingStack` is a :class:`benchmarks.stack.BenchStack` (real processes)
with the instant executor waiting a fixed time per trial, plus one connection that
submits experiments the way the submitter service does (``handlers.submit``: the
team's quotas applied) and a :class:`Tap` that keeps every ExperimentSubmitted,
TrialStarted, TrialCompleted and ResultImported's own timestamp.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import nats
import yaml
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from benchmarks.scheduling_preemption import Attempt, Recorded
from benchmarks.stack import INSTANT_EXECUTOR, BenchStack, run_experiment
from benchmarks.workload import many_trials
from schemas.subjects import DEFAULT_POOL, Topology
from services.common.adapters.jetstream import JetStreamBus
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.adapters.nats_objects import BucketSettings, NatsObjectStore
from services.common.priority import DEFAULT_CLASSES, PriorityClasses
from services.common.quotas import Quotas, TeamQuota, load_quotas
from services.submitter import handlers
from services.submitter.handlers import SubmitterPorts
from services.submitter.manifest_io import load_manifest
from services.submitter.submit import prepare

SHARE_FIELD = "share"
"""The quotas file's per-team share field (fair share, docs/scheduling.md). The shares
scenario writes it only when ``TeamQuota`` has it: a quotas file with an unknown field
is refused, so on code without fair share the scenario measures FIFO instead."""

KINDS = (
    "experiment_submitted",
    "trial_started",
    "trial_completed",
    "trial_failed",
    "result_imported",
)


def share_quotas(shares: dict[str, int], path: Path) -> Path | None:
    """Write a quotas file giving each team its share, or None when the code has no share
    setting (then nothing is written and the submissions carry no quota)."""
    if SHARE_FIELD not in TeamQuota.model_fields:
        return None
    teams = {team: {SHARE_FIELD: weight} for team, weight in shares.items()}
    path.write_text(yaml.safe_dump({"teams": teams}))
    return path


def classed_manifest(
    folder: Path, name: str, n: int, cls: str, in_flight: int, *, preemptible: bool = False
) -> Path:
    """A manifest of ``n`` instant trials in priority class ``cls`` (``many_trials``),
    ``compute.preemptible`` when asked (a sweep that must yield to heavier classes)."""
    path = many_trials(n, name=f"sched-{name}").trialbus_manifest(
        folder / f"{name}.yaml", max_in_flight=in_flight
    )
    data = yaml.safe_load(path.read_text())
    data["compute"]["priority_class"] = cls
    if preemptible:
        data["compute"]["preemptible"] = True
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["occurred_at"]).timestamp()


class Tap:
    """Timestamps of the events of every experiment, as the stack published them.

    A trial's start and import are its first ones (a redelivered start or a record
    written again does not move them)."""

    def __init__(self) -> None:
        self._submitted: dict[str, float] = {}
        self._starts: dict[str, dict[str, float]] = {}
        self._completions: dict[str, dict[str, float]] = {}
        self._imports: dict[str, dict[str, float]] = {}
        # Every start and failure per trial (a preempted trial starts more than once).
        self._history: dict[str, dict[str, list[Attempt]]] = {}
        self._changed = asyncio.Event()

    async def open(self, js: JetStreamContext, topo: Topology) -> None:
        """Follow the four event types from now on (ordered consumers)."""
        for kind in KINDS:
            await js.subscribe(
                topo.event_filter(kind),
                cb=self._on,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.NEW,
            )

    async def _on(self, msg: Msg) -> None:
        event = json.loads(msg.data)
        exp, kind = event["experiment_id"], event["type"]
        if kind == "experiment_submitted":
            self._submitted.setdefault(exp, _at(event))
        elif kind == "trial_started":
            self._starts.setdefault(exp, {}).setdefault(event["trial_id"], _at(event))
        if kind in ("trial_started", "trial_failed"):
            failure = ""
            if kind == "trial_failed":
                failure = f"{event['failure_class']}/{event['error_type']}"
                failure += "/final" if event["final"] else ""
            self._history.setdefault(exp, {}).setdefault(event["trial_id"], []).append(
                Attempt(kind, event["attempt"], event.get("handed_back", 0), failure)
            )
        if kind == "trial_completed":
            self._completions.setdefault(exp, {}).setdefault(event["trial_id"], _at(event))
        elif kind == "result_imported":
            self._imports.setdefault(exp, {}).setdefault(event["trial_id"], _at(event))
        self._changed.set()

    async def wait(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Return once ``done()`` holds, re-checked at each event (TimeoutError naming
        ``what`` and what was seen)."""
        end = time.monotonic() + timeout_s
        while True:
            self._changed.clear()
            if done():
                return
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{what}: not reached after {timeout_s:.0f}s; {self.seen()}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    def seen(self) -> str:
        """Starts and imports per experiment, for error messages."""
        return ", ".join(
            f"{e}: {len(self._starts.get(e, {}))} started, {self.imported(e)} imported"
            for e in self._submitted
        )

    def submitted_at(self, exp: str) -> float:
        """When ``exp``'s ExperimentSubmitted happened."""
        return self._submitted[exp]

    def start_times(self, exp: str) -> list[float]:
        """Each started trial's first TrialStarted time."""
        return list(self._starts.get(exp, {}).values())

    def started(self, exp: str) -> int:
        """Trials of ``exp`` started so far."""
        return len(self._starts.get(exp, {}))

    def imported(self, exp: str) -> int:
        """Trials of ``exp`` recorded so far."""
        return len(self._imports.get(exp, {}))

    def first_start(self, exp: str) -> float:
        """``exp``'s first TrialStarted time."""
        return min(self.start_times(exp))

    def last_start(self, exp: str) -> float:
        """``exp``'s last (first-attempt) TrialStarted time."""
        return max(self.start_times(exp))

    def latest(self, exp: str) -> float:
        """The latest start of ``exp`` so far (0 before any)."""
        return max(self.start_times(exp), default=0.0)

    def last_completion(self, exp: str) -> float:
        """When ``exp``'s last trial ended on its runner (its TrialCompleted)."""
        return max(self._completions[exp].values())

    def latest_completion(self, exp: str) -> float:
        """The latest TrialCompleted of ``exp`` so far (0 before any)."""
        return max(self._completions.get(exp, {}).values(), default=0.0)

    def completion_times(self, exp: str) -> list[float]:
        """Each completed trial's first TrialCompleted time."""
        return list(self._completions.get(exp, {}).values())

    def completed(self, exp: str, trial_id: str) -> bool:
        """Whether the trial has a TrialCompleted."""
        return trial_id in self._completions.get(exp, {})

    def is_imported(self, exp: str, trial_id: str) -> bool:
        """Whether the trial has a ResultImported."""
        return trial_id in self._imports.get(exp, {})

    def history(self, exp: str) -> dict[str, list[Attempt]]:
        """Every TrialStarted and TrialFailed of ``exp``'s trials, in arrival order."""
        return self._history.get(exp, {})

    def spans(self, exp: str, now: float) -> list[tuple[float, float]]:
        """Each started trial's first start and its completion (``now`` while it runs)."""
        done = self._completions.get(exp, {})
        return [(t0, done.get(t, now)) for t, t0 in self._starts.get(exp, {}).items()]

    def last_import(self, exp: str) -> float:
        """When ``exp``'s last trial was first recorded."""
        return max(self._imports[exp].values())


class SchedulingStack:
    """A fresh stack of ``runners`` x ``slots`` with trials of ``trial_s``, a tap on its
    events and an in-process submitter; ``quotas_file`` goes to every service too."""

    def __init__(
        self,
        data_dir: Path,
        runners: int,
        slots: int,
        trial_s: float,
        quotas_file: Path | None = None,
    ) -> None:
        env = {"TRIALBUS_QUOTAS_FILE": str(quotas_file)} if quotas_file else {}
        self.bench = BenchStack(
            data_dir / "data",
            n_runners=runners,
            concurrency=slots,
            executor=INSTANT_EXECUTOR,
            extra_env=env,
            runner_env={"TRIALBUS_INSTANT_DELAY_S": str(trial_s)},
        )
        self.tap = Tap()
        self.published: dict[str, int] = {}
        self._quotas: Quotas | None = load_quotas(quotas_file) if quotas_file else None
        self._nc: Client | None = None
        self._ledger: MongoLedger | None = None
        self._ports: SubmitterPorts | None = None

    async def __aenter__(self) -> SchedulingStack:
        await asyncio.to_thread(self.bench.start)
        try:
            topo = self.bench.topology
            self._nc = await nats.connect(self.bench.nats_url, name="bench-scheduling")
            js = self._nc.jetstream()
            await self.tap.open(js, topo)
            self._ledger = MongoLedger(self.bench.ledger_url or "", "bench")
            coordinator = await NatsCoordinator.open(js, topo, lease_ttl_s=60.0)
            tasks = await NatsObjectStore.open(js, topo.tasks_bucket, create=BucketSettings())
            bus = JetStreamBus(js, topo)
            self._ports = SubmitterPorts(bus, self._ledger, coordinator, tasks, quotas=self._quotas)
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._close()

    async def _close(self) -> None:
        try:
            if self._ledger is not None:
                await self._ledger.close()
            if self._nc is not None:
                await self._nc.close()
        finally:
            await asyncio.to_thread(self.bench.stop)

    async def warm_up(self, folder: Path) -> None:
        """One wave of default-class trials on every slot first (never measured)."""
        slots = self.bench.n_runners * self.bench.concurrency
        manifest = many_trials(4 * -(-slots // 4), name="sched-warmup").trialbus_manifest(
            folder / "warmup.yaml", max_in_flight=slots
        )
        await run_experiment(self.bench, manifest, timeout_s=300)

    async def deliveries(self, priority_class: str) -> int:
        """The class durable's deliveries so far (``CONSUMER.INFO``'s delivered consumer
        sequence, which every delivery moves on): hand-backs make deliveries without
        starts."""
        assert self._nc is not None, "use SchedulingStack as an async context manager"
        classes = PriorityClasses.parse(DEFAULT_CLASSES)
        durable = self.bench.topology.runner_durable_for(
            DEFAULT_POOL, classes.durable_class(priority_class)
        )
        info = await self._nc.jetstream().consumer_info(self.bench.topology.work_stream, durable)
        return info.delivered.consumer_seq or 0

    async def records(self, trial_ids: Iterable[str]) -> dict[str, Recorded | None]:
        """What the ledger records of each trial (None: no record)."""
        assert self._ledger is not None, "use SchedulingStack as an async context manager"
        ids = list(trial_ids)
        found = await asyncio.gather(*(self._ledger.get_record(t) for t in ids))
        return {
            t: None if r is None else Recorded(r.attempts, r.scored)
            for t, r in zip(ids, found, strict=True)
        }

    async def submit(self, manifest: Path, team: str | None = None) -> str:
        """Submit as the submitter service does, for ``team``; returns the experiment id."""
        assert self._ports is not None, "use SchedulingStack as an async context manager"
        prepared = prepare(load_manifest(manifest), manifest.parent)
        if team is not None:
            prepared = dataclasses.replace(prepared, team=team)
        result = await handlers.submit(prepared, self._ports)
        self.published[prepared.experiment_id] = result.n_published
        return prepared.experiment_id
