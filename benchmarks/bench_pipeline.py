"""3. Pipeline capacity: trialbus with trials that take no time.

The runner's executor is ``benchmarks.instant_executor`` (it writes a Harbor-shaped
result.json and returns), so everything measured is trialbus: submit, the work
stream, the runner's bookkeeping, the events, the importer's record building and
ledger upserts, ResultImported. Timed from the start of submit to the last
ResultImported, on a fresh embedded stack. The raw ceilings (``benchmarks.ceilings``)
are measured in the same run on fresh servers, with the same payloads and records.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from benchmarks import ceilings
from benchmarks.harness import BenchResult, Context, Figure, fresh_dir, median
from benchmarks.instant_executor import InstantExecutor
from benchmarks.stack import (
    INSTANT_EXECUTOR,
    BenchStack,
    run_experiment,
    throwaway_servers,
    warm_up,
)
from benchmarks.workload import Workload, many_trials
from schemas.events import TrialRequested, encode_event
from schemas.record import TrialRecord
from services.common.harbor_jobs import job_dir_for
from services.importer.records import RecordContext, build_record
from services.submitter.manifest_io import load_manifest
from services.submitter.submit import prepare

RUNNER_CONCURRENCY = 256
# Issue 12's target: the pipeline at three quarters of its slowest central store.
CEILING_FRACTION_TARGET = 0.75
IMPORTER_BATCH = 200  # ImporterSettings.batch_size's default
# The experiment-wide limit must not be what limits an instant pipeline.
MAX_IN_FLIGHT = 10_000


def sample_inputs(workload: Workload, work_dir: Path) -> tuple[list[bytes], TrialRecord]:
    """The workload's real TrialRequested payloads, and one real record of an instant trial."""
    manifest = workload.trialbus_manifest(fresh_dir(work_dir) / "manifest.yaml")
    prepared = prepare(load_manifest(manifest), manifest.parent)
    payloads = [encode_event(t) for t in prepared.trials]
    return payloads, instant_record(prepared.trials[0], work_dir / "jobs")


def instant_record(trial: TrialRequested, jobs_root: Path) -> TrialRecord:
    """The record the importer builds for one trial run by the instant executor."""
    outcome = asyncio.run(InstantExecutor(jobs_root).run(trial, 1, None))
    assert outcome.trial_dir is not None
    return build_record(
        outcome.trial_dir,
        RecordContext(
            experiment_id=trial.experiment_id,
            trial_id=trial.trial_id,
            job_dir=job_dir_for(jobs_root, trial.experiment_id),
            agent_label=trial.agent.display,
            environment=trial.compute.environment,
            harbor_version="0",
        ),
    )


async def measure_ceilings(
    nats_url: str, ledger_url: str, payloads: list[bytes], record: TrialRecord
) -> dict[str, float]:
    """Raw publish, consume and bulk-upsert rates for this workload's sizes."""
    publish = await ceilings.jetstream_publish_rate(nats_url, payloads)
    consume = await ceilings.jetstream_consume_rate(nats_url, len(payloads))
    records = ceilings.replicate_record(record, len(payloads), "ceiling")
    db = ceilings.database_name()
    raw = await ceilings.ledger_raw_upsert_rate(ledger_url, db, records, IMPORTER_BATCH)
    adapter = await ceilings.ledger_adapter_upsert_rate(
        ledger_url, db + "_adapter", records, IMPORTER_BATCH
    )
    return {"publish": publish, "consume": consume, "ledger_raw": raw, "ledger_adapter": adapter}


def run_ceilings(
    ctx: Context, name: str, payloads: list[bytes], record: TrialRecord
) -> dict[str, float]:
    """The ceilings on a fresh nats-server and a fresh ledger."""
    with throwaway_servers(ctx.path(name)) as (nats_server, ledger):
        return asyncio.run(measure_ceilings(nats_server.url, ledger.url, payloads, record))


def run(ctx: Context) -> BenchResult:
    n = 100 if ctx.quick else 10_000
    workload = many_trials(n)
    with tempfile.TemporaryDirectory(dir=ctx.work_dir) as tmp:
        payloads, record = sample_inputs(workload, Path(tmp))
    rates: list[float] = []
    cpu_ms: list[float] = []
    by_process: list[dict[str, float]] = []
    submit_s: list[float] = []
    ceils: list[dict[str, float]] = []
    redelivered: list[int] = []
    for i in range(ctx.runs):
        ctx.log(f"pipeline run {i + 1}/{ctx.runs}: {workload.n_trials} instant trials")
        run_dir = ctx.path(f"pipeline-{i}")
        with BenchStack(
            run_dir / "data", concurrency=RUNNER_CONCURRENCY, executor=INSTANT_EXECUTOR
        ) as stack:
            asyncio.run(warm_up(stack, many_trials(4, name="warm"), run_dir))
            manifest = workload.trialbus_manifest(
                run_dir / "manifest.yaml", max_in_flight=MAX_IN_FLIGHT
            )
            result = asyncio.run(run_experiment(stack, manifest))
        rates.append(result.trials_per_s)
        cpu_ms.append(result.cpu_ms_per_trial)
        by_process.append({k: 1000 * v / result.n_trials for k, v in result.cpu_by_process.items()})
        submit_s.append(result.submit_s)
        redelivered.append(result.importer_redeliveries)
        ctx.log(f"pipeline run {i + 1}/{ctx.runs}: raw ceilings")
        ceils.append(run_ceilings(ctx, f"ceilings-{i}", payloads, record))
    rate = median(rates)
    ceiling = {k: median([c[k] for c in ceils]) for k in ceils[0]}
    slowest_name = min(("publish", "consume", "ledger_raw"), key=lambda k: ceiling[k])
    slowest = ceiling[slowest_name]
    return BenchResult(
        name="pipeline",
        title="Pipeline capacity: instant trials, submit -> every ResultImported",
        value=rate,
        unit="trials/s",
        target=1000.0,
        target_op=">=",
        runs=rates,
        peers=[
            Figure(
                "fraction_of_slowest_ceiling",
                rate / slowest,
                "ratio",
                f"slowest raw ceiling: {slowest_name}",
                target=CEILING_FRACTION_TARGET,
                target_op=">=",
            ),
            Figure("jetstream_publish_ceiling", ceiling["publish"], "msg/s", "nats-py, acked"),
            Figure("jetstream_consume_ceiling", ceiling["consume"], "msg/s", "pull fetch + ack"),
            Figure("ledger_bulk_upsert_ceiling", ceiling["ledger_raw"], "docs/s", "plain PyMongo"),
            Figure(
                "ledger_adapter_upsert",
                ceiling["ledger_adapter"],
                "records/s",
                "trialbus MongoLedger.upsert_records",
            ),
            Figure("cpu_ms_per_trial", median(cpu_ms), "ms", "all stack processes"),
            Figure("submit_s", median(submit_s), "s", "validate, expand, publish (in the window)"),
            Figure(
                "importer_redeliveries",
                max(redelivered),
                "messages",
                "worst run; events the importer got again (each waits its ack_wait)",
            ),
            *(
                Figure(
                    f"cpu_ms_per_trial_{name}",
                    median([b[name] for b in by_process]),
                    "ms",
                    "this process's share",
                )
                for name in sorted(by_process[0])
            ),
        ],
        config={
            "trials": workload.n_trials,
            "runner_concurrency": RUNNER_CONCURRENCY,
            "importer_batch": IMPORTER_BATCH,
            "payload_bytes": len(payloads[0]),
            "runs": ctx.runs,
        },
    )
