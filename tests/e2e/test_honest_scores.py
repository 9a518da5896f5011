"""Injected infrastructure failures change the denominator, never the score.

The same agent runs the same two tasks in two experiments through the whole stack
(separate processes, real Harbor trials in the local environment, the real CLI and
HTTP API). The second experiment also has a task the local environment refuses on the
runner (its image's Python is not on this host: UnsupportedEnvironmentError,
infrastructure, not retried; what the submitter can judge from the folder, such as a
compose file, is refused at submit instead). Its trials
must be counted and shown by cause, and the mean, pass rate, intervals and pass@k
must be exactly those of the first experiment. Scoring them as zeros would have
given a mean of 3/9 instead of 3/6.
"""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import pytest

from infra.stack import EmbeddedStack
from tests.e2e.cli import ROOT, Cli

pytestmark = pytest.mark.e2e

TASKS = ROOT / "examples" / "tasks"
ABSENT_PYTHON = "3.5"
"""A Python no host of the project's has (the local environment supports 3.8 on)."""
ESTIMATES = ("mean_reward", "pass_rate", "mean_reward_ci", "pass_rate_ci", "pass_at_k")


def _tasks(root: Path) -> None:
    """hello-file (the oracle passes), wrong-answer (it fails), old-python (refused)."""
    shutil.copytree(TASKS / "hello-file", root / "hello-file")
    wrong = root / "wrong-answer"
    shutil.copytree(TASKS / "hello-file", wrong)
    (wrong / "solution" / "solve.sh").write_text("#!/bin/bash\necho nope > /app/hello.txt\n")
    old = root / "old-python"
    shutil.copytree(TASKS / "hello-file", old)
    (old / "environment" / "Dockerfile").write_text(f"FROM python:{ABSENT_PYTHON}-slim\n")


def _manifest(path: Path, name: str, tasks: list[str]) -> Path:
    path.write_text(
        json.dumps(
            {
                "name": name,
                "tasks": tasks,
                "agents": [{"name": "oracle", "label": "oracle"}],
                "repetitions": 3,
                "compute": {"environment": "local", "n_concurrent_trials": 4},
                "retry": {"max_attempts": 3, "backoff_seconds": 1},
            }
        )
    )
    return path


def _submit(cli: Cli, manifest: Path, expected_exit: int, *extra: str) -> str:
    summary = cli.json("submit", str(manifest), "--wait", *extra, exit_code=expected_exit)
    assert summary["status"]["pending"] == 0
    experiment_id: str = summary["experiment_id"]
    return experiment_id


def test_infrastructure_failures_grow_the_denominator_not_the_mean(
    stack: EmbeddedStack, cli: Cli, tmp_path: Path
) -> None:
    _tasks(tmp_path / "tasks")
    clean = _manifest(tmp_path / "clean.json", "clean", ["tasks/hello-file", "tasks/wrong-answer"])
    mixed = _manifest(
        tmp_path / "mixed.json",
        "mixed",
        ["tasks/hello-file", "tasks/wrong-answer", "tasks/old-python"],
    )
    exp_clean = _submit(cli, clean, expected_exit=0)
    junit = tmp_path / "mixed.xml"
    exp_mixed = _submit(cli, mixed, 1, "--junit", str(junit))  # unscored trials: exit 1

    [c] = cli.json("leaderboard", exp_clean)
    [m] = cli.json("leaderboard", exp_mixed)
    assert (c["n_trials"], c["n_scored"], c["unscored_by_cause"]) == (6, 6, {})
    assert (m["n_trials"], m["n_scored"], m["unscored_by_cause"]) == (9, 6, {"infrastructure": 3})
    assert (c["mean_reward"], c["pass_rate"], c["too_few"]) == (0.5, 0.5, False)
    assert c["pass_at_k"] == {"1": 0.5, "2": 0.5, "3": 0.5}
    for name in ESTIMATES:
        assert m[name] == c[name], name

    # The CI's view (JUnit XML): a pass, a wrong answer (failure) and an unscored
    # trial (error, with its exception) per repetition of each task.
    suites = ET.fromstring(junit.read_bytes())
    counts = {k: suites.get(k) for k in ("tests", "failures", "errors", "skipped")}
    assert counts == {"tests": "9", "failures": "3", "errors": "3", "skipped": "0"}
    outcomes = {
        case.get("name"): [child.tag for child in case if child.tag != "properties"]
        for case in suites.iter("testcase")
    }
    assert outcomes == {
        **{f"hello-file #{r}": [] for r in range(3)},
        **{f"wrong-answer #{r}": ["failure"] for r in range(3)},
        **{f"old-python #{r}": ["error"] for r in range(3)},
    }
    assert {e.get("type") for e in suites.iter("error")} == {"UnsupportedEnvironmentError"}

    # The full report: the failure is shown with its cause, and not scored.
    html = tmp_path / "mixed.html"
    report = cli.json("report", exp_mixed, "--html", str(html))
    assert report["leaderboard"] == [m]
    [failure] = report["failures"]
    assert failure["exception_type"] == "UnsupportedEnvironmentError"
    assert (failure["failure_class"], failure["scored"], failure["count"]) == (
        "infrastructure",
        False,
        3,
    )
    refused_row = next(t for t in report["tasks"] if t["task"] == "old-python")
    assert refused_row["cells"][0]["n_scored"] == 0
    assert refused_row["cells"][0]["unscored_by_cause"] == {"infrastructure": 3}
    page = html.read_text()
    assert "UnsupportedEnvironmentError" in page and "6 / 9" in page

    # The paired comparison of the two runs: the same tasks, the same outcomes.
    cmp = cli.json("compare", exp_clean, exp_mixed)
    assert cmp["n_paired_tasks"] == 2 and cmp["tasks_only_b_scored"] == []
    assert cmp["mean_reward"]["a"] == cmp["mean_reward"]["b"] == 0.5
    assert cmp["mcnemar"] == {"only_a": 0, "only_b": 0, "p_value": 1.0}

    # The HTTP API serves the same reports (with the token `trialbus up` issued).
    token = stack.api_token_path.read_text().strip()
    api = httpx.Client(
        base_url=f"http://127.0.0.1:{stack.http_port}",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert api.get(f"/experiments/{exp_mixed}/leaderboard").json() == [m]
    assert api.get(f"/experiments/{exp_mixed}/report").json() == report
    assert api.get("/compare", params={"a": exp_clean, "b": exp_mixed}).json() == cmp
    page_http = api.get(f"/experiments/{exp_mixed}/report.html")
    assert page_http.headers["content-type"].startswith("text/html")
    assert "UnsupportedEnvironmentError" in page_http.text
