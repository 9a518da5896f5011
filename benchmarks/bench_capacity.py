"""2. Orchestration capacity: many trials in flight that wait, as LLM agent trials do.

Real agent trials spend minutes waiting on a model, so what a runner fleet must scale
is concurrency, not CPU. Each trial here is the instant executor with
``TRIALBUS_INSTANT_DELAY_S`` = S: it sleeps S seconds, then writes a Harbor-shaped
result folder (which the runner packs and uploads, and the importer fetches, unpacks
and records). N trials are submitted as one experiment with ``n_concurrent_trials``
= N to R runner processes of ceil(N / R) slots each, on a fresh embedded stack.

- **efficiency** = ideal / measured wall time, where ideal = S + N / (the raw ledger
  bulk-upsert ceiling for N records, measured right after on fresh servers): every
  trial waits S once, and no pipeline can record N trials faster than its slowest
  central store. The strict ``S / wall`` is reported beside it.
- **each trial started once**: TrialStarted events counted per trial (a JetStream
  ordered consumer), runs counted from the runners' "trial settled" log lines, and
  work-message redeliveries from the durable consumer's delivery counter (deliveries
  - messages).
- NATS connections (nats-server's ``/varz``: peak during the run and connections
  opened), each runner's peak RSS, and memory per in-flight trial (runners' RSS at
  the peak of the run minus after start-up, over N).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import nats
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from benchmarks import ceilings
from benchmarks.bench_pipeline import IMPORTER_BATCH, instant_record
from benchmarks.harness import BenchResult, Context, Figure, fresh_dir, median, rss_kib
from benchmarks.stack import INSTANT_EXECUTOR, BenchStack, run_experiment, throwaway_servers
from benchmarks.workload import many_trials
from services.submitter.manifest_io import load_manifest
from services.submitter.submit import experiment_id_of, prepare

FULL = (2000, 30.0, (1, 2, 4, 8))
QUICK = (40, 1.0, (2,))
ENV = "TRIALBUS_BENCH_CAPACITY"
"""Override as ``N:S:R1,R2,...`` (e.g. ``10000:30:1,2,4,8``)."""


def sizes(quick: bool) -> tuple[int, float, tuple[int, ...]]:
    """(trials, delay seconds, runner counts) for this run."""
    raw = os.environ.get(ENV)
    if not raw:
        return QUICK if quick else FULL
    n, s, rs = raw.split(":")
    return int(n), float(s), tuple(int(r) for r in rs.split(","))


@dataclass
class Sampler:
    """Samples nats-server's connections and the runners' RSS twice a second."""

    monitor_url: str
    runner_pids: list[int]
    peak_connections: int = 0
    peak_runner_rss_kib: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def varz(self) -> dict[str, int]:
        with urllib.request.urlopen(f"{self.monitor_url}/varz", timeout=2) as resp:
            data = json.loads(resp.read())
        return {"connections": data["connections"], "total": data["total_connections"]}

    def runner_rss_kib(self) -> int:
        return sum(rss_kib(p) for p in self.runner_pids)

    def _loop(self) -> None:
        while not self.stop.wait(0.5):
            with contextlib.suppress(OSError):
                self.peak_connections = max(self.peak_connections, self.varz()["connections"])
            self.peak_runner_rss_kib = max(self.peak_runner_rss_kib, self.runner_rss_kib())

    @contextmanager
    def running(self) -> Iterator[None]:
        thread = threading.Thread(target=self._loop, daemon=True)
        thread.start()
        try:
            yield
        finally:
            self.stop.set()
            thread.join()


@dataclass
class CapacityRun:
    """One measurement: N trials of S seconds on R runners."""

    runners: int
    n: int
    delay_s: float
    wall_s: float
    ceiling: float
    starts: Counter[str]
    runs: Counter[str]
    redeliveries: int
    peak_connections: int
    connections_opened: int
    rss_idle_kib: int
    rss_peak_kib: int
    hwm_kib: list[int]
    log_errors: dict[str, int]

    @property
    def ideal_s(self) -> float:
        return self.delay_s + self.n / self.ceiling

    @property
    def efficiency(self) -> float:
        return self.ideal_s / self.wall_s

    @property
    def started_more_than_once(self) -> int:
        return started_more_than_once(self.starts, self.runs)


def started_more_than_once(starts: Counter[str], runs: Counter[str]) -> int:
    """Trials with more than one TrialStarted event (``starts``) plus trials settled more
    than once in the runners' logs (``runs``): each way a trial ran twice counts."""
    return sum(1 for c in starts.values() if c > 1) + sum(1 for c in runs.values() if c > 1)


LOG_PATTERNS = {
    "redelivered": "trial will be redelivered",
    "heartbeat_failed": "heartbeat failed",
    "fetch_failed": "fetch failed",
}


def scan_runner_logs(log_dir: Path) -> tuple[Counter[str], dict[str, int]]:
    """Runs per trial ("trial settled" lines) and counts of trouble lines, all runners."""
    runs: Counter[str] = Counter()
    errors = dict.fromkeys(LOG_PATTERNS, 0)
    settled = re.compile(r'"trial_id": "([^"]+)".*"event": "trial settled"')
    for path in log_dir.glob("runner-*.log"):
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if m := settled.search(line):
                    runs[m.group(1)] += 1
                for key, text in LOG_PATTERNS.items():
                    if text in line:
                        errors[key] += 1
    return runs, errors


async def _measure(stack: BenchStack, manifest: Path, n: int, delay_s: float) -> dict[str, object]:
    topo = stack.topology
    exp = experiment_id_of(load_manifest(manifest))
    starts: Counter[str] = Counter()

    async def on_started(msg: Msg) -> None:
        starts[json.loads(msg.data)["trial_id"]] += 1

    nc = await nats.connect(stack.nats_url, name="bench-capacity")
    try:
        js = nc.jetstream()
        sub = await js.subscribe(
            topo.event_subject("trial_started", exp),
            cb=on_started,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
        )
        durable = topo.runner_durable_for("default")
        before = (await js.consumer_info(topo.work_stream, durable)).delivered.consumer_seq or 0
        run = await run_experiment(stack, manifest, timeout_s=max(300.0, 10 * (delay_s + n / 500)))
        after = (await js.consumer_info(topo.work_stream, durable)).delivered.consumer_seq or 0
        # The ordered consumer may still be catching up with the last TrialStarted events.
        deadline = time.monotonic() + 10
        while sum(starts.values()) < n and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        await sub.unsubscribe()
    finally:
        await nc.close()
    return {"wall_s": run.wall_s, "starts": starts, "redeliveries": (after - before) - n}


def measure(ctx: Context, runners: int, n: int, delay_s: float, name: str) -> CapacityRun:
    """N trials of ``delay_s`` on ``runners`` runners, then the ledger ceiling for N."""
    run_dir = fresh_dir(ctx.path(name))
    workload = many_trials(n, name=name)
    manifest = workload.trialbus_manifest(run_dir / "manifest.yaml", max_in_flight=n)
    with BenchStack(
        run_dir / "data",
        n_runners=runners,
        concurrency=-(-n // runners),
        executor=INSTANT_EXECUTOR,
        runner_env={"TRIALBUS_INSTANT_DELAY_S": str(delay_s)},
    ) as stack:
        assert stack._nats is not None
        sampler = Sampler(stack._nats.monitor_url, stack.runner_pids())
        opened_before = sampler.varz()["total"]
        rss_idle = sampler.runner_rss_kib()
        with sampler.running():
            out = asyncio.run(_measure(stack, manifest, n, delay_s))
        opened = sampler.varz()["total"] - opened_before
        hwm = [rss_kib(p, "VmHWM") for p in stack.runner_pids()]
        runs, errors = scan_runner_logs(run_dir / "data" / "stack" / "logs")
    trial = prepare(load_manifest(manifest), manifest.parent).trials[0]
    record = instant_record(trial, run_dir / "ceiling-jobs")
    with throwaway_servers(ctx.path(name + "-ceiling")) as (_nats, ledger):
        ceiling = asyncio.run(
            ceilings.ledger_raw_upsert_rate(
                ledger.url,
                ceilings.database_name(),
                ceilings.replicate_record(record, n, "ceiling"),
                IMPORTER_BATCH,
            )
        )
    starts = out["starts"]
    assert isinstance(starts, Counter)
    return CapacityRun(
        runners=runners,
        n=n,
        delay_s=delay_s,
        wall_s=float(out["wall_s"]),  # type: ignore[arg-type]
        ceiling=ceiling,
        starts=starts,
        runs=runs,
        redeliveries=int(out["redeliveries"]),  # type: ignore[call-overload]
        peak_connections=sampler.peak_connections,
        connections_opened=opened,
        rss_idle_kib=rss_idle,
        rss_peak_kib=sampler.peak_runner_rss_kib,
        hwm_kib=hwm,
        log_errors=errors,
    )


def run(ctx: Context) -> BenchResult:
    n, delay_s, runner_counts = sizes(ctx.quick)
    by_size: dict[int, list[CapacityRun]] = {r: [] for r in runner_counts}
    for i in range(ctx.runs):
        for r in runner_counts:
            ctx.log(f"capacity run {i + 1}/{ctx.runs}: {n} trials of {delay_s:g}s on {r} runner(s)")
            m = measure(ctx, r, n, delay_s, f"capacity-{r}r-{i}")
            ctx.log(
                f"capacity: {r} runner(s): wall {m.wall_s:.1f}s, ideal {m.ideal_s:.1f}s, "
                f"efficiency {m.efficiency:.2f}, started twice {m.started_more_than_once}, "
                f"redeliveries {m.redeliveries}"
            )
            by_size[r].append(m)
    peers: list[Figure] = []
    for r, ms in by_size.items():
        peers += [
            Figure(
                f"efficiency_{r}r",
                median([m.efficiency for m in ms]),
                "ratio",
                "per run: " + ", ".join(f"{m.efficiency:.2f}" for m in ms),
                target=0.95,
                target_op=">=",
            ),
            Figure(
                f"wall_{r}r", median([m.wall_s for m in ms]), "s", f"ideal {ms[0].ideal_s:.1f} s"
            ),
            Figure(f"strict_efficiency_{r}r", median([delay_s / m.wall_s for m in ms]), "ratio"),
            Figure(
                f"started_more_than_once_{r}r",
                max(m.started_more_than_once for m in ms),
                "trials",
                "worst run; TrialStarted events or runs per trial > 1",
                target=0,
                target_op="<=",
            ),
            Figure(f"redeliveries_{r}r", max(m.redeliveries for m in ms), "messages", "worst run"),
            Figure(
                f"runner_errors_{r}r",
                max(sum(m.log_errors.values()) for m in ms),
                "lines",
                "worst run; redelivered / heartbeat failed / fetch failed log lines",
            ),
            Figure(f"peak_connections_{r}r", max(m.peak_connections for m in ms), "connections"),
            Figure(
                f"connections_opened_{r}r",
                max(m.connections_opened for m in ms),
                "connections",
                "during the run (reconnects and short-lived clients)",
            ),
            Figure(
                f"runner_peak_rss_{r}r",
                median([max(m.hwm_kib) / 1024 for m in ms]),
                "MiB",
                "largest runner process (VmHWM)",
            ),
            Figure(
                f"kib_per_trial_in_flight_{r}r",
                median([(m.rss_peak_kib - m.rss_idle_kib) / m.n for m in ms]),
                "KiB",
                "runners' RSS at peak minus after start, over N",
            ),
        ]
    all_runs = [m for ms in by_size.values() for m in ms]
    worst = [min(by_size[r][i].efficiency for r in runner_counts) for i in range(ctx.runs)]
    return BenchResult(
        name="capacity",
        title=f"Orchestration capacity: {n:,} trials of {delay_s:g} s in flight, "
        f"{'/'.join(map(str, runner_counts))} runners (lowest efficiency)",
        value=min(median([m.efficiency for m in ms]) for ms in by_size.values()),
        unit="efficiency",
        target=0.95,
        target_op=">=",
        runs=worst,
        peers=[
            *peers,
            Figure(
                "ledger_ceiling",
                median([m.ceiling for m in all_runs]),
                "docs/s",
                "raw bulk upsert of N records, fresh ledger",
            ),
        ],
        config={
            "trials": n,
            "delay_s": delay_s,
            "runners": list(runner_counts),
            "slots_per_runner": [-(-n // r) for r in runner_counts],
            "runs": ctx.runs,
        },
    )
