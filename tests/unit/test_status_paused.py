"""Plain ``trialbus status EXP`` (and ``GET /experiments/{id}/status``) says when the
experiment is paused: ``queries.experiment_status`` with the coordinator's flag, and the
CLI's table (services/cli_live.status_table) in words with the way out."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console

from services.cli_live import status_table
from services.common.adapters.memory import InMemoryCoordinator, InMemoryLedger
from services.common.ports import ExperimentInfo
from services.reports import queries
from tests.support.records import passed_record


async def _world(n_records: int) -> tuple[InMemoryLedger, InMemoryCoordinator]:
    ledger = InMemoryLedger()
    await ledger.upsert_experiment(ExperimentInfo("exp", "p", 2, {}))
    await ledger.upsert_records([passed_record(i) for i in range(n_records)])
    return ledger, InMemoryCoordinator(lease_ttl_s=60)


async def test_status_says_paused_while_trials_wait() -> None:
    ledger, coord = await _world(1)
    flag = queries.Lookups(paused_of=coord.is_paused)
    status = await queries.experiment_status(ledger, "exp", flag)
    assert status["paused"] is False  # negative control: not paused
    await coord.pause("exp")
    status = await queries.experiment_status(ledger, "exp", flag)
    assert status["paused"] is True and status["pending"] == 1
    await coord.pause("other")  # another experiment's flag is not this one's
    await coord.resume("exp")
    assert not (await queries.experiment_status(ledger, "exp", flag))["paused"]


async def test_a_finished_experiment_is_not_paused_and_unknown_is_not_false() -> None:
    ledger, coord = await _world(2)
    await coord.pause("exp")
    status = await queries.experiment_status(
        ledger, "exp", queries.Lookups(paused_of=coord.is_paused)
    )
    assert status["paused"] is False  # nothing waits any more, as the dashboard's state
    # Without the flag's reader (NATS out of reach) the key is absent, never False.
    assert "paused" not in await queries.experiment_status(ledger, "exp")


async def test_status_counts_the_unfinished_trials_paused_one_by_one() -> None:
    ledger, coord = await _world(1)  # hello__0 recorded, one trial pending

    async def read() -> dict[str, int | str | bool]:
        lookups = queries.Lookups(paused_of=coord.is_paused, paused_trials_of=coord.paused_trials)
        return await queries.experiment_status(ledger, "exp", lookups)

    assert "paused_trials" not in await read()  # negative control: none paused
    await coord.pause_trial("exp", "hello__0")  # finished: nothing of it waits
    assert "paused_trials" not in await read()
    await coord.pause_trial("exp", "hello__1")
    status = await read()
    assert (status["paused_trials"], status["paused"]) == (1, False)
    assert "1: each waits for `trialbus resume exp --trial TRIAL`" in _text(status)


def _text(counts: Mapping[str, object]) -> str:
    console = Console(width=200, record=True)
    console.print(status_table("exp", dict(counts)))
    return console.export_text()


def test_the_table_says_paused_in_words_with_the_way_out() -> None:
    paused = _text({"total": 2, "pending": 1, "paused": True})
    assert "yes: queued trials wait for `trialbus resume exp`" in paused
    running = _text({"total": 2, "pending": 1, "paused": False})
    assert "paused" in running and "resume" not in running
    assert "paused" not in _text({"total": 2, "pending": 1})


def test_a_long_experiment_id_stays_whole_in_the_title() -> None:
    long_id = "an-experiment-with-a-rather-long-name-0123456789"
    console = Console(width=200, record=True)
    console.print(status_table(long_id, {"total": 2, "pending": 0}))
    assert f"status: {long_id}" in console.export_text()


async def test_status_splits_the_pending_trials_into_running_and_queued() -> None:
    ledger, _ = await _world(1)  # hello__0 recorded; 2 trials, one pending
    await ledger.upsert_experiment(ExperimentInfo("exp", "p", 4, {}))  # three pending

    async def started(experiment_id: str) -> list[str]:
        # hello__0 started and is recorded: done, not running; "elsewhere" is another
        # experiment's id, with no record here.
        return ["hello__0", "hello__1", "hello__2"] if experiment_id == "exp" else ["elsewhere"]

    status = await queries.experiment_status(ledger, "exp", queries.Lookups(started_of=started))
    assert [k for k in status if k in ("pending", "running", "queued")] == [
        "pending", "running", "queued",
    ]  # fmt: skip
    assert (status["pending"], status["running"], status["queued"]) == (3, 2, 1)
    # Without the started trials (NATS out of reach) the split is unknown: absent.
    assert "running" not in await queries.experiment_status(ledger, "exp")
    # Nothing pending: nothing to split.
    await ledger.upsert_experiment(ExperimentInfo("exp", "p", 1, {}))
    done = await queries.experiment_status(ledger, "exp", queries.Lookups(started_of=started))
    assert "running" not in done and done["pending"] == 0
