"""The watcher notices a Harbor job folder made outside trialbus and ledgers it."""

from __future__ import annotations

import asyncio

import pytest

from schemas.ids import slug
from services.common.harbor_jobs import write_job_result
from tests.e2e.conftest import Stacks
from tests.e2e.faultkit import ledger_records
from tests.harbor_fixtures import EXAMPLE_TASKS, TrialSpec, run_trials

pytestmark = pytest.mark.e2e


async def test_external_harbor_job_is_imported_by_the_watcher(stacks: Stacks) -> None:
    stack = await stacks.start(extra_env={"TRIALBUS_SCAN_INTERVAL_S": "0.5"})
    tap = await stacks.tap(stack)
    # A job folder as `harbor run` leaves it: trial folders, then a finished
    # job-level result.json; no trialbus marker.
    job = stack.jobs_dir / "2026-11-25__12-00-00"
    job.mkdir(parents=True)
    trials = [
        TrialSpec("hello-file__ext1", EXAMPLE_TASKS / "hello-file", "oracle"),
        TrialSpec("hello-file__ext2", EXAMPLE_TASKS / "hello-file", "nop"),
        TrialSpec("broken-verifier__ext3", EXAMPLE_TASKS / "broken-verifier", "oracle"),
    ]
    await run_trials(job, trials)
    experiment_id = f"harbor-{slug(job.name)}"
    await asyncio.to_thread(write_job_result, job, experiment_id, 3)
    await tap.all_imported(experiment_id, {t.name for t in trials}, 60)
    recs = await ledger_records(stack, experiment_id)
    by_id = {r.trial_id: r for r in recs}
    assert by_id["hello-file__ext1"].evaluation.main_reward == 1.0
    assert by_id["hello-file__ext2"].evaluation.main_reward == 0.0
    assert by_id["broken-verifier__ext3"].evaluation.failure_class == "verifier"
    assert {r.provenance.source for r in recs} == {"external"}
    # Importing the same folder by hand afterwards changes nothing.
    cli = stacks.cli(stack)
    summary = await cli.ajson("import", str(job))
    assert (summary["total"], summary["imported"], summary["unchanged"]) == (3, 0, 3)
    assert await ledger_records(stack, experiment_id) == recs
    # Nobody submitted it, yet it is listed, and its status counts each trial once
    # (the re-import added nothing to the ledger's tally).
    listed = [r["experiment_id"] for r in await cli.ajson("experiments")]
    assert experiment_id in listed
    status = await cli.ajson("status", experiment_id)
    assert (status["recorded"], status["scored"], status["unscored"]) == (3, 2, 1)
    assert status["unscored_verifier"] == 1 and status["pending"] == 0
