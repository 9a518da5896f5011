"""Pause, resume and retry with real processes (docs/scheduling.md).

One stack (real nats-server, ledger, importer, watcher, one runner process with the
instant executor), two experiments. ``paused`` is paused before its submission, so its
work is queued ahead of ``control``'s: while paused none of its trials starts, and the
control (its negative control) starts and finishes all of its own on the same runner.
Resumed, every paused trial starts within seconds, exactly once, at attempt 1: the
hand-backs cost no attempt and lost nothing (tests/e2e/ledger_check.py judges both
experiments). Then one scored trial of the control is retried: one new run, one new
record version, the other records untouched.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from schemas.events import Event, ResultImported, TrialStarted
from services.runner.admission import PAUSE_WAIT_S
from services.submitter.manifest_io import load_manifest
from services.submitter.submit import experiment_id_of
from tests.e2e.conftest import Stacks
from tests.e2e.events import starts_of
from tests.e2e.faultkit import instant_runner_env, judge, ledger_records, submit, write_manifest

pytestmark = pytest.mark.e2e

N_PAUSED, N_CONTROL = 4, 8
TRIAL_S = 1.0
RESUME_START_S = 15.0
"""Resumed, the first trial must start within this (hand-back delays are 2-5 s, the
flag is cached for 1 s): generous for a loaded machine, far below a lost message's
redelivery (it would not come at all)."""


async def test_pause_holds_queued_work_resume_runs_it_once_and_retry_reruns_one_trial(
    stacks: Stacks, tmp_path: Path
) -> None:
    stack, tap, cli = await stacks.started(concurrency=4, runner_env=instant_runner_env(TRIAL_S))
    paused_m = write_manifest(tmp_path, N_PAUSED, name="paused", concurrency=2)
    control_m = write_manifest(tmp_path, N_CONTROL, name="control", concurrency=2)
    paused_id = experiment_id_of(load_manifest(paused_m))

    flagged = await cli.ajson("pause", paused_id, "--json")
    assert flagged == {
        "experiment_id": paused_id,
        "paused": True,
        "known": False,
        "unfinished": None,
    }
    paused = await submit(cli, paused_m)  # queued first: the runner sees it first
    queued_at = time.monotonic()
    assert paused.experiment_id == paused_id
    control = await submit(cli, control_m)

    # The control runs to the end on the same runner while the paused work waits.
    await tap.all_imported(control.experiment_id, set(control.trial_ids), 60)
    window = time.monotonic() - queued_at
    # Long enough for every paused message to have been handed back and delivered
    # again (the control's 4 rounds of 1 s trials make it so): not a vacuous window.
    assert window > PAUSE_WAIT_S[1], f"paused only {window:.1f} s"
    assert len(starts_of(tap.events, experiment_id=control.experiment_id)) == N_CONTROL
    assert starts_of(tap.events, experiment_id=paused_id) == [], (
        "a paused experiment's trial started"
    )
    rows = {r["experiment_id"]: r for r in await cli.ajson("experiments", "--json")}
    assert rows[paused_id]["state"] == "paused", rows[paused_id]
    assert rows[control.experiment_id]["state"] == "complete"

    t0 = time.monotonic()
    resumed = await cli.ajson("resume", paused_id, "--json")
    assert resumed["was_paused"] is True

    def first_start(events: Sequence[Event]) -> bool:
        return bool(starts_of(events, experiment_id=paused_id))

    await tap.eventually(first_start, "a start of the resumed experiment", RESUME_START_S)
    first_s = time.monotonic() - t0
    await tap.all_imported(paused_id, set(paused.trial_ids), 60)
    starts = starts_of(tap.events, experiment_id=paused_id)
    assert sorted(s.trial_id for s in starts) == sorted(paused.trial_ids)  # each once
    assert {s.attempt for s in starts} == {1}  # the hand-backs counted no attempt
    for name, sub in (("pause: paused", paused), ("pause: control", control)):
        check = await judge(name, stack, sub)
        assert check.ok, check.explain()
        assert check.reruns == 0

    # Retry one scored trial of the control: a new run, one new record version.
    before = {r.trial_id: r for r in await ledger_records(stack, control.experiment_id)}
    trial = sorted(control.trial_ids)[0]
    assert before[trial].scored
    mark = tap.mark()
    answer = await cli.ajson("retry", control.experiment_id, trial, "--json")
    assert answer["run_id"].startswith(f"{trial}:retry:") and answer["previous_scored"]

    def reimported(events: Sequence[Event]) -> list[ResultImported]:
        return [e for e in events if isinstance(e, ResultImported) and e.trial_id == trial]

    await tap.eventually(lambda _: reimported(tap.since(mark)), "the retry's import", 30)
    new_starts = [e for e in tap.since(mark) if isinstance(e, TrialStarted)]
    assert [(s.trial_id, s.run_id, s.attempt) for s in new_starts] == [(trial, answer["run_id"], 1)]
    (imported,) = reimported(tap.since(mark))
    assert imported.changed
    after = {r.trial_id: r for r in await ledger_records(stack, control.experiment_id)}
    assert after[trial] != before[trial]
    assert after[trial].timing.finished_at > before[trial].timing.finished_at
    assert {k: v for k, v in after.items() if k != trial} == {
        k: v for k, v in before.items() if k != trial
    }
    # Every unscored trial at once: the control has none, so nothing is queued.
    every = await cli.ajson("retry", control.experiment_id, "--unscored", "--json")
    assert (every["n_unscored"], every["retried"]) == (0, [])
    print(
        f"pause: window_s={window:.1f} paused_starts=0 resume_first_start_s={first_s:.1f} "
        f"retry_run={answer['run_id']}"
    )
