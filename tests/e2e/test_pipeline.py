"""The example experiment through all four services, as separate processes, with real
Harbor trials in the local (bubblewrap) environment, driven by the real CLI."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest

from infra.managed_process import free_port
from infra.stack import EmbeddedStack
from schemas.record import TrialRecord
from tests.e2e.cli import ROOT, Cli
from tests.e2e.faultkit import Submitted, expected_trial_ids, judge, ledger_records

pytestmark = pytest.mark.e2e

MANIFEST = ROOT / "examples" / "experiment.yaml"
BIN = Path(sys.executable).parent
# ExperimentCompleted follows the last record by the watcher's count (or its periodic
# re-check); the importer then writes the job result.json.
JOB_RESULT_DEADLINE_S = 120.0


async def _records(stack: EmbeddedStack, experiment_id: str) -> dict[str, Any]:
    return {r.trial_id: r for r in await ledger_records(stack, experiment_id)}


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths where two dumped records differ (to make a failure readable)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d for k in sorted(set(a) | set(b)) for d in _diff(a.get(k), b.get(k), f"{path}.{k}")
        ]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


# (task, agent) -> (main reward or None when unscored, failure class, rewards)
EXPECTED: dict[tuple[str, str], tuple[float | None, str, dict[str, float]]] = {
    ("hello-file", "oracle"): (1.0, "none", {"reward": 1.0}),
    ("hello-file", "nop"): (0.0, "none", {"reward": 0.0}),
    ("count-words", "oracle"): (1.0, "none", {"reward": 1.0}),
    ("count-words", "nop"): (0.0, "none", {"reward": 0.0}),
    ("multi-metric", "oracle"): (
        1.0,
        "none",
        {"reward": 1.0, "file_a": 1.0, "file_b": 1.0, "file_c": 1.0},
    ),
    ("multi-metric", "nop"): (
        0.0,
        "none",
        {"reward": 0.0, "file_a": 0.0, "file_b": 0.0, "file_c": 0.0},
    ),
    ("broken-verifier", "oracle"): (None, "verifier", {}),
    ("broken-verifier", "nop"): (None, "verifier", {}),
}


def assert_example_outcomes(records: Iterable[TrialRecord]) -> None:
    """Each record of the example experiment has its (task, agent)'s EXPECTED outcome,
    every pair ran its 3 repetitions, and the broken verifier's failure is named."""
    records = list(records)
    seen: dict[tuple[str, str], int] = {}
    for rec in records:
        key = (rec.provenance.task_name, rec.provenance.agent_name)
        reward, failure, rewards = EXPECTED[key]
        seen[key] = seen.get(key, 0) + 1
        assert rec.evaluation.main_reward == reward, rec
        assert rec.evaluation.reward_valid is (reward is not None), rec
        assert rec.evaluation.failure_class == failure, rec
        assert rec.evaluation.rewards == rewards, rec
    assert seen == {k: 3 for k in EXPECTED}
    broken = [r for r in records if r.provenance.task_name == "broken-verifier"]
    assert {r.evaluation.exception_type for r in broken} == {"RewardFileNotFoundError"}


async def test_example_experiment_end_to_end(
    stack: EmbeddedStack, cli: Cli, tmp_path: Path
) -> None:
    # 1. Submit and wait. Unscored trials (the broken verifier) make the exit code 1.
    first = cli.run("submit", str(MANIFEST), "--wait", "--json")
    assert first.returncode == 1, first.stderr
    summary = json.loads(first.stdout)
    exp = summary["experiment_id"]
    assert summary["n_trials"] == 24 and summary["n_published"] == 24
    assert summary["status"]["recorded"] == 24 and summary["status"]["scored"] == 18

    # 2. The ledger holds exactly one record per trial, with the exact outcome.
    records = await _records(stack, exp)
    assert len(records) == 24
    assert_example_outcomes(records.values())
    for rec in records.values():
        assert rec.experiment_id == exp
        assert rec.provenance.harbor_version == "0.25.0"
        trial_dir = Path(rec.artifacts.trial_dir or "")
        assert (trial_dir / "result.json").is_file()
        assert trial_dir.name == rec.trial_id  # Harbor's trial_name is trialbus's trial_id

    # 3. The leaderboard: infrastructure/verifier failures shown, never scored as zeros.
    board = cli.run("leaderboard", exp, "--json")
    assert board.returncode == 0, board.stderr
    rows = {r["agent"]: r for r in json.loads(board.stdout)}
    for agent, mean in (("oracle", 1.0), ("nop", 0.0)):
        row = rows[agent]
        assert (row["n_trials"], row["n_scored"], row["mean_reward"], row["pass_rate"]) == (
            12,
            9,
            mean,
            mean,
        )
        assert row["unscored_by_cause"] == {"verifier": 3}
    status = json.loads(cli.run("status", exp, "--json").stdout)
    assert status["total"] == 24 and status["scored"] == 18 and status["pending"] == 0

    # 4. Resubmitting re-runs only the unscored trials; no new trial appears.
    again = cli.run("submit", str(MANIFEST), "--wait", "--json")
    again_summary = json.loads(again.stdout)
    assert again_summary["experiment_id"] == exp
    assert again_summary["n_already_scored"] == 18
    assert again_summary["n_published"] == 6
    after = await _records(stack, exp)
    assert set(after) == set(records)
    for tid, rec in records.items():
        if rec.evaluation.reward_valid:
            assert after[tid] == rec  # scored results untouched

    # 5. Importing the job folder again changes nothing.
    job_dir = stack.jobs_dir / exp
    # The job-level result.json is written when the importer handles ExperimentCompleted,
    # which follows the last record (what `--wait` waits for): wait for it, generously.
    job_result = job_dir / "result.json"
    deadline = time.monotonic() + JOB_RESULT_DEADLINE_S
    while not job_result.is_file():
        assert time.monotonic() < deadline, f"no job result.json after {JOB_RESULT_DEADLINE_S} s"
        await asyncio.sleep(0.2)
    assert json.loads(job_result.read_text())["n_total_trials"] == 24
    imported = cli.run("import", str(job_dir), "--json")
    assert imported.returncode == 0, imported.stderr
    counts = json.loads(imported.stdout)
    reimported = await _records(stack, exp)
    changed = {
        tid: _diff(after[tid].model_dump(), reimported[tid].model_dump())
        for tid in after
        if after[tid] != reimported[tid]
    }
    assert changed == {}
    assert (counts["total"], counts["imported"], counts["unchanged"]) == (24, 0, 24)

    # 6. Judged from the events and the ledger: one accepted result per run, each
    # record the last run's (the resumed trials' second run included).
    submitted = Submitted(exp, expected_trial_ids(MANIFEST, exp), 24)
    check = await judge("pipeline: submit, resume, re-import", stack, submitted)
    assert check.ok, check.explain()

    # 7. Export: the job folder again, from the ledger and the results bucket only,
    # byte for byte what the importer keeps; and `harbor view` serves it.
    dest = tmp_path / "export"
    exported = cli.run("export", exp, str(dest), "--json")
    assert exported.returncode == 0, exported.stderr
    written = json.loads(exported.stdout)
    assert (written["trials"], written["written"], written["without_folder"]) == (24, 24, [])
    for tid in reimported:
        ours = (dest / exp / tid / "result.json").read_bytes()
        assert ours == (job_dir / tid / "result.json").read_bytes(), tid
    trial = next(t for t, r in reimported.items() if r.evaluation.main_reward == 1.0)
    served = harbor_view_trial(dest, exp, trial)
    assert served["verifier_result"]["rewards"]["reward"] == 1.0


def harbor_view_trial(folder: Path, job: str, trial: str) -> dict[str, Any]:
    """Start ``harbor view folder`` and fetch one trial as its web app does."""
    port = free_port()
    log = (folder.parent / "harbor-view.log").open("wb")
    view = subprocess.Popen(
        [str(BIN / "harbor"), "view", str(folder), "--port", str(port), "--jobs", "--no-build"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api/jobs/{job}/trials/{trial}"
    deadline = time.monotonic() + 60
    try:
        while True:
            assert view.poll() is None, (folder.parent / "harbor-view.log").read_text()
            try:
                answer = httpx.get(url, timeout=5)
            except httpx.TransportError:
                answer = None
            if answer is not None and answer.status_code == 200:
                data: dict[str, Any] = answer.json()
                return data
            assert time.monotonic() < deadline, f"harbor view never served {url}: {answer}"
            time.sleep(0.2)
    finally:
        os.killpg(view.pid, signal.SIGTERM)
        view.wait(10)
        log.close()


def test_bad_manifest_is_refused_naming_the_field(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(MANIFEST.read_text().replace("repetitions: 3", "repetitions: 0\nrepeats: 2"))
    proc = cli.run("submit", str(bad), "--json")
    assert proc.returncode == 2
    assert f"{bad}: repetitions: Input should be greater than or equal to 1" in proc.stderr
    assert f"{bad}: repeats: unknown field" in proc.stderr
