"""A provider that refuses an agent's key stops that agent's trials, once, through the stack.

Real stack, real Harbor, terminus-2 against the model stub (tests/support/model_stub.py),
whose model ``unauthorized`` answers HTTP 401 ``invalid_api_key``. One runner slot, so
the trials run one after the other: three trials of the refused agent give ONE real
failure (AuthenticationError, as Harbor records it) and two AgentStopped trials that
never started, each naming that failure and the fix; the oracle's three trials in the
same experiment run and score as usual. A resubmission lifts the stop: the agent is
tried again (one more real failure), rather than every trial staying stopped.

A token budget the first trial of a solving model uses up stops the trials after it
(BudgetExceeded), read from Harbor's own result.json, and ``trialbus status`` says so.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.stack import EmbeddedStack
from schemas.events import TrialFailed
from tests.conftest import skip_unless
from tests.e2e.cli import Cli
from tests.e2e.conftest import Stacks
from tests.e2e.events import EventTap
from tests.e2e.faultkit import ledger_records
from tests.e2e.test_llm_agents import API_KEY_ENV, HELLO_FILE, runner_env, submit_wait, terminus
from tests.support.manifests import manifest_file
from tests.support.model_stub import ModelStub

pytestmark = pytest.mark.e2e

REPETITIONS = 3
"""Per agent: one real failure and more than one stopped trial after it (each trial
of the oracle, the control, is a real Harbor trial run one at a time: kept few)."""
STOPPED = REPETITIONS - 1


@pytest.fixture
def stub() -> Iterator[ModelStub]:
    skip_unless(None if shutil.which("tmux") else "tmux is not installed (terminus-2 needs it)")
    with ModelStub() as s:
        yield s


def manifest(folder: Path, stub: ModelStub) -> Path:
    return manifest_file(
        folder,
        "refused-key",
        tasks=[HELLO_FILE],
        agents=[terminus(stub, "unauthorized"), {"name": "oracle"}],
        repetitions=REPETITIONS,
        concurrency=1,
        retry={"max_attempts": 2, "backoff_seconds": 0.5},
    )


def by_agent(records: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for r in records:
        out.setdefault(r.provenance.agent_label, []).append(r)
    return out


async def test_refused_keys_and_spent_budgets_end_trials_before_they_start(
    stacks: Stacks, stub: ModelStub, tmp_path: Path
) -> None:
    # One stack for both (a stack's start is most of the time on a busy machine).
    stack, tap, cli = await stacks.started(concurrency=1, runner_env=runner_env(tmp_path))
    await a_refused_key_stops_the_agent_once(stack, tap, cli, stub, tmp_path)
    await a_token_budget_stops_trials_not_yet_started(stack, cli, stub, tmp_path)


async def a_refused_key_stops_the_agent_once(
    stack: EmbeddedStack, tap: EventTap, cli: Cli, stub: ModelStub, tmp_path: Path
) -> None:
    path = manifest(tmp_path, stub)
    exp = await submit_wait(cli, path)

    records = by_agent(await ledger_records(stack, exp))
    refused, oracle = records["unauthorized"], records["oracle"]
    assert len(refused) == len(oracle) == REPETITIONS
    errors = sorted(r.evaluation.exception_type for r in refused)
    assert errors == ["AgentStopped"] * STOPPED + ["AuthenticationError"], errors
    assert not any(r.evaluation.reward_valid for r in refused)
    assert {r.evaluation.failure_class for r in refused} == {"infrastructure"}
    [real] = [r for r in refused if r.evaluation.exception_type == "AuthenticationError"]
    # The stopped trials never reached the model: only the real failure's requests did.
    first_requests = stub.count("unauthorized", 401)
    assert first_requests > 0
    stopped = [
        e for e in tap.events if isinstance(e, TrialFailed) and e.error_type == "AgentStopped"
    ]
    assert len(stopped) == STOPPED
    for event in stopped:
        assert real.trial_id in event.message and "AuthenticationError" in event.message
        assert f"set {API_KEY_ENV} on the runners" in event.message, event.message
    # Negative control: the other agent of the same experiment ran and scored every trial.
    assert all(r.evaluation.reward_valid and r.evaluation.main_reward == 1.0 for r in oracle)

    # A resubmission lifts the stop: the refused agent is tried again (and stopped again).
    await submit_wait(cli, path)
    again = by_agent(await ledger_records(stack, exp))["unauthorized"]
    errors = sorted(r.evaluation.exception_type for r in again)
    assert errors == ["AgentStopped"] * STOPPED + ["AuthenticationError"], errors
    assert stub.count("unauthorized", 401) > first_requests


async def a_token_budget_stops_trials_not_yet_started(
    stack: EmbeddedStack, cli: Cli, stub: ModelStub, tmp_path: Path
) -> None:
    # A solving model, one trial at a time, and a budget the first trial uses up
    # (terminus-2 uses ~1,750 tokens on hello-file here): the runner reads the tokens from
    # Harbor's own result.json, and the trials after it do not start.
    path = manifest_file(
        tmp_path,
        "budgeted",
        tasks=[HELLO_FILE],
        agents=[terminus(stub, "solve")],
        repetitions=3,
        concurrency=1,
        budget={"max_tokens": 1000, "max_cost_usd": 5.0},
    )
    exp = await submit_wait(cli, path)
    records = await ledger_records(stack, exp)
    errors = sorted(str(r.evaluation.exception_type) for r in records)
    # Negative control: the first trial ran (and solved) before the budget was reached.
    assert errors == ["BudgetExceeded", "BudgetExceeded", "None"], errors
    [ran] = [r for r in records if r.evaluation.exception_type is None]
    assert ran.evaluation.main_reward == 1.0 and ran.usage.n_input_tokens
    assert not any(r.evaluation.reward_valid for r in records if r is not ran)
    # status says what was spent of which budget, and that an unpriced trial's cost
    # is unknown (the stub's model has no price).
    code, out, err = await cli.arun("status", exp, "--json")
    assert code == 0, err.decode()
    line = json.loads(out)["budget"]
    assert "of 1000 tokens" in line and "reached" in line, line
    assert "cost unknown of $5 USD (1 of 1 trials that used tokens have no price)" in line
