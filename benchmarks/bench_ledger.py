"""8. The ledger at scale: the reports' queries on many records in the embedded ledger.

The embedded ledger is SecantusDB (``secantusd-py``, a single-node MongoDB-wire
server written in Python, beta); production uses MongoDB, where the same indexes
apply (docs/operations.md). E experiments x T trials of realistic records (four
agents with models, token usage, phase timings, rewards, a tenth unscored) are loaded
through ``MongoLedger.upsert_records`` in batches of ``LOAD_BATCH`` (the importer's
write path: an unordered insert of new trials), with each experiment's submission
metadata. Then every query a report makes is timed through the one read path
(``services.reports.queries`` and the Ledger port), on an experiment in the middle:

- ``records_for`` (every report loads this), ``scored_trial_ids`` (resume),
  ``count_records`` (watcher), ``get_record`` (dashboard trial page),
  ``experiment_ids`` (the experiment list);
- ``status``, ``leaderboard``, ``report`` and ``trials`` end to end (ledger read +
  building):
  what a one-shot CLI read costs, and the HTTP API's first read of an experiment;
- ``leaderboard_cached`` and ``report_cached``: the same reads through a
  ``ReportCache`` (the HTTP API's) once it holds the experiment's current version:
  one read of the content version, no record read;
- ``leaderboard_stored``, ``report_stored``, ``page_stored`` and ``trials_stored``
  (the headline is the slowest of these, the list and status): a new process's
  read, no cache, with the value kept in the ledger (services/reports/stored.py): a
  new ``MongoLedger`` each sample, then the content version and one ``derived``
  document, no record. ``leaderboard``, ``report`` and ``trials`` are then a miss:
  the kept values are deleted before each sample, so they read every record,
  compute, and keep the value again;
  ``*_kept_kib`` are the kept values' sizes (zlib-compressed JSON).

Twice: first with the indexes ``MongoLedger.ensure_indexes`` created before this
benchmark existed (``BEFORE_INDEXES``), then after ``ensure_indexes`` (today's set),
on the same data, then once more with the new indexes dropped (A-B-A: the load of a
shared machine drifts within minutes; both "before" samples count); then a fifth of
an experiment more is loaded, to show what the new
indexes cost each write. Records are built before the clock starts. Load time and
disk use (the ledger's data folder) are reported, and the one-time listing backfill
(``ExperimentStore.backfill_listing``: what the first start of this version costs a
ledger written before the experiment list read the experiments collection alone).

``status`` reads the experiment's tally (one document) and the experiment list the
experiments collection: both kept by ``upsert_records`` during the load, so the load
rate includes their cost.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pymongo import ASCENDING, AsyncMongoClient

from benchmarks.harness import BenchResult, Context, Figure, fresh_dir, median
from benchmarks.wrapped_ledger import counting_reads
from infra.embedded import LedgerServer
from schemas.record import TrialRecord
from services.common.adapters.mongo_experiments import BACKFILL_ID, ExperimentStore
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.ports import ExperimentInfo
from services.reports import formatting, queries
from services.reports.report_cache import ReportCache
from services.reports.trials import experiment_trials
from services.submitter.dashboard_stream import page_view

FULL = (10, 10_000)
QUICK = (2, 100)
ENV = "TRIALBUS_BENCH_LEDGER"
"""Override as ``EXPERIMENTS:TRIALS`` (e.g. ``100:10000`` for a million records)."""
LOAD_BATCH = 1000
REPEATS = 3
TARGET_MS = 200.0
DB = "bench"
HEADLINE = (
    "experiment_ids",
    "status",
    "leaderboard_stored",
    "report_stored",
    "page_stored",
    "trials_stored",
)
"""What a user waits on once an experiment's values are kept: the list, status, and a new
process's leaderboard, report, experiment page and trial list (the headline is the
slowest)."""
BEFORE_INDEXES: list[tuple[str, list[tuple[str, int]], bool]] = [
    ("trials", [("trial_id", ASCENDING)], True),
    ("trials", [("experiment_id", ASCENDING)], False),
    ("experiments", [("experiment_id", ASCENDING)], True),
]
"""The indexes ensure_indexes created before this benchmark (trialbus 2026-11-26)."""
AGENTS = [
    ("claude-code", "claude-sonnet-4"),
    ("codex", "gpt-5"),
    ("terminus", "gpt-5"),
    ("nop", ""),
]


def sizes(quick: bool) -> tuple[int, int]:
    """(experiments, trials per experiment) for this run."""
    raw = os.environ.get(ENV)
    if raw:
        e, t = raw.split(":")
        return int(e), int(t)
    return QUICK if quick else FULL


def synthetic_record(rng: random.Random, exp: str, i: int, t0: datetime) -> TrialRecord:
    """One realistic record (see the module docstring)."""
    agent, model = AGENTS[i % len(AGENTS)]
    task = f"task-{i // len(AGENTS) % 500:03d}"
    trial_id = f"{task}__{exp[-6:]}{i:07d}"
    started = t0 + timedelta(seconds=i)
    phases = [rng.uniform(1, 20), rng.uniform(1, 10), rng.uniform(30, 600), rng.uniform(5, 60)]
    valid = rng.random() > 0.1
    reward = float(rng.random() < 0.4) if valid else None
    label = formatting.agent_at(agent, model)
    job = f"/srv/trialbus/jobs/{exp}"
    return TrialRecord.model_validate(
        {
            "trial_id": trial_id,
            "experiment_id": exp,
            "repetition": i // 2000,
            "status": "complete",
            "provenance": {
                "task_name": task,
                "task_checksum": f"{rng.getrandbits(256):064x}",
                "agent_name": agent,
                "agent_label": label,
                "agent_version": "1.0.3",
                "model": model or None,
                "environment": "docker",
                "harbor_version": "0.3.0",
                "runner_host": f"runner-{i % 8}",
                "source": "runner",
                "job_id": f"{rng.getrandbits(128):032x}",
            },
            "timing": {
                "started_at": started.isoformat(),
                "finished_at": (started + timedelta(seconds=sum(phases))).isoformat(),
                "total_s": sum(phases),
                "environment_setup_s": phases[0],
                "agent_setup_s": phases[1],
                "agent_execution_s": phases[2],
                "verifier_s": phases[3],
            },
            "evaluation": {
                "rewards": {"reward": reward} if valid else {},
                "main_reward_key": "reward",
                "main_reward": reward,
                "reward_valid": valid,
                "failure_class": "none" if valid else "agent",
                "exception_type": None if valid else "AgentTimeoutError",
                "exception_message": None if valid else "agent did not finish in 900 s",
            },
            "usage": {
                "n_input_tokens": rng.randrange(10**4, 10**6),
                "n_cache_tokens": rng.randrange(0, 10**5),
                "n_output_tokens": rng.randrange(10**3, 10**5),
                "cost_usd": round(rng.uniform(0.01, 3.0), 4),
            },
            "artifacts": {
                "trial_dir": f"{job}/{trial_id}",
                "job_dir": job,
                "result_path": f"{job}/{trial_id}/result.json",
                "verifier_dir": f"{job}/{trial_id}/verifier",
                "agent_dir": f"{job}/{trial_id}/agent",
            },
            "attempts": 1,
        }
    )


def manifest(exp: str) -> dict[str, Any]:
    """The stored manifest of a synthetic experiment (its agents give the expected counts)."""
    agents = [{"name": a, "model": m or None} for a, m in AGENTS]
    return {"name": exp, "agents": agents, "tasks": [{"path": "tasks"}]}


async def load(url: str, n_exp: int, n_trials: int, *, first: int = 0) -> tuple[float, int]:
    """Load the records and metadata; (seconds in upserts, records inserted).

    Records are built before the clock starts: this times the ledger and the
    adapter's write path, not the synthetic data.
    """
    ledger = MongoLedger(url, DB)
    rng = random.Random(first)
    t_base = datetime(2026, 11, 1, tzinfo=UTC)
    total = 0
    elapsed = 0.0
    try:
        for e in range(first, first + n_exp):
            exp = f"exp-{e:03d}-{rng.getrandbits(24):06x}"
            records = [
                synthetic_record(rng, exp, i, t_base + timedelta(hours=e)) for i in range(n_trials)
            ]
            t0 = time.perf_counter()
            await ledger.upsert_experiment(
                ExperimentInfo(exp, f"experiment {e}", n_trials, manifest(exp))
            )
            for start in range(0, n_trials, LOAD_BATCH):
                outcome = await ledger.upsert_records(records[start : start + LOAD_BATCH])
                total += len(outcome.inserted)
            elapsed += time.perf_counter() - t0
    finally:
        await ledger.close()
    return elapsed, total


async def create_before_indexes(url: str) -> None:
    """The indexes of ``BEFORE_INDEXES`` only (what the ledger had before).

    The listing backfill is marked done: a ledger this version writes from empty had
    it run at its first start (nothing to do then); it is timed apart
    (``time_backfill``).
    """
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        for coll, keys, unique in BEFORE_INDEXES:
            await client[DB][coll].create_index(keys, unique=unique)
        await client[DB]["ledger_meta"].insert_one({"_id": BACKFILL_ID})
    finally:
        await client.close()


async def time_backfill(url: str) -> float:
    """Seconds of the one-time listing backfill on the loaded ledger (marker removed)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        await client[DB]["ledger_meta"].delete_one({"_id": BACKFILL_ID})
        store = ExperimentStore(client[DB]["experiments"], client[DB]["ledger_meta"])
        t0 = time.perf_counter()
        await store.backfill_listing(client[DB]["trials"])
        return time.perf_counter() - t0
    finally:
        await client.close()


async def _ms(
    op: Callable[[], Awaitable[object]], before: Callable[[], Awaitable[object]] | None = None
) -> list[float]:
    """``REPEATS`` timings of ``op``, each after ``before`` (not timed)."""
    samples = []
    for _ in range(REPEATS):
        if before is not None:
            await before()
        t0 = time.perf_counter()
        await op()
        samples.append(1000 * (time.perf_counter() - t0))
    return samples


async def _cached_ms(ledger: MongoLedger, exp: str) -> dict[str, list[float]]:
    """Warm reads through a ReportCache: the first read of each kind fills it (not
    timed: it is the uncached figure plus one version read)."""
    cache = ReportCache()
    await queries.experiment_leaderboard(ledger, exp, cache=cache)
    await queries.experiment_report(ledger, exp, cache=cache)
    out = {
        "leaderboard_cached": await _ms(
            lambda: queries.experiment_leaderboard(ledger, exp, cache=cache)
        ),
        "report_cached": await _ms(lambda: queries.experiment_report(ledger, exp, cache=cache)),
    }
    if cache.stats().misses != 2:
        raise AssertionError(f"the cached reads missed: {cache.stats()}")
    return out


async def _stored_ms(url: str, ledger: MongoLedger, exp: str) -> dict[str, list[float]]:
    """Reads of a new process with the value kept in the ledger (``services.reports.
    stored``): each sample a new ``MongoLedger`` (its connection included) and no
    cache, as a one-shot ``trialbus leaderboard`` / ``report`` or the API's first
    read after a restart. The values were kept by the misses timed before; the page's
    view is computed (and kept) once here, not timed."""
    await page_view(ledger, exp, None)

    async def fresh(read: Callable[[MongoLedger], Awaitable[object]]) -> None:
        new = MongoLedger(url, DB)
        try:
            reader, counted = counting_reads(new)
            await read(reader)
            if counted.record_reads:
                raise AssertionError("a stored read read the records: nothing was kept")
        finally:
            await new.close()

    return {
        "leaderboard_stored": await _ms(
            lambda: fresh(lambda led: queries.experiment_leaderboard(led, exp))
        ),
        "report_stored": await _ms(lambda: fresh(lambda led: queries.experiment_report(led, exp))),
        "page_stored": await _ms(lambda: fresh(lambda led: page_view(led, exp, None))),
        "trials_stored": await _ms(lambda: fresh(lambda led: experiment_trials(led, exp))),
    }


async def stored_sizes(url: str) -> dict[str, float]:
    """KiB of each kind's kept value (zlib-compressed JSON) of the middle experiment."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        return {
            f"{doc['_id']['kind']}_kept_kib": len(doc["blob"]) / 1024
            async for doc in client[DB]["derived"].find({})
        }
    finally:
        await client.close()


async def time_queries(url: str) -> dict[str, list[float]]:
    """Milliseconds of each read (``REPEATS`` samples), on a middle experiment.

    ``leaderboard``, ``report`` and ``trials``: a miss (what the first read after a write
    costs): the kept values are deleted before each sample, so it reads every record,
    computes, and keeps the value again. ``*_stored``: the next new process's read.
    """
    ledger = MongoLedger(url, DB)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)

    async def forget() -> None:
        await client[DB]["derived"].delete_many({})

    try:
        ids = await ledger.experiment_ids()
        exp = ids[len(ids) // 2]
        some = (await ledger.records_for(exp))[len(ids) // 2].trial_id
        return {
            "experiment_ids": await _ms(ledger.experiment_ids),
            "records_for": await _ms(lambda: ledger.records_for(exp)),
            "scored_trial_ids": await _ms(lambda: ledger.scored_trial_ids(exp)),
            "count_records": await _ms(lambda: ledger.count_records(exp)),
            "get_record": await _ms(lambda: ledger.get_record(some)),
            "status": await _ms(lambda: queries.experiment_status(ledger, exp)),
            "leaderboard": await _ms(lambda: queries.experiment_leaderboard(ledger, exp), forget),
            "report": await _ms(lambda: queries.experiment_report(ledger, exp), forget),
            "trials": await _ms(lambda: experiment_trials(ledger, exp), forget),
            **await _cached_ms(ledger, exp),
            **await _stored_ms(url, ledger, exp),
        }
    finally:
        await client.close()
        await ledger.close()


async def add_indexes(url: str) -> float:
    """Seconds ``MongoLedger.ensure_indexes`` takes on the loaded ledger."""
    ledger = MongoLedger(url, DB)
    try:
        t0 = time.perf_counter()
        await ledger.ensure_indexes()
        return time.perf_counter() - t0
    finally:
        await ledger.close()


async def drop_new_indexes(url: str) -> None:
    """Drop every index ``BEFORE_INDEXES`` does not name (back to the old set)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        for coll in ("trials", "experiments"):
            old = [dict(keys) for c, keys, _u in BEFORE_INDEXES if c == coll] + [{"_id": 1}]
            async for ix in await client[DB][coll].list_indexes():
                if dict(ix["key"]) not in old:
                    await client[DB][coll].drop_index(ix["name"])
    finally:
        await client.close()


def _disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _range(samples: list[float]) -> str:
    return f"{min(samples):,.0f} / {statistics.median(samples):,.0f} / {max(samples):,.0f}"


def run(ctx: Context) -> BenchResult:
    n_exp, n_trials = sizes(ctx.quick)
    n = n_exp * n_trials
    extra = max(1, n_trials // 5)
    runs: list[dict[str, float]] = []
    samples: dict[str, list[float]] = {}
    for r in range(ctx.runs):
        ctx.log(f"ledger run {r + 1}/{ctx.runs}: loading {n_exp} x {n_trials:,} records")
        data = fresh_dir(ctx.path(f"ledger-{r}"))
        ledger = LedgerServer(data / "ledger").start()
        try:
            asyncio.run(create_before_indexes(ledger.url))
            load_s, loaded = asyncio.run(load(ledger.url, n_exp, n_trials))
            if loaded != n:
                raise AssertionError(f"loaded {loaded} of {n} records")
            ctx.log(f"ledger: loaded {n:,} in {load_s:.0f}s; timing queries")
            before = asyncio.run(time_queries(ledger.url))
            index_s = asyncio.run(add_indexes(ledger.url))
            ctx.log(f"ledger: ensure_indexes took {index_s:.0f}s; timing queries again")
            after = asyncio.run(time_queries(ledger.url))
            kept = asyncio.run(stored_sizes(ledger.url))
            # A-B-A: the load on a shared machine drifts within minutes, so "before" is
            # timed again after the new indexes are dropped, and both samples count.
            asyncio.run(drop_new_indexes(ledger.url))
            for k, v in asyncio.run(time_queries(ledger.url)).items():
                before[k] += v
            asyncio.run(add_indexes(ledger.url))
            backfill_s = asyncio.run(time_backfill(ledger.url))
            more_s, _ = asyncio.run(load(ledger.url, 1, extra, first=n_exp))
            disk = _disk_bytes(data / "ledger")
        finally:
            ledger.kill()
        for k, v in before.items():
            samples.setdefault(f"{k}_before", []).extend(v)
        for k, v in after.items():
            samples.setdefault(k, []).extend(v)
        runs.append(
            {
                "load_rate": n / load_s,
                "load_rate_after": extra / more_s,
                "load_s": load_s,
                "index_s": index_s,
                "backfill_s": backfill_s,
                "disk_mib": disk / 2**20,
                **kept,
                **{f"{k}_before_ms": statistics.median(v) for k, v in before.items()},
                **{f"{k}_ms": statistics.median(v) for k, v in after.items()},
            }
        )

    def med(key: str) -> float:
        return median([r[key] for r in runs])

    names = list(before)
    slowest = max(HEADLINE, key=lambda k: med(f"{k}_ms"))
    peers = [
        Figure(
            f"{k}_ms",
            med(f"{k}_ms"),
            "ms",
            f"min / median / max {_range(samples[k])} ms; before the new indexes "
            f"{_range(samples[k + '_before'])} ms",
            target=TARGET_MS,
            target_op="<=",
        )
        for k in names
    ]
    peers += [
        Figure("load_s", med("load_s"), "s", f"{n:,} records through upsert_records"),
        Figure("load_rate", med("load_rate"), "records/s", "with the indexes of before"),
        Figure(
            "load_rate_after",
            med("load_rate_after"),
            "records/s",
            f"{extra:,} more records with today's indexes (the price of the new ones)",
        ),
        Figure("ensure_indexes_s", med("index_s"), "s", "on the loaded ledger"),
        Figure(
            "listing_backfill_s",
            med("backfill_s"),
            "s",
            "once per ledger written before the listing (first start after upgrading)",
        ),
        Figure("disk_mib", med("disk_mib"), "MiB", f"{1024 * med('disk_mib') / n:.2f} KiB/record"),
    ]
    peers += [
        Figure(k, med(k), "KiB", f"kept {k.removesuffix('_kept_kib')} of {n_trials:,} trials")
        for k in sorted(kept)
    ]
    return BenchResult(
        name="ledger",
        title=(
            f"Ledger at scale: {n:,} records in the embedded ledger, slowest report read "
            "(new process, value kept)"
        ),
        value=med(f"{slowest}_ms"),
        unit="ms",
        target=TARGET_MS,
        target_op="<=",
        runs=[r[f"{slowest}_ms"] for r in runs],
        peers=peers,
        config={
            "experiments": n_exp,
            "trials_per_experiment": n_trials,
            "records": n,
            "query_samples": REPEATS * ctx.runs,
            "slowest": slowest,
            "server": "SecantusDB (embedded)",
            "runs": ctx.runs,
        },
    )
