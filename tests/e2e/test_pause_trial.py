"""Pause ONE trial with real processes (docs/scheduling.md), and the queue saying so.

One stack (real nats-server, ledger, importer, watcher, one runner process with the
instant executor), one experiment of 6 trials. One trial is paused by id before the
submission: its 5 siblings (the negative control, same experiment, same runner) start
and finish while it gets no TrialStarted, and ``trialbus queue`` names it as the
reason its experiment waits. Resumed with ``--trial``, it starts within seconds at
attempt 1 (the hand-backs counted nothing), the ledger check finds every trial once
and no rerun, and the queue is empty.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from services.runner.admission import PAUSE_WAIT_S
from services.submitter.manifest_io import load_manifest
from services.submitter.submit import experiment_id_of
from tests.e2e.conftest import Stacks
from tests.e2e.events import starts_of
from tests.e2e.faultkit import (
    expected_trial_ids,
    instant_runner_env,
    judge,
    submit,
    write_manifest,
)

pytestmark = pytest.mark.e2e

N_TRIALS = 6
TRIAL_S = 2.0
"""The 5 siblings run one at a time (the manifest's n_concurrent_trials 1) for 2 s each:
about 10 s, twice the longest hand-back delay, so the paused trial was delivered and
handed back meanwhile (measured with 3 rounds of 2: 5.5 s, too close to the 5 s)."""
RESUME_START_S = 30.0
"""Resumed, the trial must start within this: the `resume` CLI's start-up (3-5 s under
load), the hand-back delay still running (at most 5 s) and the runners' 1 s flag cache;
measured 6.4-13.3 s on the loaded 2-core machine. A lost message would never start."""


async def test_one_paused_trial_waits_while_its_siblings_run(
    stacks: Stacks, tmp_path: Path
) -> None:
    stack, tap, cli = await stacks.started(concurrency=2, runner_env=instant_runner_env(TRIAL_S))
    manifest = write_manifest(tmp_path, N_TRIALS, name="one-held", concurrency=1)
    exp = experiment_id_of(load_manifest(manifest))
    held = sorted(expected_trial_ids(manifest, exp))[0]

    flagged = await cli.ajson("pause", exp, "--trial", held)
    assert (flagged["trial_id"], flagged["paused"], flagged["known"]) == (held, True, False)
    sub = await submit(cli, manifest)
    queued_at = time.monotonic()
    siblings = set(sub.trial_ids) - {held}
    await tap.all_imported(exp, siblings, 90)
    window = time.monotonic() - queued_at
    assert window > PAUSE_WAIT_S[1], f"the siblings ran only {window:.1f} s"
    assert starts_of(tap.events, trial_id=held) == [], "the paused trial started"
    assert all(starts_of(tap.events, trial_id=t) for t in siblings)

    waits = await cli.ajson("queue")
    (row,) = [e for e in waits["experiments"] if e["experiment_id"] == exp]
    assert (row["queued"], row["paused_trials"], row["reason"]) == (1, 1, "paused"), row

    t0 = time.monotonic()
    resumed = await cli.ajson("resume", exp, "--trial", held)
    assert resumed["was_paused"] is True
    await tap.eventually(
        lambda events: bool(starts_of(events, trial_id=held)),
        "the resumed trial's start",
        RESUME_START_S,
    )
    first_s = time.monotonic() - t0
    await tap.all_imported(exp, set(sub.trial_ids), 60)
    assert [s.attempt for s in starts_of(tap.events, trial_id=held)] == [1]
    check = await judge("pause one trial", stack, sub)
    assert check.ok, check.explain()
    assert check.reruns == 0
    # Negative control of the queue: nothing of the experiment waits any more.
    after = await cli.ajson("queue")
    assert [e for e in after["experiments"] if e["experiment_id"] == exp] == []
    print(f"pause-trial: window_s={window:.1f} resume_first_start_s={first_s:.1f}")
