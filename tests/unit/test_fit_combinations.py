"""Needs split across a pool's runners are refused at submit (fit.combination_refusal).

One runner holds the agent's key, another the key the task's verifier asks for: every
per-name check passes (each name is set on some runner), but no runner can run a
trial, and each would end at once. The submitter refuses such a manifest, saying what
each runner lacks; the runners judge their peers by the same ``can_run``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schemas.events import TrialRequested
from schemas.manifest import ExperimentManifest
from schemas.runners import RunnerInfo
from services.common.fit import combination_refusal
from services.submitter.submit import prepare

AGENT_KEY, JUDGE_KEY = "ANTHROPIC_API_KEY", "OPENAI_API_KEY"


def _runner(rid: str, caps: list[str], keys: list[str] | None) -> RunnerInfo:
    return RunnerInfo(runner_id=rid, host="h", capabilities=caps, concurrency=1, secrets_set=keys)


def _trials(tmp_path: Path, **agent: Any) -> list[TrialRequested]:
    """The trials of an LLM-judged task (its verifier needs JUDGE_KEY) run by ``agent``."""
    task = tmp_path / "judged"
    (task / "tests").mkdir(parents=True, exist_ok=True)
    (task / "task.toml").write_text(f'[verifier.env]\nJUDGE = "${{{JUDGE_KEY}}}"\n')
    (task / "instruction.md").write_text("Do the thing.\n")
    (task / "tests" / "test.sh").write_text("#!/bin/sh\n")
    manifest = ExperimentManifest.model_validate(
        {"name": "m", "tasks": ["judged"], "agents": [agent], "repetitions": 3}
    )
    return prepare(manifest, tmp_path).trials


def test_needs_only_several_runners_hold_between_them_are_refused(tmp_path: Path) -> None:
    trials = _trials(tmp_path, name="claude-code", api_key_env=[AGENT_KEY])
    split = [_runner("r1", ["local"], [AGENT_KEY]), _runner("r2", ["local"], [JUDGE_KEY])]
    assert combination_refusal(trials, split) == (
        f"agent 'claude-code' on task 'judged' needs local, {AGENT_KEY}, {JUDGE_KEY} on one "
        "runner, and no live runner of pool 'default' has them all: "
        f"r1 has no {JUDGE_KEY} set (task.toml of task 'judged'); "
        f"r2 has no {AGENT_KEY} set (api_key_env of agent 'claude-code') "
        "(its trials would each end at once: give one runner of the pool everything they "
        "need, or split the experiment)"
    )
    # Control: one runner holding both is enough, beside the split ones.
    both = _runner("r3", ["local"], [AGENT_KEY, JUDGE_KEY])
    assert combination_refusal(trials, [*split, both]) is None


def test_a_capability_and_a_key_on_different_runners_are_refused(tmp_path: Path) -> None:
    trials = _trials(tmp_path, name="oracle")
    split = [_runner("r1", ["docker"], [JUDGE_KEY]), _runner("r2", ["local"], [])]
    refusal = combination_refusal(trials, split)
    assert refusal is not None
    assert f"r1 does not offer 'local'; r2 has no {JUDGE_KEY} set" in refusal


def test_what_it_cannot_know_is_not_refused(tmp_path: Path) -> None:
    trials = _trials(tmp_path, name="claude-code", api_key_env=[AGENT_KEY])
    split = [_runner("r1", ["local"], [AGENT_KEY]), _runner("r2", ["local"], [JUDGE_KEY])]
    # A runner that does not say which variables it has (older) may hold both.
    assert combination_refusal(trials, [*split, _runner("old", ["local"], None)]) is None
    # No runner in the pool: pool_refusal says so, not this.
    assert combination_refusal(trials, []) is None
