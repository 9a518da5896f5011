"""4. Submit: validate, expand and publish (every message acknowledged) a 10,000-trial
experiment.

Measured in process with the submitter's own functions, the same ones ``trialbus
submit`` calls, against a fresh nats-server and ledger with no service running (so
nothing competes for the CPU): read and validate the manifest file, resolve its
tasks (checksums) and expand the trials, then ``publish_experiment`` (ledger resume
check, ExperimentSubmitted, 10,000 TrialRequested with dedup ids). Beside it:
the same payloads through plain nats-py async publish (the floor), and the whole
``trialbus submit`` CLI process (same trials under another experiment name).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nats

from benchmarks import ceilings
from benchmarks.harness import REPO, BenchResult, Context, Figure, fresh_dir, median
from benchmarks.stack import PREFIX, throwaway_servers
from benchmarks.workload import many_trials
from schemas.events import encode_event
from schemas.subjects import Topology
from services.common.adapters.jetstream import JetStreamBus, ensure_streams
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.adapters.nats_objects import BucketSettings, NatsObjectStore
from services.submitter.manifest_io import load_manifest
from services.submitter.submit import prepare, publish_experiment


@dataclass(frozen=True, slots=True)
class SubmitTiming:
    """Seconds per phase of one submission."""

    validate_s: float
    expand_s: float
    publish_s: float
    n_published: int

    @property
    def total_s(self) -> float:
        return self.validate_s + self.expand_s + self.publish_s


async def submit_once(nats_url: str, ledger_url: str, manifest_path: Path) -> SubmitTiming:
    """One timed submission (connections opened before the clock starts)."""
    topo = Topology(PREFIX)
    nc = await nats.connect(nats_url, name="bench-submit")
    ledger = MongoLedger(ledger_url, "bench")
    try:
        js = nc.jetstream()
        await ensure_streams(js, topo)
        await ledger.ensure_indexes()
        t0 = time.perf_counter()
        manifest = load_manifest(manifest_path)
        t1 = time.perf_counter()
        prepared = prepare(manifest, manifest_path.parent)
        t2 = time.perf_counter()
        tasks = await NatsObjectStore.open(js, topo.tasks_bucket, create=BucketSettings())
        result = await publish_experiment(prepared, JetStreamBus(js, topo), ledger, tasks)
        t3 = time.perf_counter()
    finally:
        await ledger.close()
        await nc.close()
    if result.n_published != len(prepared.trials):
        raise AssertionError(f"published {result.n_published} of {len(prepared.trials)}")
    return SubmitTiming(t1 - t0, t2 - t1, t3 - t2, result.n_published)


def cli_submit_s(nats_url: str, ledger_url: str, manifest_path: Path) -> float:
    """Wall seconds of ``trialbus submit MANIFEST --json`` (process start to exit)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_")}
    env.update(
        {
            "NATS_URL": nats_url,
            "LEDGER_URL": ledger_url,
            "TRIALBUS_PREFIX": PREFIX,
            "TRIALBUS_LEDGER_DB": "bench",
            # No runner is up here: queue the work instead of refusing the manifest.
            "TRIALBUS_CHECK_RUNNERS": "false",
        }
    )
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "services", "submit", str(manifest_path), "--json"],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0


def run(ctx: Context) -> BenchResult:
    n = 200 if ctx.quick else 10_000
    workload = many_trials(n, name="bench-submit")
    timings: list[SubmitTiming] = []
    floor: list[float] = []
    cli: list[float] = []
    for i in range(ctx.runs):
        ctx.log(f"submit run {i + 1}/{ctx.runs}: {workload.n_trials} trials")
        run_dir = fresh_dir(ctx.path(f"submit-{i}"))
        manifest = workload.trialbus_manifest(run_dir / "manifest.yaml")
        # The CLI submits the same trials under another name: new experiment, new ids.
        cli_manifest = dataclasses.replace(workload, name="bench-submit-cli").trialbus_manifest(
            run_dir / "cli.yaml"
        )
        with throwaway_servers(run_dir / "servers") as (ns, ledger):
            timings.append(asyncio.run(submit_once(ns.url, ledger.url, manifest)))
            payloads = [encode_event(t) for t in prepare(load_manifest(manifest), run_dir).trials]
            rate = asyncio.run(ceilings.jetstream_publish_rate(ns.url, payloads))
            floor.append(len(payloads) / rate)
            cli.append(cli_submit_s(ns.url, ledger.url, cli_manifest))
    return BenchResult(
        name="submit",
        title="Submit: validate, expand and publish (acknowledged) an experiment",
        value=median([t.total_s for t in timings]),
        unit="s",
        target=1.0,
        target_op="<=",
        runs=[t.total_s for t in timings],
        peers=[
            Figure("validate_s", median([t.validate_s for t in timings]), "s", "read + validate"),
            Figure(
                "expand_s", median([t.expand_s for t in timings]), "s", "resolve tasks + expand"
            ),
            Figure(
                "publish_s",
                median([t.publish_s for t in timings]),
                "s",
                "ledger resume check + acknowledged publishes",
            ),
            Figure(
                "raw_publish_s",
                median(floor),
                "s",
                "same payloads, plain nats-py publish_async (the floor)",
            ),
            Figure(
                "cli_process_s",
                median(cli),
                "s",
                "`trialbus submit --json`, process start to exit",
            ),
        ],
        config={"trials": workload.n_trials, "runs": ctx.runs},
    )
