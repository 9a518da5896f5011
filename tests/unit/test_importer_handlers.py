"""The importer's batch handling: a record the ledger refuses never holds its batch."""

from __future__ import annotations

from collections.abc import Sequence

from schemas.events import Envelope, ResultImported, TrialFailed
from schemas.record import TrialRecord
from services.common.adapters.memory import InMemoryLedger
from services.common.ports import UpsertOutcome
from services.importer.handlers import BatchPlan, apply_plan
from services.importer.records import build_failed_record


class RefusingLedger(InMemoryLedger):
    """Refuses any write that contains the trial ``bad`` (like an oversized document)."""

    async def upsert_records(self, records: Sequence[TrialRecord]) -> UpsertOutcome:
        if any(
            r.trial_id == "bad" and r.evaluation.exception_type != "LedgerRefusedRecord"
            for r in records
        ):
            raise ValueError("document too large")
        return await super().upsert_records(records)


class Bus:
    def __init__(self) -> None:
        self.events: list[Envelope] = []

    async def publish(self, event: Envelope, *, msg_id: str | None = None) -> None:
        self.events.append(event)


def record(trial_id: str) -> TrialRecord:
    return build_failed_record(
        TrialFailed(
            experiment_id="e",
            trial_id=trial_id,
            failure_class="agent",
            error_type="X",
            message="m",
            attempt=1,
            final=True,
        )
    )


async def test_refused_record_is_replaced_and_the_rest_of_the_batch_lands() -> None:
    ledger, bus = RefusingLedger(), Bus()
    plan = BatchPlan(records={"good": record("good"), "bad": record("bad")})
    await apply_plan(plan, ledger, bus)
    good, bad = await ledger.get_record("good"), await ledger.get_record("bad")
    assert good is not None and good == record("good")
    assert bad is not None and bad.status == "partial"
    assert bad.evaluation.exception_type == "LedgerRefusedRecord"
    assert any("document too large" in e for e in bad.errors)
    imported = [e for e in bus.events if isinstance(e, ResultImported)]
    assert sorted(e.trial_id for e in imported) == ["bad", "good"]
