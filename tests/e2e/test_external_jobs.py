"""The watcher notices a Harbor job folder made outside trialbus and ledgers it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from infra.stack import EmbeddedStack
from schemas.ids import slug
from schemas.subjects import Topology
from services.common.harbor_jobs import write_job_result
from services.importer.jobdir import import_job_dir
from tests.e2e.faultkit import records, wait_recorded
from tests.harbor_fixtures import EXAMPLE_TASKS, TrialSpec, _run_trials

pytestmark = pytest.mark.e2e


async def test_external_harbor_job_is_imported_by_the_watcher(
    tmp_path: Path, nats_url: str, ledger_url: str, topology: Topology, ledger_db: str
) -> None:
    stack = EmbeddedStack(
        tmp_path / "stack",
        prefix=topology.prefix,
        ledger_db=ledger_db,
        nats_url=nats_url,
        ledger_url=ledger_url,
        extra_env={"TRIALBUS_SCAN_INTERVAL_S": "0.5"},
    )
    await asyncio.to_thread(stack.start)
    try:
        # A job folder as `harbor run` leaves it: trial folders, then a finished
        # job-level result.json; no trialbus marker.
        job = stack.jobs_dir / "2026-11-25__12-00-00"
        job.mkdir(parents=True)
        await _run_trials(
            job,
            [
                TrialSpec("hello-file__ext1", EXAMPLE_TASKS / "hello-file", "oracle"),
                TrialSpec("hello-file__ext2", EXAMPLE_TASKS / "hello-file", "nop"),
                TrialSpec("broken-verifier__ext3", EXAMPLE_TASKS / "broken-verifier", "oracle"),
            ],
        )
        experiment_id = f"harbor-{slug(job.name)}"
        await asyncio.to_thread(write_job_result, job, experiment_id, 3)
        recs, _ = await wait_recorded(ledger_url, ledger_db, experiment_id, 3, 60)
        by_id = {r.trial_id: r for r in recs}
        assert by_id["hello-file__ext1"].evaluation.main_reward == 1.0
        assert by_id["hello-file__ext2"].evaluation.main_reward == 0.0
        assert by_id["broken-verifier__ext3"].evaluation.failure_class == "verifier"
        assert {r.provenance.source for r in recs} == {"external"}
        # Importing the same folder by hand afterwards changes nothing.
        from services.common.adapters.mongo_ledger import MongoLedger

        ledger = MongoLedger(ledger_url, ledger_db)
        try:
            summary = await import_job_dir(job, ledger)
        finally:
            await ledger.close()
        assert (summary.total, summary.imported, summary.unchanged) == (3, 0, 3)
        assert await records(ledger_url, ledger_db, experiment_id) == recs
    finally:
        await asyncio.to_thread(stack.stop)
