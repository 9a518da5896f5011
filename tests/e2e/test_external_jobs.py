"""The watcher notices a Harbor job folder made outside trialbus and ledgers it."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from schemas.events import ExperimentSubmitted
from schemas.ids import slug
from services.common.harbor_jobs import write_job_result
from tests.e2e.conftest import Stacks
from tests.e2e.faultkit import ledger_records
from tests.harbor_fixtures import EXAMPLE_TASKS, harbor_trial, run_trials

pytestmark = pytest.mark.e2e


async def test_external_harbor_job_is_imported_by_the_watcher(stacks: Stacks) -> None:
    stack = await stacks.start(extra_env={"TRIALBUS_SCAN_INTERVAL_S": "0.5"})
    tap = await stacks.tap(stack)
    # A job folder as `harbor run` leaves it: trial folders, then a finished
    # job-level result.json; no trialbus marker.
    job = stack.jobs_dir / "2026-11-25__12-00-00"
    job.mkdir(parents=True)
    trials = [
        harbor_trial("hello-file__ext1", EXAMPLE_TASKS / "hello-file", "oracle"),
        harbor_trial("hello-file__ext2", EXAMPLE_TASKS / "hello-file", "nop"),
        harbor_trial("broken-verifier__ext3", EXAMPLE_TASKS / "broken-verifier", "oracle"),
    ]
    await run_trials(job, trials)
    experiment_id = f"harbor-{slug(job.name)}"
    await asyncio.to_thread(write_job_result, job, experiment_id, 3)
    await tap.all_imported(experiment_id, {t.trial_name for t in trials}, 60)
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


async def test_a_copied_external_job_is_left_out_and_no_experiment_waits_forever(
    stacks: Stacks,
) -> None:
    # A copy of a job folder names the original's trials (a trial's id is its folder's
    # name), and the importer never moves a record between experiments: announcing the
    # copy would leave an experiment listed as waiting for trials it can never record.
    stack = await stacks.start(extra_env={"TRIALBUS_SCAN_INTERVAL_S": "0.5"})
    tap = await stacks.tap(stack)
    job = stack.jobs_dir / "2026-11-25__12-00-00"
    job.mkdir(parents=True)
    await run_trials(
        job, [harbor_trial("hello-file__orig1", EXAMPLE_TASKS / "hello-file", "oracle")]
    )
    original = f"harbor-{slug(job.name)}"
    await asyncio.to_thread(write_job_result, job, original, 1)
    await tap.all_imported(original, {"hello-file__orig1"}, 60)

    # Copied under a hidden name and renamed: the watcher never sees half a copy.
    hidden = stack.jobs_dir / ".copying"
    await asyncio.to_thread(shutil.copytree, job, hidden)
    copy = hidden.rename(stack.jobs_dir / "2026-11-25__12-00-00-copy")
    # A new job, finished after the copy is in place and named after it: once its trial
    # is recorded, the watcher has scanned the copy.
    later = stack.jobs_dir / "2026-11-25__13-00-00"
    later.mkdir()
    await run_trials(
        later, [harbor_trial("hello-file__later1", EXAMPLE_TASKS / "hello-file", "nop")]
    )
    newer = f"harbor-{slug(later.name)}"
    await asyncio.to_thread(write_job_result, later, newer, 1)
    await tap.all_imported(newer, {"hello-file__later1"}, 60)

    submitted = [e.experiment_id for e in tap.events if isinstance(e, ExperimentSubmitted)]
    assert submitted == [original, newer]  # the copy is not an experiment
    listed = [r["experiment_id"] for r in await stacks.cli(stack).ajson("experiments")]
    assert f"harbor-{slug(copy.name)}" not in listed and {original, newer} <= set(listed)
    # The original keeps its record, and the watcher said why the copy was left out.
    [record] = await ledger_records(stack, original)
    assert record.trial_id == "hello-file__orig1"
    log = (stack.data_dir / "logs" / "watcher.log").read_text(encoding="utf-8")
    assert "trials that are another experiment's are left out" in log
