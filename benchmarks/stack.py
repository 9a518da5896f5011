"""The trialbus side of a measurement: a fresh embedded stack, and experiments driven
through it the way ``trialbus submit --wait`` drives them.

:class:`BenchStack` starts nats-server, the SecantusDB ledger and the four services
as separate processes (``infra.stack.EmbeddedStack``) in a data folder emptied first,
optionally pins them to cores, and knows every process id for CPU accounting.
:func:`run_experiment` times one submission from the start of submit (read and
validate the manifest, expand, publish) to the arrival of its last ResultImported.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import nats
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError

from benchmarks.harness import CpuMeter, fresh_dir, pin_process
from benchmarks.instant_executor import EXECUTOR_SPEC
from benchmarks.workload import Workload
from infra.embedded import LedgerServer, NatsServer
from infra.managed_process import StartStop
from infra.stack import EmbeddedStack
from schemas.events import TrialRequested
from schemas.subjects import Topology
from services.common.adapters.jetstream import JetStreamBus
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.adapters.nats_objects import BucketSettings, NatsObjectStore
from services.runner.durables import consumer_filters
from services.submitter.manifest_io import load_manifest
from services.submitter.submit import experiment_id_of, prepare, publish_experiment

INSTANT_EXECUTOR = EXECUTOR_SPEC
PREFIX = "bench"


@dataclass
class BenchStack(StartStop):
    """A fresh embedded stack in ``data_dir`` (emptied on start).

    ``infra_cpus`` pins the servers, the non-runner services and this process;
    ``runner_cpus[i]`` pins runner ``i`` (its Harbor subprocesses inherit it).
    """

    data_dir: Path
    n_runners: int = 1
    concurrency: int = 8
    executor: str | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    runner_env: Mapping[str, str] = field(default_factory=dict)
    infra_cpus: set[int] | None = None
    runner_cpus: list[set[int]] | None = None
    ledger_url: str | None = None
    start_s: float = 0.0
    _nats: NatsServer | None = None
    _ledger: LedgerServer | None = None
    _stack: EmbeddedStack | None = None
    _saved_affinity: set[int] | None = None

    @property
    def topology(self) -> Topology:
        return Topology(PREFIX)

    @property
    def nats_url(self) -> str:
        assert self._nats is not None
        return self._nats.url

    @property
    def stack(self) -> EmbeddedStack:
        assert self._stack is not None
        return self._stack

    def start(self) -> BenchStack:
        """Start everything and wait until every service is ready."""
        t0 = time.perf_counter()
        fresh_dir(self.data_dir)
        if self.infra_cpus is not None:
            # Children inherit it: the servers and services start pinned.
            self._saved_affinity = os.sched_getaffinity(0)
            os.sched_setaffinity(0, self.infra_cpus)
        try:
            self._nats = NatsServer(self.data_dir / "nats").start()
            if self.ledger_url is None:
                self._ledger = LedgerServer(self.data_dir / "ledger").start()
                self.ledger_url = self._ledger.url
            runner_env = dict(self.runner_env)
            if self.executor:
                runner_env["TRIALBUS_EXECUTOR"] = self.executor
            self._stack = EmbeddedStack(
                self.data_dir / "stack",
                n_runners=self.n_runners,
                concurrency=self.concurrency,
                prefix=PREFIX,
                ledger_db="bench",
                nats_url=self._nats.url,
                ledger_url=self.ledger_url,
                extra_env=self.extra_env,
                runner_env=runner_env,
            )
            self._stack.start()
            for i, pid in enumerate(self.runner_pids()):
                if self.runner_cpus:
                    pin_process(pid, self.runner_cpus[i % len(self.runner_cpus)])
        except BaseException:
            self.stop()
            raise
        self.start_s = time.perf_counter() - t0
        return self

    def runner_pids(self) -> list[int]:
        return [
            svc.proc.pid
            for name, svc in self.stack.services.items()
            if name.startswith("runner") and svc.proc is not None
        ]

    def pids(self) -> dict[str, int]:
        """Every process of the stack by name: servers and services."""
        pids = {
            name: svc.proc.pid for name, svc in self.stack.services.items() if svc.proc is not None
        }
        for name, server in (("nats-server", self._nats), ("ledger", self._ledger)):
            if server is not None and server.pid is not None:
                pids[name] = server.pid
        return pids

    def cpu_meter(self) -> CpuMeter:
        """A meter over every stack process plus this one (the submitting client)."""
        return CpuMeter(self.pids(), include_self=True)

    def stop(self) -> None:
        """Stop services, then the servers; restore this process's affinity."""
        try:
            if self._stack is not None:
                self._stack.stop()
            if self._ledger is not None:
                # Its data is never used again (the next run empties the folder), so
                # no graceful shutdown: secantusd needs over 2 s to exit on SIGTERM.
                self._ledger.kill()
            if self._nats is not None:
                self._nats.stop()
        finally:
            if self._saved_affinity is not None:
                os.sched_setaffinity(0, self._saved_affinity)
                self._saved_affinity = None


@dataclass
class ExperimentRun:
    """One submission followed to its last ResultImported."""

    experiment_id: str
    n_trials: int
    wall_s: float
    submit_s: float
    cpu_by_process: dict[str, float]
    reward_sum: float = 0.0
    runners: Counter[str] = field(default_factory=Counter)
    importer_redeliveries: int = 0
    """Events the importer's durable delivered more than once during the run."""

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu_by_process.values())

    @property
    def trials_per_s(self) -> float:
        return self.n_trials / self.wall_s

    @property
    def cpu_ms_per_trial(self) -> float:
        return 1000 * self.cpu_s / self.n_trials


async def run_experiment(
    stack: BenchStack, manifest_path: Path, *, timeout_s: float = 600.0
) -> ExperimentRun:
    """Submit ``manifest_path`` as the CLI does and wait for every ResultImported.

    Timing starts before the manifest is read and validated and ends when the last
    trial's ResultImported reaches this process (a JetStream ordered consumer, as
    ``trialbus submit --wait`` uses). CPU covers every stack process and this one.
    """
    topo = stack.topology
    experiment_id = experiment_id_of(load_manifest(manifest_path))
    imported: set[str] = set()
    runners: Counter[str] = Counter()
    expected: list[int] = []  # set once the submission knows its size
    done = asyncio.Event()
    last = [0.0]

    rewards: dict[str, float] = {}

    async def on_imported(msg: Msg) -> None:
        event = json.loads(msg.data)
        imported.add(event["trial_id"])
        rewards[event["trial_id"]] = event.get("main_reward") or 0.0
        last[0] = time.perf_counter()
        if expected and len(imported) >= expected[0]:
            done.set()

    async def on_started(msg: Msg) -> None:
        runners[json.loads(msg.data)["runner_id"]] += 1

    nc = await nats.connect(stack.nats_url, name="bench-observer")
    ledger = MongoLedger(stack.ledger_url or "", "bench")
    try:
        js = nc.jetstream()
        subs = [
            await js.subscribe(
                topo.event_subject(kind, experiment_id),
                cb=cb,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.NEW,
            )
            for kind, cb in (("result_imported", on_imported), ("trial_started", on_started))
        ]
        delivered_before = await _importer_delivered(js, topo)
        meter = stack.cpu_meter()
        meter.start()
        t0 = time.perf_counter()
        prepared = prepare(load_manifest(manifest_path), manifest_path.parent)
        tasks = await NatsObjectStore.open(js, topo.tasks_bucket, create=BucketSettings())
        result = await publish_experiment(prepared, JetStreamBus(js, topo), ledger, tasks)
        submit_s = time.perf_counter() - t0
        expected.append(result.n_published)
        if len(imported) >= result.n_published:
            done.set()
        try:
            await asyncio.wait_for(done.wait(), timeout_s)
        except TimeoutError:
            raise TimeoutError(
                f"{experiment_id}: {len(imported)} of {result.n_published} trials imported "
                f"after {timeout_s:.0f}s; see the service logs in {stack.data_dir}/stack/logs"
            ) from None
        cpu = meter.stop()
        delivered = await _importer_delivered(js, topo)
        # Deliveries beyond the new messages the importer's filters take.
        redelivered = (delivered[0] - delivered_before[0]) - (delivered[1] - delivered_before[1])
        for sub in subs:
            await sub.unsubscribe()
    finally:
        await ledger.close()
        await nc.close()
    return ExperimentRun(
        experiment_id=experiment_id,
        n_trials=result.n_published,
        wall_s=last[0] - t0,
        submit_s=submit_s,
        cpu_by_process=cpu,
        reward_sum=sum(rewards.values()),
        runners=runners,
        importer_redeliveries=redelivered,
    )


async def _importer_delivered(js: JetStreamContext, topo: Topology) -> tuple[int, int]:
    """The importer durable's deliveries and the messages its filters take from the
    events stream ((0, 0) before it exists). nats-server's ``num_redelivered`` is no
    count: it holds only redelivered messages not yet acknowledged; and the last
    stream sequence delivered counts the events the durable skips too."""
    try:
        info = await js.consumer_info(topo.events_stream, topo.importer_durable)
    except NotFoundError:
        return 0, 0
    taken = 0
    for subject in consumer_filters(info):
        stream = await js.stream_info(topo.events_stream, subjects_filter=subject)
        taken += sum((stream.state.subjects or {}).values())
    return info.delivered.consumer_seq or 0, taken


async def warm_up(stack: BenchStack, workload: Workload, work_dir: Path, tries: int = 3) -> None:
    """Run a small separate experiment until every runner has run a trial.

    A long-lived stack has imported Harbor in each runner already; a fresh one pays
    that on its first trial. The warm-up experiment has its own experiment id, so
    no measured trial is ever cached.
    """
    runner_ids = {f"runner-{i}" for i in range(stack.n_runners)}
    seen: set[str] = set()
    slots = stack.n_runners * stack.concurrency
    per_rep = len(workload.tasks) * len(workload.agents)
    for i in range(tries):
        small = dataclasses.replace(
            workload, name=f"warmup-{i}-{workload.name}", repetitions=max(1, -(-slots // per_rep))
        )
        manifest = small.trialbus_manifest(work_dir / f"warmup-{i}.yaml", max_in_flight=slots)
        run = await run_experiment(stack, manifest)
        seen |= set(run.runners)
        if runner_ids <= seen:
            return
    raise RuntimeError(f"warm-up reached runners {sorted(seen)} of {sorted(runner_ids)}")


async def publish_one_at_a_time(
    bus: JetStreamBus,
    trials: Sequence[TrialRequested],
    *,
    done: Container[str],
    arrived: asyncio.Event,
    started: Callable[[str], tuple[float, datetime]],
    timeout_s: float,
    pause_s: float,
) -> tuple[list[float], list[float]]:
    """Publish ``trials`` one at a time, each once the one before is in ``done`` (the
    caller's subscriber fills it and sets ``arrived``), idling ``pause_s`` between.

    Returns per trial the milliseconds from its publication to its TrialStarted
    received here (observed) and to the start's own ``occurred_at`` (dispatch);
    ``started(trial_id)`` gives those two times.
    """
    observed: list[float] = []
    dispatch: list[float] = []
    for trial in trials:
        arrived.clear()
        t_pub = time.time()
        await bus.publish(trial)
        while trial.trial_id not in done:
            await asyncio.wait_for(arrived.wait(), timeout_s)
            arrived.clear()
        t_seen, occurred = started(trial.trial_id)
        observed.append(1000 * (t_seen - t_pub))
        dispatch.append(1000 * (occurred.timestamp() - t_pub))
        await asyncio.sleep(pause_s)
    return observed, dispatch


@contextlib.contextmanager
def throwaway_servers(data_dir: Path) -> Iterator[tuple[NatsServer, LedgerServer]]:
    """A fresh nats-server and ledger in an emptied ``data_dir``, killed afterwards
    (their data is never read again, so no graceful shutdown is waited for)."""
    fresh_dir(data_dir)
    with NatsServer(data_dir / "nats") as nats_server:
        ledger = LedgerServer(data_dir / "ledger").start()
        try:
            yield nats_server, ledger
        finally:
            ledger.kill()
