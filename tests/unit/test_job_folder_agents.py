"""The job folder trialbus writes names every agent where ``harbor view`` looks.

``harbor view`` lists a job's agents from its config.json (Harbor's JobScanner, read
here as the viewer reads it); a config without ``agents`` reads as Harbor's default,
``[oracle]``, whatever ran. ``write_job_result`` must fix that from the trials.
"""

from __future__ import annotations

import json
from pathlib import Path

from harbor.models.trial.config import AgentConfig, TaskConfig, TrialConfig
from harbor.models.trial.result import AgentInfo, LocalTaskId, TrialResult, VerifierResult
from harbor.viewer.scanner import JobScanner

from services.common.harbor_jobs import ensure_job_dir, write_job_result

EXPERIMENT = "exp-agents"
# What the runner writes (services/runner/trial_process.job_config): no agents.
RUNNER_CONFIG = {"job_name": EXPERIMENT, "jobs_dir": "/jobs", "n_concurrent_trials": 2}


def _trial(job_dir: Path, name: str, agent: str, model: str | None = None) -> None:
    folder = job_dir / name
    folder.mkdir()
    result = TrialResult(
        task_name="hello-file",
        trial_name=name,
        trial_uri=folder.as_uri(),
        task_id=LocalTaskId(path=Path("/tasks/hello-file")),
        task_checksum="c0ffee",
        config=TrialConfig(
            task=TaskConfig(path=Path("/tasks/hello-file")),
            agent=AgentConfig(name=agent, model_name=model, kwargs={"api_key": "not-copied"}),
            trial_name=name,
        ),
        agent_info=AgentInfo(name=agent, version="1"),
        verifier_result=VerifierResult(rewards={"reward": 1.0 if agent == "oracle" else 0.0}),
    )
    (folder / "result.json").write_text(result.model_dump_json())


def _job(tmp_path: Path, config: dict[str, object]) -> Path:
    job_dir = tmp_path / EXPERIMENT
    ensure_job_dir(job_dir, experiment_id=EXPERIMENT, name=EXPERIMENT, job_config=config)
    for i in range(2):
        _trial(job_dir, f"t-oracle-{i}", "oracle")
        _trial(job_dir, f"t-nop-{i}", "nop")
    return job_dir


def _viewer_agents(job_dir: Path) -> list[str]:
    """The agents ``harbor view`` lists for the job (its server's own expression)."""
    config = JobScanner(job_dir.parent).get_job_config(job_dir.name)
    assert config is not None, "harbor view cannot read the job's config.json"
    return sorted({a.name for a in config.agents if a.name is not None})


def test_every_agent_of_an_oracle_and_nop_job_is_listed(tmp_path: Path) -> None:
    job_dir = _job(tmp_path, RUNNER_CONFIG)
    # Control: before the job result is written, the viewer shows Harbor's default.
    assert _viewer_agents(job_dir) == ["oracle"]

    result = write_job_result(job_dir, EXPERIMENT, 4)

    assert _viewer_agents(job_dir) == ["nop", "oracle"]
    assert set(result["stats"]["evals"]) == {"oracle__adhoc", "nop__adhoc"}
    config = json.loads((job_dir / "config.json").read_text())
    assert config["agents"] == [
        {"name": "nop", "import_path": None, "model_name": None},
        {"name": "oracle", "import_path": None, "model_name": None},
    ]
    assert config["n_concurrent_trials"] == 2  # the rest of the config is kept
    assert "not-copied" not in (job_dir / "config.json").read_text()


def test_agents_a_config_already_lists_are_kept_and_missing_ones_added(
    tmp_path: Path,
) -> None:
    listed = {"name": "oracle", "import_path": None, "model_name": None, "n_concurrent": 1}
    job_dir = _job(tmp_path, {**RUNNER_CONFIG, "agents": [listed]})
    write_job_result(job_dir, EXPERIMENT, 4)
    config = json.loads((job_dir / "config.json").read_text())
    assert config["agents"] == [listed, {"name": "nop", "import_path": None, "model_name": None}]
    # Idempotent: a second completion adds nothing.
    write_job_result(job_dir, EXPERIMENT, 4)
    assert json.loads((job_dir / "config.json").read_text())["agents"] == config["agents"]


def test_same_agent_with_two_models_is_listed_twice(tmp_path: Path) -> None:
    job_dir = tmp_path / EXPERIMENT
    ensure_job_dir(job_dir, experiment_id=EXPERIMENT, name=EXPERIMENT, job_config=RUNNER_CONFIG)
    _trial(job_dir, "a", "terminus-2", "openai/a")
    _trial(job_dir, "b", "terminus-2", "openai/b")
    write_job_result(job_dir, EXPERIMENT, 2)
    agents = json.loads((job_dir / "config.json").read_text())["agents"]
    assert [a["model_name"] for a in agents] == ["openai/a", "openai/b"]
