"""Agent stops and budgets (services/runner/guards.py) through the runner's handler.

The handler runs over the in-memory fakes with a scripted executor: a provider that
refuses an agent's key stops that agent's remaining trials in the experiment with one
message, a budget stops trials that have not started once the spend reaches it, and a
resubmission lifts a stop. Each rule has its negative control.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.events import TrialCompleted, TrialFailed, TrialRequested
from schemas.manifest import AgentSpec, BudgetSpec, ExperimentManifest
from services.common.adapters.memory import InMemoryCoordinator, InMemoryLedger, RecordingBus
from services.common.adapters.memory_objects import InMemoryObjectStore
from services.common.errors import ACK
from services.common.failures import classify, is_retryable, stops_agent
from services.common.ports import ExecutionOutcome, Spend
from services.runner import guards
from services.submitter import handlers as submitter
from services.submitter.handlers import SubmitterPorts
from services.submitter.submit import experiment_id_of, prepare
from tests.unit.runner_support import ScriptedExecutor, make_request
from tests.unit.test_runner_handlers import World

REPO = Path(__file__).resolve().parents[2]
LLM = AgentSpec(name="terminus-2", model="openai/gpt-x", api_key_env=["OPENAI_API_KEY"])
ORACLE = AgentSpec(name="oracle")
OPENAI_NO_CREDIT = (
    "litellm.RateLimitError: RateLimitError: OpenAIException - You exceeded your current "
    "quota, please check your plan and billing details."
)
GEMINI_PER_MINUTE = (
    "litellm.RateLimitError: VertexAIException - You exceeded your current quota, please "
    "check your plan and billing details. For more information on this error, head to: "
    "https://ai.google.dev/gemini-api/docs/rate-limits. Please retry in 32.5s."
)


def trial(i: int, agent: AgentSpec = LLM) -> TrialRequested:
    """Trial ``i`` of ``agent`` in experiment exp-1 (retries allowed)."""
    req = make_request(f"hello__{agent.agent_ref}-{i:04d}", max_attempts=3)
    return req.model_copy(update={"agent": agent})


def outcome(
    tmp: Path,
    request: TrialRequested,
    error: str | None = None,
    message: str | None = None,
    usage: dict[str, float | int | None] | None = None,
) -> ExecutionOutcome:
    """Harbor wrote result.json: ``error`` recorded, ``usage`` as its agent_result."""
    folder = tmp / request.trial_id
    folder.mkdir(parents=True, exist_ok=True)
    result = {"task_name": "hello", "trial_name": request.trial_id, "agent_result": usage}
    (folder / "result.json").write_text(json.dumps(result))
    return ExecutionOutcome("completed", folder, error, message or (error and f"{error}: no"))


def ran(world: World) -> list[str]:
    return [trial_id for trial_id, _, _ in world.executor.calls]


def failures(world: World, error_type: str) -> list[TrialFailed]:
    return [e for e in world.bus.of_type(TrialFailed) if e.error_type == error_type]


@pytest.mark.parametrize(
    ("error", "message", "kind"),
    [
        ("AuthenticationError", "Incorrect API key provided", "authentication"),
        ("PermissionDeniedError", "key lacks access", "authentication"),
        ("RateLimitError", "litellm.RateLimitError: code insufficient_quota", "quota"),
        # What litellm makes of OpenAI's 429 insufficient_quota (seen with litellm 1.x).
        ("RateLimitError", OPENAI_NO_CREDIT, "quota"),
        ("BadRequestError", "Your credit balance is too low to access the API", "quota"),
        # Negative controls: rate limits, server errors and agent outcomes pass on.
        ("RateLimitError", "Rate limit reached, retry after 1 s", None),
        ("RateLimitError", GEMINI_PER_MINUTE, None),
        ("InternalServerError", "HTTP 500", None),
        ("AgentTimeoutError", "insufficient_quota in the agent's own output", None),
        (None, None, None),
    ],
)
def test_which_failures_stop_an_agent(error: str | None, message: str | None, kind: str) -> None:
    assert stops_agent(error, message) == kind


def test_the_refusals_are_unscored_and_never_retried() -> None:
    for error_type in ("AgentStopped", "BudgetExceeded"):
        assert classify(error_type) == "infrastructure" and not is_retryable(error_type)


async def test_a_refused_key_stops_the_agents_remaining_trials(tmp_path: Path) -> None:
    def script(r: TrialRequested, _attempt: int) -> ExecutionOutcome:
        error = "AuthenticationError" if r.agent == LLM else None
        return outcome(tmp_path, r, error)

    world = World(ScriptedExecutor(script))
    llm, oracle = [trial(i) for i in range(6)], [trial(i, ORACLE) for i in range(3)]
    for req in [llm[0], oracle[0], *llm[1:], *oracle[1:]]:
        assert await world.handle(req) == ACK
    # One real failure, five trials ended before they started; the oracle ran all three.
    assert ran(world) == [llm[0].trial_id, *(r.trial_id for r in oracle)]
    # The real failure: Harbor wrote its result.json (recording the error), not retried.
    completions = world.bus.of_type(TrialCompleted)
    assert (completions[0].trial_id, completions[0].attempt) == (llm[0].trial_id, 1)
    stopped = failures(world, "AgentStopped")
    assert [e.trial_id for e in stopped] == [r.trial_id for r in llm[1:]]
    for event in stopped:
        assert (event.final, event.failure_class, event.attempt) == (True, "infrastructure", 1)
        # One clear message: the first failure, its trial, and the fix.
        assert "AuthenticationError" in event.message and llm[0].trial_id in event.message
        assert "set OPENAI_API_KEY on the runners" in event.message, event.message
    assert len(completions) == 4
    # The stop is per experiment: the same agent in another experiment still runs.
    other = trial(9).model_copy(update={"experiment_id": "exp-2"})
    assert await world.handle(other) == ACK
    assert ran(world)[-1] == other.trial_id


async def test_an_empty_account_stops_the_agent_without_a_retry(tmp_path: Path) -> None:
    quota = "litellm.RateLimitError: You exceeded your quota (insufficient_quota)"
    world = World(ScriptedExecutor(lambda r, a: outcome(tmp_path, r, "RateLimitError", quota)))
    assert await world.handle(trial(0)) == ACK  # Harbor would retry a RateLimitError
    assert await world.handle(trial(1)) == ACK
    assert ran(world) == [trial(0).trial_id]
    assert [e.attempt for e in world.bus.of_type(TrialCompleted)] == [1]
    assert [(e.error_type, e.final) for e in world.bus.of_type(TrialFailed)] == [
        ("AgentStopped", True)
    ]
    assert "add credit" in failures(world, "AgentStopped")[0].message


@pytest.mark.parametrize("error", ["RateLimitError", "InternalServerError"])
async def test_a_passing_provider_error_stops_nothing(tmp_path: Path, error: str) -> None:
    # Negative control: retried, then final, and every trial still runs.
    world = World(ScriptedExecutor(lambda r, a: outcome(tmp_path, r, error)))
    requests = [trial(i) for i in range(3)]
    for req in requests:
        while (await world.handle(req)).action == "nak":
            pass
    assert sorted({t for t in ran(world)}) == sorted(r.trial_id for r in requests)
    assert len(ran(world)) == 9  # three attempts each
    assert failures(world, "AgentStopped") == []


async def test_a_resubmission_lifts_the_stop(tmp_path: Path) -> None:
    manifest = ExperimentManifest.model_validate(
        {
            "name": "guards",
            "tasks": ["hello-file"],
            "agents": [LLM.model_dump(), ORACLE.model_dump()],
        }
    )
    prepared = prepare(manifest, REPO / "examples" / "tasks")
    exp, coord = prepared.experiment_id, InMemoryCoordinator(lease_ttl_s=60)
    keys = [guards.agent_key_of(r) for r in prepared.trials]
    for key in keys:
        await coord.stop_agent(exp, key, b'{"kind": "authentication"}')
    await coord.stop_agent("exp-other", keys[0], b"{}")
    tasks = InMemoryObjectStore("TASKS")
    await submitter.submit(prepared, SubmitterPorts(RecordingBus(), InMemoryLedger(), coord, tasks))
    assert [await coord.agent_stop(exp, key) for key in keys] == [None, None]
    # Negative control: another experiment's stop stays.
    assert await coord.agent_stop("exp-other", keys[0]) is not None


# -- budgets -------------------------------------------------------------------------


async def budget_world(tmp_path: Path, budget: BudgetSpec | None, cost: float | None) -> World:
    """Six trials, each using 1000 + 200 tokens at ``cost``, run one after the other."""
    usage = {"n_input_tokens": 1000, "n_output_tokens": 200, "cost_usd": cost}
    world = World(ScriptedExecutor(lambda r, a: outcome(tmp_path, r, usage=usage)))
    if budget is not None:
        await world.coord.set_budget("exp-1", budget.model_dump_json().encode())
    for i in range(6):
        assert await world.handle(trial(i)) == ACK
    return world


async def test_a_usd_budget_stops_trials_not_yet_started(tmp_path: Path) -> None:
    world = await budget_world(tmp_path, BudgetSpec(max_cost_usd=0.05), cost=0.02)
    # 0.02, 0.04, 0.06 >= 0.05: the fourth trial and later never start.
    assert len(ran(world)) == 3
    over = failures(world, "BudgetExceeded")
    assert len(over) == 3 and all(e.final and e.failure_class == "infrastructure" for e in over)
    assert "$0.0600 of max_cost_usd $0.05" in over[0].message, over[0].message
    spent = await world.coord.spent("exp-1")
    assert (spent.tokens, spent.attempts, spent.unpriced) == (3600, 3, 0)
    assert spent.cost_usd == pytest.approx(0.06)


async def test_without_a_budget_every_trial_runs(tmp_path: Path) -> None:
    # Negative control: the same spending, no budget.
    world = await budget_world(tmp_path, None, cost=0.02)
    assert len(ran(world)) == 6 and failures(world, "BudgetExceeded") == []


async def test_unpriced_trials_count_tokens_only_and_say_so(tmp_path: Path) -> None:
    # No price: a USD budget cannot see the cost (every trial runs) ...
    world = await budget_world(tmp_path, BudgetSpec(max_cost_usd=0.05), cost=None)
    assert len(ran(world)) == 6
    assert (await world.coord.spent("exp-1")).unpriced == 6
    # ... a token budget can, and its message says what the USD total lacks.
    world = await budget_world(tmp_path, BudgetSpec(max_tokens=2400), cost=None)
    assert len(ran(world)) == 2
    [first, *_] = failures(world, "BudgetExceeded")
    assert "2400 of max_tokens 2400" in first.message
    assert "2 attempts had no price" in first.message, first.message


def test_a_budget_needs_a_limit_and_an_absent_one_leaves_the_manifest_bytes() -> None:
    with pytest.raises(ValueError, match="max_cost_usd, max_tokens or both"):
        BudgetSpec()
    base = {"name": "n", "tasks": ["t"], "agents": [{"name": "oracle"}]}
    assert "budget" not in ExperimentManifest.model_validate(base).model_dump(mode="json")
    with_budget = ExperimentManifest.model_validate({**base, "budget": {"max_tokens": 5}})
    assert with_budget.model_dump(mode="json")["budget"] == {"max_cost_usd": None, "max_tokens": 5}


def test_spend_survives_its_stored_form() -> None:
    spend = Spend(cost_usd=0.5, tokens=7, attempts=2, unpriced=1)
    assert Spend.decode(spend.encode()) == spend and Spend.decode(None) == Spend()


def test_the_budget_is_not_part_of_the_experiment_id() -> None:
    base = {"name": "n", "tasks": ["t"], "agents": [{"name": "oracle"}]}
    ids = {
        experiment_id_of(ExperimentManifest.model_validate({**base, **extra}))
        for extra in ({}, {"budget": {"max_tokens": 5}}, {"budget": {"max_cost_usd": 9.0}})
    }
    assert len(ids) == 1
    # Negative control: a change of content is another experiment.
    assert (
        experiment_id_of(ExperimentManifest.model_validate({**base, "repetitions": 2})) not in ids
    )
