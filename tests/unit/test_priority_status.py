"""The priority class an experiment runs in, as ``trialbus status --json`` and
``trialbus experiments --json`` show it (from the ledger's copy of the manifest)."""

from __future__ import annotations

from typing import Any

from services.common.adapters.memory import InMemoryLedger
from services.common.ports import ExperimentInfo
from services.reports import queries
from services.reports.progress import experiment_row, recorded_of


async def _status_and_row(manifest: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    ledger = InMemoryLedger()
    info = ExperimentInfo("exp", "p", 1, manifest)
    await ledger.upsert_experiment(info)
    status = dict(await queries.experiment_status(ledger, "exp"))
    return status, experiment_row("exp", info, recorded_of([], info), []).as_dict()


async def test_a_named_class_is_shown_and_an_unnamed_one_is_the_default() -> None:
    status, row = await _status_and_row({"compute": {"priority_class": "urgent"}})
    assert status["priority_class"] == "urgent" and row["priority_class"] == "urgent"
    # Negative control: a manifest that names no class (the installation's default).
    status, row = await _status_and_row({"compute": {"pool": "default"}})
    assert "priority_class" not in status and row["priority_class"] is None
