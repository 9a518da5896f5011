"""A provider that refuses an agent's key stops that agent's trials, once, through the stack.

Real stack, real Harbor, terminus-2 against the model stub (tests/support/model_stub.py),
whose model ``unauthorized`` answers HTTP 401 ``invalid_api_key``. One runner slot, so
the trials run one after the other: six trials of the refused agent give ONE real
failure (AuthenticationError, as Harbor records it) and five AgentStopped trials that
never started, each naming that failure and the fix; the oracle's six trials in the
same experiment run and score as usual. A resubmission lifts the stop: the agent is
tried again (one more real failure), rather than every trial staying stopped.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from schemas.events import TrialFailed
from tests.conftest import skip_unless
from tests.e2e.conftest import Stacks
from tests.e2e.faultkit import ledger_records
from tests.e2e.test_llm_agents import API_KEY_ENV, HELLO_FILE, runner_env, submit_wait, terminus
from tests.support.model_stub import ModelStub

pytestmark = pytest.mark.e2e

REPETITIONS = 6


@pytest.fixture
def stub() -> Iterator[ModelStub]:
    skip_unless(None if shutil.which("tmux") else "tmux is not installed (terminus-2 needs it)")
    with ModelStub() as s:
        yield s


def manifest(folder: Path, stub: ModelStub) -> Path:
    data = {
        "name": "refused-key",
        "tasks": [str(HELLO_FILE)],
        "agents": [terminus(stub, "unauthorized"), {"name": "oracle"}],
        "repetitions": REPETITIONS,
        "compute": {"environment": "local", "n_concurrent_trials": 1},
        "retry": {"max_attempts": 2, "backoff_seconds": 0.5},
    }
    path = folder / "refused-key.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def by_agent(records: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for r in records:
        out.setdefault(r.provenance.agent_label, []).append(r)
    return out


async def test_a_refused_key_stops_the_agent_once(
    stacks: Stacks, stub: ModelStub, tmp_path: Path
) -> None:
    stack = await stacks.start(concurrency=1, runner_env=runner_env(tmp_path))
    tap = await stacks.tap(stack)
    cli = stacks.cli(stack)
    path = manifest(tmp_path, stub)
    exp = await submit_wait(cli, path)

    records = by_agent(await ledger_records(stack, exp))
    refused, oracle = records["unauthorized"], records["oracle"]
    assert len(refused) == len(oracle) == REPETITIONS
    errors = sorted(r.evaluation.exception_type for r in refused)
    assert errors == ["AgentStopped"] * 5 + ["AuthenticationError"], errors
    assert not any(r.evaluation.reward_valid for r in refused)
    assert {r.evaluation.failure_class for r in refused} == {"infrastructure"}
    [real] = [r for r in refused if r.evaluation.exception_type == "AuthenticationError"]
    # The stopped trials never reached the model: only the real failure's requests did.
    first_requests = stub.count("unauthorized", 401)
    assert first_requests > 0
    stopped = [
        e for e in tap.events if isinstance(e, TrialFailed) and e.error_type == "AgentStopped"
    ]
    assert len(stopped) == 5
    for event in stopped:
        assert real.trial_id in event.message and "AuthenticationError" in event.message
        assert f"set {API_KEY_ENV} on the runners" in event.message, event.message
    # Negative control: the other agent of the same experiment ran and scored every trial.
    assert all(r.evaluation.reward_valid and r.evaluation.main_reward == 1.0 for r in oracle)

    # A resubmission lifts the stop: the refused agent is tried again (and stopped again).
    await submit_wait(cli, path)
    again = by_agent(await ledger_records(stack, exp))["unauthorized"]
    errors = sorted(r.evaluation.exception_type for r in again)
    assert errors == ["AgentStopped"] * 5 + ["AuthenticationError"], errors
    assert stub.count("unauthorized", 401) > first_requests
