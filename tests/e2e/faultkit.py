"""Helpers for fault-injection tests: manifests, submission, and the verdict.

Trials run on the instant (benchmark) executor with a delay, so each test controls
timing without Harbor's cost. Submission goes through the real ``trialbus`` command;
the verdict (tests/e2e/ledger_check.py) comes from what the system itself recorded,
the events stream and the ledger, never from the test's own bookkeeping.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.instant_executor import EXECUTOR_SPEC as INSTANT_EXECUTOR
from infra.stack import EmbeddedStack
from schemas.events import Event
from schemas.ids import trial_id_for
from schemas.manifest import ExperimentManifest, TaskPath
from schemas.subjects import Topology
from tests.e2e.cli import ROOT, Cli
from tests.e2e.events import read_events
from tests.e2e.ledger_check import LedgerCheck, check_ledger
from tests.support.manifests import nop_manifest
from tests.support.records import records_in


def instant_runner_env(delay_s: float, **extra: str) -> dict[str, str]:
    """Runner settings for the instant executor; short ack_wait so a killed runner's
    trials come back quickly."""
    return {
        "TRIALBUS_EXECUTOR": INSTANT_EXECUTOR,  # completes trials without Harbor
        "TRIALBUS_INSTANT_DELAY_S": str(delay_s),
        "TRIALBUS_ACK_WAIT_S": "4",
        "TRIALBUS_HEARTBEAT_S": "1",
        **extra,
    }


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
    return nop_manifest(
        folder,
        name,
        agents=n_agents,
        repetitions=reps,
        concurrency=concurrency,
        retry={"max_attempts": max_attempts, "backoff_seconds": backoff_s},
    )


@dataclass(frozen=True)
class Submitted:
    """An experiment as the CLI submitted it, and the trial ids it must end with."""

    experiment_id: str
    trial_ids: frozenset[str]
    n_published: int


def expected_trial_ids(manifest_path: Path, experiment_id: str) -> frozenset[str]:
    """The trial ids a manifest of task folders expands to (schemas/ids.py, the contract).

    Computed independently of the submitter, so a trial it failed to publish shows up
    as missing instead of silently shrinking the expectation.
    """
    manifest = ExperimentManifest.model_validate(yaml.safe_load(manifest_path.read_text()))
    tasks = [Path(t.path).name for t in manifest.tasks if isinstance(t, TaskPath)]
    return frozenset(
        trial_id_for(experiment_id, task, a.agent_ref, a.model, a.kwargs, rep)
        for a in manifest.agents
        for task in tasks
        for rep in range(manifest.repetitions)
    )


async def submit(cli: Cli, manifest: Path) -> Submitted:
    """``trialbus submit MANIFEST --json`` (no wait)."""
    summary = await cli.ajson("submit", str(manifest))
    ids = expected_trial_ids(manifest, summary["experiment_id"])
    assert summary["n_trials"] == len(ids), summary
    return Submitted(summary["experiment_id"], ids, summary["n_published"])


async def ledger_records(stack: EmbeddedStack, experiment_id: str) -> list[Any]:
    """The experiment's records in ``stack``'s ledger."""
    return await records_in(stack.ledger_url or "", stack.ledger_db, experiment_id)


async def judge(
    name: str,
    stack: EmbeddedStack,
    submitted: Submitted,
    *,
    recovery_s: float | None = None,
    events: Sequence[Event] | None = None,
) -> LedgerCheck:
    """Check the experiment (events + ledger), print and keep its figures.

    The ``fault:`` line is what docs/reliability.md quotes. ``events``: the stream as
    the caller read it afresh where the stack's own URL cannot read it (a cluster whose
    first node was killed, a server with users); by default it is read from the stack.
    """
    if events is None:
        events = await read_events(stack.nats_url or "", Topology(stack.prefix))
    records = await ledger_records(stack, submitted.experiment_id)
    check = check_ledger(submitted.experiment_id, set(submitted.trial_ids), events, records)
    rec = f" recovery_s={recovery_s:.1f}" if recovery_s is not None else ""
    print(
        f"fault: {name} submitted={check.submitted} ledgered={check.ledgered} "
        f"duplicates={check.duplicates} stale={check.stale} missing={check.missing} "
        f"unexpected={check.unexpected} reruns={check.reruns}{rec}"
    )
    figures = ROOT / ".trialbus" / "reliability.jsonl"
    figures.parent.mkdir(exist_ok=True)
    with figures.open("a") as fh:
        row = {k: v for k, v in check.__dict__.items() if k != "problems"}
        fh.write(json.dumps({"name": name, **row, "recovery_s": recovery_s}) + "\n")
    return check
