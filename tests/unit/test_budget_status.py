"""``trialbus status`` shows what the recorded trials spent of the manifest's budget."""

from __future__ import annotations

from schemas.record import Provenance, TrialRecord, Usage
from services.common.adapters.memory import InMemoryLedger
from services.common.ports import ExperimentInfo
from services.reports.queries import experiment_status
from tests.support.records import single_reward


def record(i: int, cost: float | None, exception: str | None = None) -> TrialRecord:
    return TrialRecord(
        trial_id=f"hello__{i:04d}",
        experiment_id="exp-b",
        status="complete" if exception is None else "partial",
        provenance=Provenance(task_name="hello", agent_name="terminus-2"),
        evaluation=single_reward(1.0 if exception is None else None, exception=exception),
        usage=Usage(n_input_tokens=1000, n_output_tokens=200, cost_usd=cost),
    )


async def status_of(
    budget: dict[str, float] | None, records: list[TrialRecord]
) -> dict[str, int | str]:
    ledger = InMemoryLedger()
    manifest = {"name": "b"} | ({"budget": budget} if budget else {})
    await ledger.upsert_experiment(ExperimentInfo("exp-b", "b", 4, manifest))
    await ledger.upsert_records(records)
    return await experiment_status(ledger, "exp-b")


async def test_status_shows_spend_against_the_budget() -> None:
    records = [record(0, 0.02), record(1, 0.02), record(2, None)]
    status = await status_of({"max_cost_usd": 0.05, "max_tokens": 5000}, records)
    assert status["budget"] == (
        "$0.0400 of $0.05 USD (1 of 3 trials that used tokens have no price); 3600 of 5000 tokens"
    )
    assert status["scored"] == 3  # the counts are still there
    reached = await status_of({"max_tokens": 3000}, [*records, record(3, None, "BudgetExceeded")])
    assert reached["budget"] == "4800 of 3000 tokens — reached: trials not started were stopped"


async def test_without_a_budget_status_has_counts_only() -> None:
    # Negative control: the same records, no budget in the manifest.
    status = await status_of(None, [record(0, 0.02)])
    assert "budget" not in status and all(isinstance(v, int) for v in status.values())
