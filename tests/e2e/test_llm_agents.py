"""A real Harbor LLM agent (terminus-2, through litellm) through the whole stack, offline.

The model is tests/support/model_stub.py on a loopback port; everything else is real:
the embedded stack's processes, ``trialbus submit --wait``, Harbor's Trial API in the
runner, the local (bubblewrap) environment with tmux, the verifier, the importer and
the ledger. The tests check what a user evaluating LLM agents depends on:

- a solving model is scored 1.0 with its tokens and its cost recorded;
- prices stay with their experiment: two experiments with different prices for the
  same model name, and one without prices, on ONE long-lived runner, each record their
  own cost (or none). This failed before trials were isolated (litellm's process-wide
  price table kept the first experiment's registration);
- each provider failure class ends the way docs/scoring.md's provider table says.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.stack import EmbeddedStack
from schemas.events import TrialFailed
from tests.conftest import skip_unless
from tests.e2e.cli import ROOT, Cli
from tests.e2e.conftest import Stacks
from tests.e2e.faultkit import ledger_records
from tests.support.manifests import manifest_file
from tests.support.model_stub import ModelStub
from tests.support.runner_policy import policy_env

pytestmark = pytest.mark.e2e

HELLO_FILE = ROOT / "examples" / "tasks" / "hello-file"
# terminus-2 reads its key from OPENAI_API_KEY. Not a secret here: the stub accepts any
# bearer token. Given to the runner only, through the manifest's api_key_env, as a
# real key would be.
API_KEY_ENV = "OPENAI_API_KEY"
RUNNER_ENV = {API_KEY_ENV: "stub-key-not-secret"}


def runner_env(tmp_path: Path) -> dict[str, str]:
    """The key, and a runner policy letting agents send it to the stub (loopback)."""
    return {**RUNNER_ENV, **policy_env(tmp_path / "policy", endpoint_hosts=["127.0.0.1"])}


PRICES_A = {"input_cost_per_token": 2e-6, "output_cost_per_token": 8e-6}
PRICES_B = {"input_cost_per_token": 5e-7, "output_cost_per_token": 1e-6}


@pytest.fixture(autouse=True)
def _needs_tmux() -> None:
    # terminus-2 drives the task's terminal through tmux, which the local environment
    # takes from the host.
    skip_unless(None if shutil.which("tmux") else "tmux is not installed (terminus-2 needs it)")


@pytest.fixture
def stub() -> Iterator[ModelStub]:
    """The model stub; ``slow`` answers after 120 s (an agent timeout comes first).

    Its 429s and 500s ask the OpenAI SDK to wait 50 ms (``retry-after-ms``): the SDK
    still makes its 3 tries per call, but the 18 waits of one failing attempt cost
    about a second instead of 15-20 s. Harbor's own waits (``LiteLLM.call``'s tenacity
    backoff, at least 4 s, 6 per attempt) have no setting in Harbor 0.25 and stay.
    """
    with ModelStub(slow_s=120.0, retry_after_s=0.05, server_retry_after_s=0.05) as s:
        yield s


def terminus(stub: ModelStub, model: str, **kwargs: Any) -> Any:
    """A manifest agent entry: terminus-2 on the stub's ``model``."""
    return {
        "name": "terminus-2",
        "model": f"openai/{model}",
        "label": model,
        "api_key_env": [API_KEY_ENV],
        "kwargs": {
            "api_base": stub.base_url,
            "record_terminal_session": False,
            "max_turns": 4,
            **kwargs,
        },
    }


def write_manifest(
    folder: Path,
    name: str,
    agents: list[Any],
    *,
    tasks: list[Path] | None = None,
    max_attempts: int = 1,
) -> Path:
    """A manifest of ``agents`` x hello-file (or ``tasks``), one repetition each."""
    return manifest_file(
        folder,
        name,
        tasks=tasks or [HELLO_FILE],
        agents=agents,
        repetitions=1,
        concurrency=6,
        retry={"max_attempts": max_attempts, "backoff_seconds": 0.5},
    )


async def submit_wait(cli: Cli, manifest: Path, limit_s: float = 420) -> str:
    """``trialbus submit --wait --json`` once; exit 0 (all scored) or 1 (some unscored).

    Once: submitting the same manifest again would re-run its unscored trials.
    """
    returncode, stdout, stderr = await cli.arun(
        "submit", str(manifest), "--wait", "--json", limit_s=limit_s
    )
    assert returncode in (0, 1), stderr.decode()[-3000:]
    return str(json.loads(stdout)["experiment_id"])


def expected_cost(record: Any, prices: dict[str, float]) -> float:
    """What litellm should charge for the tokens the record says were used."""
    usage = record.usage
    return float(
        usage.n_input_tokens * prices["input_cost_per_token"]
        + usage.n_output_tokens * prices["output_cost_per_token"]
    )


async def only_record(stack: EmbeddedStack, experiment_id: str) -> Any:
    records = await ledger_records(stack, experiment_id)
    assert len(records) == 1, records
    return records[0]


async def test_prices_stay_with_their_experiment(
    stacks: Stacks, stub: ModelStub, tmp_path: Path
) -> None:
    # One runner, one slot: the three experiments run one after the other in the same
    # long-lived runner process, as they would on a shared machine.
    stack = await stacks.start(concurrency=1, runner_env=runner_env(tmp_path))
    cli = stacks.cli(stack)
    runs = [
        ("priced-a", {"model_info": {"max_input_tokens": 100000, **PRICES_A}}, PRICES_A),
        ("priced-b", {"model_info": {"max_input_tokens": 100000, **PRICES_B}}, PRICES_B),
        ("unpriced", {}, None),
    ]
    seen: dict[str, Any] = {}
    for name, kwargs, _prices in runs:
        manifest = write_manifest(tmp_path, name, [terminus(stub, "solve", **kwargs)])
        seen[name] = await only_record(stack, await submit_wait(cli, manifest))

    for name, _kwargs, prices in runs:
        record = seen[name]
        print(name, record.evaluation.main_reward, record.usage)
        # Solved, scored, and the tokens the stub reported are on the record.
        assert record.evaluation.main_reward == 1.0, (name, record.evaluation)
        assert record.evaluation.reward_valid and record.evaluation.failure_class == "none"
        assert record.usage.n_input_tokens and record.usage.n_output_tokens, record.usage
        if prices is None:
            assert record.usage.cost_usd is None, f"{name} recorded another's price"
        else:
            assert record.usage.cost_usd == pytest.approx(expected_cost(record, prices))
    # Negative control: the two prices differ, so a leaked price would be visible.
    a = seen["priced-a"]
    assert a.usage.cost_usd != pytest.approx(expected_cost(a, PRICES_B))
    assert stub.count("solve", 200) >= 6  # terminus-2 asks twice per solved trial


def hello_file_with_agent_timeout(folder: Path, agent_timeout_s: float) -> Path:
    """hello-file with another agent timeout (the other phases keep theirs)."""
    task = folder / f"hello-file-{agent_timeout_s:.0f}s"
    shutil.copytree(HELLO_FILE, task)
    toml = (task / "task.toml").read_text()
    (task / "task.toml").write_text(
        toml.replace("[agent]\ntimeout_sec = 60.0", f"[agent]\ntimeout_sec = {agent_timeout_s}")
    )
    assert f"timeout_sec = {agent_timeout_s}" in (task / "task.toml").read_text()
    return task


# model -> (exception on the record, failure class, scored, attempts, main reward)
# What Harbor 0.25 + litellm make of each provider failure, as trialbus records it
# (docs/scoring.md, "Provider failures"). Retryable causes get a second attempt
# (max_attempts=2 below); the others end at the first.
PROVIDER_FAILURES: dict[str, tuple[str | None, str, bool, int, float | None]] = {
    "ratelimit": ("RateLimitError", "infrastructure", False, 2, None),
    # One 429, then answers: the OpenAI SDK waits Retry-After and asks again; the
    # agent never sees it.
    "ratelimit-then-solve": (None, "none", True, 1, 1.0),
    "server-error": ("InternalServerError", "infrastructure", False, 2, None),
    "malformed": ("InternalServerError", "infrastructure", False, 2, None),
    "unauthorized": ("AuthenticationError", "infrastructure", False, 1, None),
    # terminus-2 answers a context overflow by summarising and going on: the trial
    # ends as the agent left it, scored.
    "context-length": (None, "none", True, 1, 0.0),
    # The model never answers within the agent's timeout: the agent's outcome, scored.
    "slow": ("AgentTimeoutError", "agent", True, 1, 0.0),
}


async def test_provider_failures_are_classified(
    stacks: Stacks, stub: ModelStub, tmp_path: Path
) -> None:
    stack, tap, cli = await stacks.started(concurrency=8, runner_env=runner_env(tmp_path))
    # A failing provider costs an attempt ~25 s of retries inside the agent (Harbor's
    # backoffs; 40-60 s with a provider's whole-second Retry-After, see the stub
    # fixture); past the agent's timeout it would be recorded as the agent's
    # timeout instead, so those trials get a long one, and the hung model a shorter one:
    # 60 s, so a loaded machine's agent still reaches its first request (at 15 s one
    # timed out before asking), and half the stub's 120 s answer delay.
    long, short = (hello_file_with_agent_timeout(tmp_path, s) for s in (300.0, 60.0))
    failing = [terminus(stub, m) for m in PROVIDER_FAILURES if m != "slow"]
    manifests = [
        write_manifest(tmp_path, "provider-failures", failing, tasks=[long], max_attempts=2),
        write_manifest(tmp_path, "model-timeout", [terminus(stub, "slow")], tasks=[short]),
    ]
    # Both at once: the retried failures take ~25 s per attempt (Harbor's backoffs).
    ids = await asyncio.gather(*(submit_wait(cli, m, limit_s=600) for m in manifests))
    records: dict[str, Any] = {}
    for exp in ids:
        records |= {r.provenance.agent_label: r for r in await ledger_records(stack, exp)}

    failed = [e for e in tap.events if isinstance(e, TrialFailed)]
    table: dict[str, Any] = {}
    for label, r in sorted(records.items()):
        table[label] = {
            "exception": r.evaluation.exception_type,
            "class": r.evaluation.failure_class,
            "scored": r.evaluation.reward_valid,
            "reward": r.evaluation.main_reward,
            "attempts": r.attempts,
            "retried": sorted(
                {e.attempt for e in failed if e.agent and e.agent.display == label and not e.final}
            ),
            "requests": dict(stub.statuses(label)),
        }
    print("provider failures:", json.dumps(table, sort_keys=True))
    for model, (exception, failure, scored, attempts, reward) in PROVIDER_FAILURES.items():
        row = table[model]
        assert (row["exception"], row["class"], row["scored"]) == (exception, failure, scored), row
        assert (row["attempts"], row["reward"]) == (attempts, reward), row
        # A retried attempt is announced (non-final TrialFailed) before the next one.
        assert row["retried"] == list(range(1, attempts)), row
    # The failures really came from the model: each model saw its scripted status.
    expected_status = {
        "ratelimit": 429,
        "ratelimit-then-solve": 429,
        "server-error": 500,
        "unauthorized": 401,
        "context-length": 400,
        "malformed": 200,
    }
    for model, status in expected_status.items():
        assert stub.count(model, status) > 0, (model, table[model])
    assert stub.received["slow"] > 0  # asked, never answered in time
    # Every layer still retried each attempt (docs/scoring.md's requests per attempt:
    # SDK 3 x LiteLLM.call 3 x terminus-2 3; the SDK does not retry a 200 it cannot
    # read), however short the stub's Retry-After.
    per_attempt = {"ratelimit": 27, "server-error": 27, "malformed": 9}
    for model, n in per_attempt.items():
        assert stub.count(model) == n * table[model]["attempts"], (model, table[model])
    # Negative control: a failure that is not retryable costs only the agent's own
    # retries of one attempt, far fewer requests than one retried by every layer.
    assert stub.count("unauthorized") < stub.count("server-error")
