"""Helpers for fault-injection tests: manifests, submission, waiting, figures.

Figures are computed from what the system itself recorded: the ledger (records per
trial) and the events stream (TrialStarted per run), never from the test's own
bookkeeping.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import yaml
from nats.js.api import DeliverPolicy

from schemas.events import TrialStarted, parse_event
from schemas.record import TrialRecord
from schemas.subjects import Topology
from services.common.adapters.jetstream import JetStreamBus, ensure_streams
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.adapters.nats_kv import NatsCoordinator
from services.submitter.manifest_io import parse_manifest
from services.submitter.submit import SubmitResult, prepare, publish_experiment

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "examples" / "tasks" / "hello-file"


def write_manifest(
    folder: Path,
    n_trials: int,
    *,
    name: str = "faults",
    concurrency: int = 1000,
    max_attempts: int = 3,
    backoff_s: float = 0.2,
) -> Path:
    """A manifest of ``n_trials`` trials (agents x repetitions of one task)."""
    reps = min(100, n_trials)
    n_agents = -(-n_trials // reps)
    assert n_agents * reps == n_trials, "n_trials must be <= 100 or a multiple of 100"
    data: dict[str, Any] = {
        "name": name,
        "tasks": [str(TASK)],
        "agents": [
            {"name": "nop", "label": f"nop-{i}", "kwargs": {"i": i}} for i in range(n_agents)
        ],
        "repetitions": reps,
        "compute": {"environment": "local", "n_concurrent_trials": concurrency},
        "retry": {"max_attempts": max_attempts, "backoff_seconds": backoff_s},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


async def submit(
    nats_url: str, ledger_url: str, db: str, topo: Topology, manifest: Path
) -> SubmitResult:
    """Submit a manifest the way `trialbus submit` does."""
    prepared = prepare(
        parse_manifest(yaml.safe_load(manifest.read_text()), str(manifest)), manifest.parent
    )
    nc = await nats.connect(nats_url)
    ledger = MongoLedger(ledger_url, db)
    try:
        js = nc.jetstream()
        await ensure_streams(js, topo)
        coord = await NatsCoordinator.open(js, topo, lease_ttl_s=60)
        await coord.uncancel(prepared.experiment_id)
        return await publish_experiment(prepared, JetStreamBus(js, topo), ledger)
    finally:
        await ledger.close()
        await nc.close()


async def records(ledger_url: str, db: str, experiment_id: str) -> list[TrialRecord]:
    ledger = MongoLedger(ledger_url, db, server_selection_timeout_ms=2000)
    try:
        return await ledger.records_for(experiment_id)
    finally:
        await ledger.close()


async def wait_recorded(
    ledger_url: str, db: str, experiment_id: str, n: int, timeout_s: float
) -> tuple[list[TrialRecord], float]:
    """Poll the ledger until it holds ``n`` records (returns them and the time taken)."""
    t0 = time.monotonic()
    recs: list[TrialRecord] = []
    while time.monotonic() - t0 < timeout_s:
        try:
            recs = await records(ledger_url, db, experiment_id)
        except Exception:  # noqa: BLE001 - the ledger may be down on purpose
            recs = []
        if len(recs) >= n:
            return recs, time.monotonic() - t0
        await asyncio.sleep(0.25)
    raise AssertionError(f"only {len(recs)} of {n} trials recorded after {timeout_s:.0f}s")


async def events_of(nats_url: str, topo: Topology) -> list[Any]:
    """Every event in the test's events stream, in order."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(topo.events_stream)
        total = info.state.messages
        sub = await js.subscribe(
            topo.events_wildcard, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
        )
        out = []
        for _ in range(total):
            msg = await sub.next_msg(timeout=10)
            out.append(parse_event(msg.data))
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()


@dataclass
class Figures:
    """What a fault test reports."""

    name: str
    submitted: int
    ledgered: int
    duplicates: int
    missing: int
    rerun: int
    recovery_s: float | None = None

    def line(self) -> str:
        rec = f" recovery_s={self.recovery_s:.1f}" if self.recovery_s is not None else ""
        return (
            f"fault: {self.name} submitted={self.submitted} ledgered={self.ledgered} "
            f"duplicates={self.duplicates} missing={self.missing} reruns={self.rerun}{rec}"
        )


async def figures(
    name: str,
    result: SubmitResult,
    recs: list[TrialRecord],
    nats_url: str,
    topo: Topology,
    recovery_s: float | None = None,
) -> Figures:
    """submitted / ledgered / duplicates (records or runs beyond one) / missing."""
    ids = Counter(r.trial_id for r in recs)
    starts = Counter(
        e.trial_id for e in await events_of(nats_url, topo) if isinstance(e, TrialStarted)
    )
    fig = Figures(
        name=name,
        submitted=result.n_trials,
        ledgered=len(ids),
        duplicates=sum(n - 1 for n in ids.values()),
        missing=len(set(result.trial_ids) - set(ids)),
        rerun=sum(n - 1 for n in starts.values()),
        recovery_s=recovery_s,
    )
    print(fig.line())
    results = ROOT / ".trialbus" / "reliability.jsonl"
    results.parent.mkdir(exist_ok=True)
    with results.open("a") as fh:
        fh.write(json.dumps(fig.__dict__) + "\n")
    return fig
