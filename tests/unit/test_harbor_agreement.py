"""trialbus's figures equal Harbor's own job result.json, on real Harbor trials.

Real trials run through Harbor in the local environment into a Harbor job folder;
``write_job_result`` writes Harbor's job-level result.json with Harbor's own JobStats,
Mean metric and pass@k code; the folder is imported into an InMemoryLedger and the
leaderboard computed from the records must give the same mean and pass@k.

Where they must differ, the test says how: Harbor counts a trial without a reward as
0 in its mean (and as a failed attempt in pass@k); trialbus leaves it out.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from services.common.adapters.memory import InMemoryLedger
from services.common.harbor_jobs import write_job_result
from services.importer.jobdir import import_job_dir
from services.reports.leaderboard import LeaderboardRow, leaderboard
from tests.harbor_fixtures import EXAMPLE_TASKS, harbor_trial, run_trials

if TYPE_CHECKING:
    from harbor.models.trial.config import TrialConfig

REPETITIONS = 4


def _coin_tasks(root: Path) -> tuple[Path, Path]:
    """Two folders of one task named "coin": the oracle passes one and fails the other.

    Harbor (and trialbus) group attempts by task name, so mixing attempts from both
    gives a task with a chosen number of passes: pass@k then varies with k.
    """
    passing = root / "pass" / "coin"
    failing = root / "fail" / "coin"
    shutil.copytree(EXAMPLE_TASKS / "hello-file", passing)
    shutil.copytree(EXAMPLE_TASKS / "hello-file", failing)
    solve = failing / "solution" / "solve.sh"
    solve.write_text("#!/bin/bash\necho 'Goodbye' > /app/hello.txt\n")
    solve.chmod(0o755)
    return passing, failing


def _specs(root: Path) -> list[TrialConfig]:
    passing, failing = _coin_tasks(root / "tasks")
    hello = EXAMPLE_TASKS / "hello-file"
    specs = [harbor_trial(f"hello__oracle__{i}", hello, "oracle") for i in range(REPETITIONS)]
    specs += [harbor_trial(f"hello__nop__{i}", hello, "nop") for i in range(REPETITIONS)]
    # coin: 1 pass in 4 attempts; count-words: all pass.
    specs += [harbor_trial("coin__oracle__0", passing, "oracle")]
    specs += [harbor_trial(f"coin__oracle__{i}", failing, "oracle") for i in range(1, REPETITIONS)]
    specs += [
        harbor_trial(f"count__{agent}__{i}", EXAMPLE_TASKS / "count-words", agent)
        for agent in ("oracle", "nop")
        for i in range(REPETITIONS)
    ]
    return specs


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two Harbor job folders: "clean" (every trial scored) and "mixed" (the same trials
    plus two whose verifier writes no reward)."""
    root = tmp_path_factory.mktemp("agreement")
    clean = root / "clean-job"
    clean.mkdir()
    asyncio.run(run_trials(clean, _specs(root)))
    mixed = root / "mixed-job"
    shutil.copytree(clean, mixed)
    broken = EXAMPLE_TASKS / "broken-verifier"
    asyncio.run(
        run_trials(
            mixed, [harbor_trial(f"broken__oracle__{i}", broken, "oracle") for i in range(2)]
        )
    )
    return {"clean": clean, "mixed": mixed}


def _both(job: Path) -> tuple[dict[str, Any], dict[str, LeaderboardRow]]:
    """(Harbor's evals from its job result.json, trialbus's rows by agent)."""
    n_trials = sum(1 for p in job.iterdir() if (p / "result.json").is_file())
    harbor = write_job_result(job, "agreement", n_trials)["stats"]["evals"]

    async def records() -> list[Any]:
        ledger = InMemoryLedger()
        summary = await import_job_dir(job, ledger)
        return await ledger.records_for(summary.experiment_id)

    rows = {r.agent: r for r in leaderboard(asyncio.run(records()))}
    return harbor, rows


def test_mean_and_pass_at_k_equal_harbors_when_every_trial_is_scored(
    jobs: dict[str, Path],
) -> None:
    harbor, rows = _both(jobs["clean"])
    assert set(harbor) == {"oracle__adhoc", "nop__adhoc"}
    for agent in ("oracle", "nop"):
        theirs, ours = harbor[f"{agent}__adhoc"], rows[agent]
        assert ours.n_scored == ours.n_trials == theirs["n_trials"]
        assert ours.mean_reward == pytest.approx(theirs["metrics"][0]["mean"], abs=1e-12)
        # Harbor reports k = 2, 4, 5, 10, ...; trialbus every k from 1.
        assert theirs["pass_at_k"], "Harbor computed no pass@k"
        for k, value in theirs["pass_at_k"].items():
            assert ours.pass_at_k[int(k)] == pytest.approx(value, abs=1e-12), (agent, k)
    oracle = rows["oracle"]
    # 3 tasks: hello 4/4, count-words 4/4, coin 1/4.
    assert oracle.mean_reward == pytest.approx(9 / 12)
    assert oracle.pass_at_k[1] == pytest.approx((1 + 1 + 1 / 4) / 3)
    assert oracle.pass_at_k[2] == pytest.approx((1 + 1 + 1 / 2) / 3)  # coin: 1 - C(3,2)/C(4,2)
    assert oracle.pass_at_k[4] == pytest.approx(1.0)
    assert rows["nop"].pass_at_k == {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0}


def test_unscored_trials_are_where_harbor_and_trialbus_differ_on_purpose(
    jobs: dict[str, Path],
) -> None:
    harbor, rows = _both(jobs["mixed"])
    theirs, ours = harbor["oracle__adhoc"], rows["oracle"]
    # The two broken-verifier trials are unscored: the denominator grows, the mean
    # and pass@k stay those of the clean job.
    _, clean_rows = _both(jobs["clean"])
    assert (ours.n_trials, ours.n_scored) == (14, 12)
    assert ours.unscored_by_cause == {"verifier": 2}
    assert ours.mean_reward == clean_rows["oracle"].mean_reward
    assert ours.pass_at_k == clean_rows["oracle"].pass_at_k
    # Harbor's Mean counts a trial without a reward as 0: its mean is ours scaled by
    # scored / total. Its pass@k adds the broken task as a never-passed task, and k
    # stops at that task's 2 attempts.
    assert ours.mean_reward is not None
    assert theirs["metrics"][0]["mean"] == pytest.approx(ours.mean_reward * 12 / 14)
    assert theirs["exception_stats"] == {
        "RewardFileNotFoundError": ["broken__oracle__0", "broken__oracle__1"]
    }
    assert theirs["pass_at_k"] == {"2": pytest.approx((1 + 1 + 1 / 2 + 0) / 4)}
