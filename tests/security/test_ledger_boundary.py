"""A ledger record never changes experiment (issue 11, "Events and the ledger").

Reproduced before: two copies of one Harbor job folder imported under two names: the
second import silently moved every record to the second experiment and the first
experiment vanished from the ledger. Here, at small scale (20 trials) and against real
processes: the ``trialbus`` console script importing into the session's MongoDB-wire
ledger (NATS pointed at a closed port, so it runs ledger-only), and the importer
service on the real bus receiving a forged event for another experiment's trial.
Each refusal has its negative control: the same write for the stored experiment, or
the explicit ``--as-new``, is applied.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nats
import pytest

from infra.managed_process import free_port
from infra.service_process import ServiceProcess
from schemas.events import TrialFailed, encode_event
from schemas.subjects import Topology
from services.common.adapters.mongo_ledger import MongoLedger
from services.importer.jobdir import scoped_trial_id
from services.importer.records import build_failed_record
from tests import harbor_fixtures
from tests.harbor_fixtures import HarborTrials
from tests.support import importer_process
from tests.support.event_builders import trial_failed
from tests.support.importer_process import until
from tests.support.records import records_in

pytestmark = pytest.mark.integration

harbor_trials = harbor_fixtures.harbor_trials  # the session's real Harbor trial folders
importer = importer_process.importer  # the importer as its own process, ready
importer_env = importer_process.importer_env  # with no settings of this module's own

N_TRIALS = 20
TRIALBUS = Path(sys.executable).with_name("trialbus")
REPO = Path(__file__).resolve().parents[2]
IMPORTER_WAIT_S = 90.0
"""Bound on the importer's recording the control event."""


def _job(harbor_trials: HarborTrials, dest: Path) -> Path:
    """A Harbor job folder of N_TRIALS real trial folders (scored 1 and 0 in turn)."""
    dest.mkdir()
    for i in range(N_TRIALS):
        harbor_trials.copy("oracle" if i % 2 == 0 else "nop", dest, f"hello-file__t{i:02d}")
    return dest


def _import(env: dict[str, str], job: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``trialbus import JOB --json [FLAGS]``, the console script, to completion."""
    return subprocess.run(
        [str(TRIALBUS), "import", str(job), "--json", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )


@pytest.fixture
def cli_env(ledger_url: str, ledger_db: str, tmp_path: Path) -> dict[str, str]:
    """The CLI's environment: the real ledger, no reachable NATS (ledger-only import)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_")}
    env.update(
        LEDGER_URL=ledger_url,
        TRIALBUS_LEDGER_DB=ledger_db,
        NATS_URL=f"nats://127.0.0.1:{free_port()}",  # nothing listens there
        TRIALBUS_STACK_FILE=str(tmp_path / "no-stack.json"),
    )
    return env


async def test_a_copied_job_folder_never_moves_the_first_experiments_records(
    harbor_trials: HarborTrials,
    cli_env: dict[str, str],
    ledger_url: str,
    ledger_db: str,
    tmp_path: Path,
) -> None:
    first = _job(harbor_trials, tmp_path / "run-a")
    imported = _import(cli_env, first)
    assert imported.returncode == 0, imported.stderr
    summary = json.loads(imported.stdout)
    assert (summary["experiment_id"], summary["inserted"]) == ("harbor-run-a", N_TRIALS)
    original = await records_in(ledger_url, ledger_db, "harbor-run-a")
    assert len(original) == N_TRIALS

    # The finding: the same trials under a second name.
    copy = tmp_path / "run-b"
    shutil.copytree(first, copy)
    refused = _import(cli_env, copy)

    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stdout == ""  # no summary claims the trials were imported
    message = " ".join(refused.stderr.split())  # rich wraps long lines
    for word in ("harbor-run-a", "harbor-run-b", "--as-new", f"{N_TRIALS} of {N_TRIALS}"):
        assert word in message, refused.stderr
    assert await records_in(ledger_url, ledger_db, "harbor-run-a") == original
    assert await records_in(ledger_url, ledger_db, "harbor-run-b") == []

    # Negative control of the refusal: the first folder again is the same experiment.
    again = _import(cli_env, first)
    assert again.returncode == 0, again.stderr
    assert (json.loads(again.stdout)["imported"], json.loads(again.stdout)["unchanged"]) == (
        0,
        N_TRIALS,
    )

    # The explicit choice: a new experiment, with trial ids of its own.
    as_new = _import(cli_env, copy, "--as-new")
    assert as_new.returncode == 0, as_new.stderr
    summary = json.loads(as_new.stdout)
    assert (summary["experiment_id"], summary["inserted"]) == ("harbor-run-b", N_TRIALS)
    copied = await records_in(ledger_url, ledger_db, "harbor-run-b")
    assert {r.trial_id for r in copied} == {
        scoped_trial_id("harbor-run-b", r.trial_id) for r in original
    }
    assert {r.trial_id for r in copied}.isdisjoint(r.trial_id for r in original)
    assert sorted(r.evaluation.main_reward or 0.0 for r in copied) == sorted(
        r.evaluation.main_reward or 0.0 for r in original
    )
    assert await records_in(ledger_url, ledger_db, "harbor-run-a") == original


def _final_failure(experiment_id: str, trial_id: str) -> TrialFailed:
    return trial_failed(
        trial_id,
        experiment_id=experiment_id,
        error_type="Forged",
        message="written by whoever can publish trial events",
    )


async def test_the_importer_refuses_a_forged_event_for_another_experiments_trial(
    importer: ServiceProcess,
    nats_url: str,
    ledger_url: str,
    ledger_db: str,
    topology: Topology,
) -> None:
    ledger = MongoLedger(ledger_url, ledger_db)
    nc = await nats.connect(nats_url)
    try:
        victim = _final_failure("victim", "victim-trial").model_copy(
            update={"error_type": "Real", "message": "the victim's own record"}
        )
        await ledger.upsert_records([build_failed_record(victim)])
        stored = await ledger.get_record("victim-trial")
        js = nc.jetstream()
        forged = _final_failure("forger", "victim-trial")
        # The control: the same publisher, a trial of its own, published after the forgery.
        control = _final_failure("forger", "forger-trial")
        for event in (forged, control):
            await js.publish(
                topology.event_subject("trial_failed", event.experiment_id), encode_event(event)
            )

        async def control_recorded() -> bool:
            return await ledger.get_record("forger-trial") is not None

        await until("the control event's record", control_recorded, importer, IMPORTER_WAIT_S)
        assert await ledger.get_record("victim-trial") == stored
        assert [r.trial_id for r in await ledger.records_for("forger")] == ["forger-trial"]
        assert [r.trial_id for r in await ledger.records_for("victim")] == ["victim-trial"]

        def refusals() -> list[str]:
            lines = importer.log_path.read_text().splitlines()
            return [line for line in lines if "belongs to another experiment" in line]

        async def refusal_logged() -> bool:
            return bool(refusals())

        # The refusal is logged just after the batch's write, which the control's record
        # shows: a read right after the record can come before the line.
        await until("the refusal in the importer's log", refusal_logged, importer, 30)
    finally:
        await ledger.close()
        await nc.close()
    refusal = refusals()
    assert "victim" in refusal[0] and "forger" in refusal[0]
