"""5. Import: ``trialbus import`` of a Harbor job folder with 10,000 trial results.

The folder is made once per benchmark run: ``harbor run`` produces real trials
(hello-file and count-words x nop and oracle), then their folders are copied under
fresh names until there are N (result.json's trial_name, id and trial_uri follow the
new name, as Harbor would have written them). Each measured import goes into a fresh
ledger. The job folder's files are in the page cache, as they are right after a job.

Headline: the CLI command, process start to exit. Beside it, in the same run: the
same import in process (``import_job_dir``, no interpreter start), the raw PyMongo
bulk upsert of the very records it wrote, and with ``--mongo-url`` both against
real MongoDB too.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from benchmarks import ceilings
from benchmarks.harbor_cli import run_harbor
from benchmarks.harness import REPO, BenchResult, Context, Figure, fresh_dir, median
from benchmarks.workload import quick_trials
from infra.embedded import LedgerServer
from schemas.record import TrialRecord
from services.common.adapters.mongo_ledger import MongoLedger
from services.importer.jobdir import import_job_dir

BATCH = 500  # import_job_dir's default batch size


def make_job_dir(ctx: Context, n: int) -> Path:
    """A Harbor job folder of ``n`` trials replicated from real Harbor trials."""
    seed_dir = ctx.path("import-seed")
    # Every task x agent once is seed enough for the quick mode's smoke test.
    run_harbor(quick_trials(repetitions=1 if ctx.quick else 2), seed_dir)
    source = seed_dir / "jobs" / "bench-harbor"
    seeds = sorted(p for p in source.iterdir() if (p / "result.json").is_file())
    job = fresh_dir(ctx.path("import-job", "bench-import-job"))
    for name in ("config.json", "result.json"):
        shutil.copy2(source / name, job / name)
    for i in range(n):
        seed = seeds[i % len(seeds)]
        task = seed.name.split("__")[0]
        dest = job / f"{task}__{i:06d}"
        shutil.copytree(seed, dest)
        _rename_trial(dest)
    return job


def _rename_trial(trial_dir: Path) -> None:
    result_path = trial_dir / "result.json"
    result = json.loads(result_path.read_text())
    result["trial_name"] = trial_dir.name
    result["id"] = str(uuid.uuid4())
    result["trial_uri"] = trial_dir.resolve().as_uri()
    result_path.write_text(json.dumps(result, indent=4))
    config_path = trial_dir / "config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        config["trial_name"] = trial_dir.name
        config_path.write_text(json.dumps(config, indent=4))


def cli_import_s(ledger_url: str, database: str, job: Path, n: int) -> float:
    """Wall seconds of ``trialbus import JOB --json`` into ``database``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_")}
    env.update(
        {
            "LEDGER_URL": ledger_url,
            "NATS_URL": "nats://127.0.0.1:1",  # unused by import; never the user's stack
            "TRIALBUS_LEDGER_DB": database,
            "TRIALBUS_STACK_FILE": str(job.parent / "no-stack.json"),
        }
    )
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "services", "import", str(job), "--json"],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - t0
    summary = json.loads(out.stdout)
    if summary["inserted"] != n or summary["errors"]:
        raise AssertionError(
            f"import inserted {summary['inserted']} of {n}: {summary['errors'][:3]}"
        )
    return elapsed


async def in_process_import(
    ledger_url: str, database: str, job: Path, n: int
) -> tuple[float, list[TrialRecord]]:
    """(seconds, records written) of ``import_job_dir`` into a fresh database."""
    ledger = MongoLedger(ledger_url, database)
    try:
        await ledger.ensure_indexes()
        t0 = time.perf_counter()
        summary = await import_job_dir(job, ledger)
        elapsed = time.perf_counter() - t0
        if summary.inserted != n:
            raise AssertionError(f"import inserted {summary.inserted} of {n}")
        records = await ledger.records_for(summary.experiment_id)
    finally:
        await ledger.close()
    return elapsed, records


def measure_ledger(url: str, job: Path, n: int, tag: str) -> dict[str, float]:
    """CLI, in-process and raw rates against the ledger at ``url`` (fresh databases)."""
    db = f"bench_import_{tag}_{uuid.uuid4().hex[:6]}"
    cli = n / cli_import_s(url, db + "_cli", job, n)
    seconds, records = asyncio.run(in_process_import(url, db + "_lib", job, n))
    raw = asyncio.run(ceilings.ledger_raw_upsert_rate(url, db + "_raw", records, BATCH))
    return {"cli": cli, "in_process": n / seconds, "raw": raw}


def run(ctx: Context) -> BenchResult:
    n = 100 if ctx.quick else 10_000
    ctx.log(f"import: making a Harbor job folder of {n} trials")
    job = make_job_dir(ctx, n)
    embedded: list[dict[str, float]] = []
    mongo: list[dict[str, float]] = []
    for i in range(ctx.runs):
        ctx.log(f"import run {i + 1}/{ctx.runs}: {n} trials into a fresh ledger")
        ledger = LedgerServer(fresh_dir(ctx.path(f"import-ledger-{i}"))).start()
        try:
            embedded.append(measure_ledger(ledger.url, job, n, "embedded"))
        finally:
            ledger.kill()  # throwaway data: no graceful (2 s) shutdown
        if ctx.mongo_url:
            ctx.log(f"import run {i + 1}/{ctx.runs}: into MongoDB at the given URL")
            mongo.append(measure_ledger(ctx.mongo_url, job, n, "mongo"))
    peers = [
        Figure(
            "in_process_rate",
            median([e["in_process"] for e in embedded]),
            "trials/s",
            "import_job_dir, no interpreter start",
        ),
        Figure(
            "ledger_bulk_upsert_ceiling",
            median([e["raw"] for e in embedded]),
            "docs/s",
            f"plain PyMongo, same records, batches of {BATCH}",
        ),
    ]
    if mongo:
        peers += [
            Figure("mongodb_cli_rate", median([m["cli"] for m in mongo]), "trials/s"),
            Figure("mongodb_in_process_rate", median([m["in_process"] for m in mongo]), "trials/s"),
            Figure("mongodb_bulk_upsert_ceiling", median([m["raw"] for m in mongo]), "docs/s"),
        ]
    return BenchResult(
        name="import",
        title="Import: `trialbus import` of a Harbor job folder into the embedded ledger",
        value=median([e["cli"] for e in embedded]),
        unit="trials/s",
        target=2000.0,
        target_op=">=",
        runs=[e["cli"] for e in embedded],
        peers=peers,
        config={"trials": n, "batch": BATCH, "runs": ctx.runs, "mongodb": bool(ctx.mongo_url)},
        notes=[] if ctx.mongo_url else ["no --mongo-url given: real MongoDB not measured"],
    )
