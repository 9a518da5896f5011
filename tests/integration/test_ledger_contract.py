"""One contract for the Ledger port, run against every adapter.

``memory`` is the unit-test fake; ``mongo`` is MongoLedger against the session's real
SecantusDB server (a unique database per test). A behaviour the fake has and the real
adapter lacks (or the reverse) fails here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from infra.embedded import free_port
from schemas.record import Evaluation, PhaseTiming, Provenance, RecordStatus, TrialRecord
from services.common.adapters.memory import InMemoryLedger
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.errors import LedgerUnavailable
from services.common.ports import ExperimentInfo, Ledger, UpsertOutcome, record_content_hash
from services.reports.tally import tally_of
from tests.support.ledger_documents import ledger_and_documents

pytestmark = pytest.mark.integration


FINISHED = datetime(2026, 1, 2, 3, 4, 6, 654321, tzinfo=UTC)
SECOND = timedelta(seconds=1)


def make_record(
    trial_id: str,
    *,
    experiment_id: str = "exp-a",
    status: RecordStatus = "complete",
    reward: float | None = 1.0,
    note: str | None = None,
    attempts: int = 1,
    finished_at: datetime | None = FINISHED,
) -> TrialRecord:
    """A small but fully populated record; ``note`` varies content without changing meaning."""
    valid = reward is not None and status == "complete"
    return TrialRecord(
        trial_id=trial_id,
        experiment_id=experiment_id,
        repetition=0,
        status=status,
        provenance=Provenance(task_name="hello-file", agent_name="oracle", model=note),
        # Microseconds on purpose: they must survive the round trip exactly.
        timing=PhaseTiming(
            started_at=datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
            finished_at=finished_at,
            total_s=1.530865,
        ),
        evaluation=Evaluation(
            # A dotted key is legal in reward.json and must be stored as-is.
            rewards={} if reward is None else {"reward": reward, "sub.metric": 0.5},
            main_reward_key=None if reward is None else "reward",
            main_reward=reward,
            reward_valid=valid,
            failure_class="none" if status == "complete" else "infrastructure",
        ),
        errors=[] if status == "complete" else ["result.json: missing"],
        attempts=attempts,
    )


@pytest.fixture(params=["memory", "mongo"])
def ledger_factory(request: pytest.FixtureRequest) -> Callable[[], Ledger]:
    """Makes a fresh adapter; all adapters made in one test share one store."""
    if request.param == "memory":
        shared = InMemoryLedger()
        return lambda: shared
    url: str = request.getfixturevalue("ledger_url")
    database: str = request.getfixturevalue("ledger_db")
    return lambda: MongoLedger(url, database)


@pytest.fixture
async def ledger(ledger_factory: Callable[[], Ledger]) -> AsyncIterator[Ledger]:
    the_ledger = ledger_factory()
    await the_ledger.ensure_indexes()
    yield the_ledger
    await the_ledger.close()


async def test_insert_then_unchanged_then_updated(ledger: Ledger) -> None:
    first = await ledger.upsert_records([make_record("t1"), make_record("t2")])
    assert sorted(first.inserted) == ["t1", "t2"]
    assert first.updated == [] and first.unchanged == []

    again = await ledger.upsert_records([make_record("t1"), make_record("t2", note="changed")])
    assert again.inserted == []
    assert again.unchanged == ["t1"]
    assert again.updated == ["t2"]
    assert again.changed("t2") and not again.changed("t1")


async def test_record_round_trips_exactly(ledger: Ledger) -> None:
    record = make_record("t1")
    await ledger.upsert_records([record])
    assert await ledger.get_record("t1") == record
    assert await ledger.get_record("absent") is None


async def test_reupserting_the_same_batch_changes_nothing(ledger: Ledger) -> None:
    batch = [make_record(f"t{i}", reward=i / 4) for i in range(5)]
    await ledger.upsert_records(batch)
    before = await ledger.records_for("exp-a")

    outcome = await ledger.upsert_records(batch)

    assert outcome.inserted == [] and outcome.updated == []
    assert sorted(outcome.unchanged) == [r.trial_id for r in batch]
    assert await ledger.records_for("exp-a") == before


async def test_partial_never_overwrites_complete(ledger: Ledger) -> None:
    complete = make_record("t1")
    await ledger.upsert_records([complete])

    outcome = await ledger.upsert_records([make_record("t1", status="partial", reward=None)])

    assert outcome.unchanged == ["t1"]
    assert await ledger.get_record("t1") == complete


async def test_complete_overwrites_partial(ledger: Ledger) -> None:
    await ledger.upsert_records([make_record("t1", status="partial", reward=None)])
    complete = make_record("t1")

    outcome = await ledger.upsert_records([complete])

    assert outcome.updated == ["t1"]
    assert await ledger.get_record("t1") == complete


async def test_newer_content_of_the_same_status_replaces_older(ledger: Ledger) -> None:
    await ledger.upsert_records(
        [make_record("c", reward=0.0), make_record("p", status="partial", reward=None)]
    )
    newer_c = make_record("c", reward=1.0)
    newer_p = make_record("p", status="partial", reward=None, note="more detail")

    outcome = await ledger.upsert_records([newer_c, newer_p])

    assert sorted(outcome.updated) == ["c", "p"]
    assert await ledger.get_record("c") == newer_c
    assert await ledger.get_record("p") == newer_p


async def test_mixed_batch_reports_each_trial_once(ledger: Ledger) -> None:
    await ledger.upsert_records([make_record("same"), make_record("changed")])

    outcome = await ledger.upsert_records(
        [make_record("new"), make_record("same"), make_record("changed", reward=0.0)]
    )

    assert (outcome.inserted, outcome.updated, outcome.unchanged) == (
        ["new"],
        ["changed"],
        ["same"],
    )


async def test_duplicated_trial_id_inside_a_batch(ledger: Ledger) -> None:
    later = make_record("dup", reward=0.25)
    outcome = await ledger.upsert_records([make_record("dup", reward=0.75), later])
    # Written once, reported once, and the later record wins.
    assert (outcome.inserted, outcome.updated, outcome.unchanged) == (["dup"], [], [])
    assert await ledger.get_record("dup") == later

    complete = make_record("mix")
    partial = make_record("mix", status="partial", reward=None)
    outcome = await ledger.upsert_records([complete, partial])
    # ...except that a partial record never displaces a complete one, in either order.
    assert outcome.inserted == ["mix"]
    assert await ledger.get_record("mix") == complete
    outcome = await ledger.upsert_records([partial, complete, partial])
    assert outcome.unchanged == ["mix"]


async def test_an_older_result_never_replaces_a_newer_one(ledger: Ledger) -> None:
    # Attempt 1's TrialCompleted redelivered to the importer after attempt 2's.
    first = make_record("t1", reward=0.0, attempts=1, finished_at=FINISHED)
    second = make_record("t1", reward=1.0, attempts=2, finished_at=FINISHED + SECOND)
    await ledger.upsert_records([second])

    outcome = await ledger.upsert_records([first])

    assert (outcome.inserted, outcome.updated, outcome.unchanged) == ([], [], ["t1"])
    assert await ledger.get_record("t1") == second
    # Negative control: in the order they finished, the newer result replaces the older.
    await ledger.upsert_records([first.model_copy(update={"trial_id": "t2"})])
    newer = second.model_copy(update={"trial_id": "t2"})
    assert (await ledger.upsert_records([newer])).updated == ["t2"]
    assert await ledger.get_record("t2") == newer


async def test_the_same_finish_time_ranks_by_attempt(ledger: Ledger) -> None:
    later = make_record("t1", reward=1.0, attempts=3)
    await ledger.upsert_records([later])
    assert (await ledger.upsert_records([make_record("t1", attempts=2)])).unchanged == ["t1"]
    assert await ledger.get_record("t1") == later
    # Negative control: a higher attempt at the same time replaces it.
    highest = make_record("t1", reward=0.5, attempts=4)
    assert (await ledger.upsert_records([highest])).updated == ["t1"]
    assert await ledger.get_record("t1") == highest


async def test_finish_times_compare_as_instants_not_as_text(ledger: Ledger) -> None:
    # Compared as ISO text, both answers below would be wrong: "03:04:06Z" sorts after
    # "03:04:06.5Z", and "04:04:06+02:00" (02:04:06 UTC) after "03:04:06Z".
    whole = make_record("t1", attempts=1, finished_at=datetime(2026, 1, 2, 3, 4, 6, tzinfo=UTC))
    await ledger.upsert_records([whole])
    two_hours_east = timezone(timedelta(hours=2))
    earlier = make_record(
        "t1",
        reward=0.0,
        attempts=2,
        finished_at=datetime(2026, 1, 2, 4, 4, 6, tzinfo=two_hours_east),
    )
    assert (await ledger.upsert_records([earlier])).unchanged == ["t1"]
    assert await ledger.get_record("t1") == whole
    # Negative control: half a second later does replace it.
    later = make_record(
        "t1", reward=0.0, finished_at=datetime(2026, 1, 2, 3, 4, 6, 500000, tzinfo=UTC)
    )
    assert (await ledger.upsert_records([later])).updated == ["t1"]
    assert await ledger.get_record("t1") == later


async def test_a_resumed_run_replaces_the_older_run_it_re_ran(ledger: Ledger) -> None:
    # A re-run counts attempts from 1 again: the finish time says it is the newer one.
    unscored = make_record("c", reward=None, attempts=3)
    failed = make_record("p", status="partial", reward=None, attempts=3)
    await ledger.upsert_records([unscored, failed])
    rerun_c = make_record("c", reward=1.0, attempts=1, finished_at=FINISHED + SECOND)
    rerun_p = make_record("p", status="partial", reward=None, attempts=1, note="resumed")

    outcome = await ledger.upsert_records([rerun_c, rerun_p])

    assert sorted(outcome.updated) == ["c", "p"]
    assert await ledger.get_record("c") == rerun_c
    assert await ledger.get_record("p") == rerun_p
    # Negative control: the resumed run's result that does not say when it finished
    # ranks below one that does, and a partial below any complete.
    untimed = make_record("c", reward=0.0, attempts=1, finished_at=None)
    assert (await ledger.upsert_records([untimed])).unchanged == ["c"]
    assert (
        await ledger.upsert_records([rerun_p.model_copy(update={"trial_id": "c"})])
    ).unchanged == ["c"]
    assert await ledger.get_record("c") == rerun_c


async def test_inside_a_batch_the_newest_result_wins_in_any_order(ledger: Ledger) -> None:
    old = make_record("t1", reward=0.0, attempts=1)
    new = make_record("t1", reward=1.0, attempts=2, finished_at=FINISHED + SECOND)
    assert (await ledger.upsert_records([new, old])).inserted == ["t1"]
    assert await ledger.get_record("t1") == new
    assert (await ledger.upsert_records([old, new, old])).unchanged == ["t1"]
    # Negative control: without the newer one, the older result is what is stored.
    assert (await ledger.upsert_records([old.model_copy(update={"trial_id": "t2"})])).inserted
    assert (await ledger.get_record("t2")) == old.model_copy(update={"trial_id": "t2"})


async def test_empty_batch(ledger: Ledger) -> None:
    outcome = await ledger.upsert_records([])
    assert (outcome.inserted, outcome.updated, outcome.unchanged) == ([], [], [])


# -- a record never changes experiment ----------------------------------------------


@pytest.mark.parametrize(
    "variant",
    [
        {},  # the same content, only the experiment differs (a copied job folder)
        {"note": "forged"},  # new content
        {"finished_at": FINISHED + SECOND, "attempts": 2},  # ranks above the stored one
    ],
    ids=["same-content", "new-content", "ranks-higher"],
)
async def test_a_write_for_another_experiment_is_a_conflict_not_a_move(
    ledger: Ledger, variant: dict[str, Any]
) -> None:
    await ledger.upsert_records([make_record("t1"), make_record("t2")])
    stored = await ledger.get_record("t1")

    outcome = await ledger.upsert_records(
        [
            make_record("t1", experiment_id="exp-b", **variant),
            make_record("b1", experiment_id="exp-b"),
        ]
    )

    assert outcome.conflicts == {"t1": "exp-a"}
    assert outcome.inserted == ["b1"]  # the rest of the batch is written
    assert (outcome.updated, outcome.unchanged) == ([], [])
    assert not outcome.changed("t1")
    assert await ledger.get_record("t1") == stored
    assert [r.trial_id for r in await ledger.records_for("exp-a")] == ["t1", "t2"]
    assert [r.trial_id for r in await ledger.records_for("exp-b")] == ["b1"]
    # Negative control: the same write for the stored experiment is applied.
    same = await ledger.upsert_records([make_record("t1", **variant)])
    assert same.conflicts == {}
    assert same.changed("t1") == bool(variant)


async def test_conflicts_of_a_whole_batch_leave_the_first_experiment_whole(
    ledger: Ledger,
) -> None:
    ids = [f"t{i:02d}" for i in range(20)]
    await ledger.upsert_records([make_record(t) for t in ids])

    copy = await ledger.upsert_records(
        [make_record(t, experiment_id="exp-copy", status="partial", reward=None) for t in ids]
    )

    assert copy.conflicts == dict.fromkeys(ids, "exp-a")
    assert (copy.inserted, copy.updated, copy.unchanged) == ([], [], [])
    assert await ledger.count_records("exp-a") == 20
    assert await ledger.count_records("exp-copy") == 0
    assert await ledger.scored_trial_ids("exp-a") == set(ids)


def test_merged_outcomes_keep_their_conflicts() -> None:
    total = UpsertOutcome(inserted=["a"])
    total.merge(UpsertOutcome(conflicts={"b": "exp-a"}))
    assert total.conflicts == {"b": "exp-a"} and total.inserted == ["a"]


async def test_scored_trial_ids_and_counts_are_per_experiment(ledger: Ledger) -> None:
    await ledger.upsert_records(
        [
            make_record("a1"),
            make_record("a2", reward=0.0),  # a zero is a valid score
            make_record("a3", status="partial", reward=None),
            make_record("b1", experiment_id="exp-b"),
        ]
    )

    assert await ledger.scored_trial_ids("exp-a") == {"a1", "a2"}
    assert await ledger.scored_trial_ids("exp-b") == {"b1"}
    assert await ledger.scored_trial_ids("exp-none") == set()
    assert await ledger.count_records("exp-a") == 3
    assert await ledger.count_records("exp-b") == 1
    assert await ledger.count_records("exp-none") == 0
    assert [r.trial_id for r in await ledger.records_for("exp-a")] == ["a1", "a2", "a3"]


async def test_recorded_among_names_the_given_ids_with_a_record_in_the_experiment(
    ledger: Ledger,
) -> None:
    await ledger.upsert_records(
        [make_record("a1"), make_record("a2"), make_record("b1", experiment_id="exp-b")]
    )
    asked = {"a1", "b1", "missing"}
    assert await ledger.recorded_among("exp-a", asked) == {"a1"}  # b1: another experiment's
    assert await ledger.recorded_among("exp-b", asked) == {"b1"}
    assert await ledger.recorded_among("exp-a", []) == set()
    # More ids than one query takes (the Mongo adapter asks in chunks).
    many = [f"a0-{i}" for i in range(2500)]  # sorted before a2: it is in the last chunk
    assert await ledger.recorded_among("exp-a", [*many, "a2"]) == {"a2"}


async def test_experiment_metadata_round_trip(ledger: Ledger) -> None:
    info = ExperimentInfo(
        experiment_id="exp-a",
        name="Experiment A",
        n_trials=6,
        manifest={"name": "Experiment A", "agents": [{"name": "oracle", "kwargs": {}}]},
    )
    assert await ledger.get_experiment("exp-a") is None

    await ledger.upsert_experiment(info)
    assert await ledger.get_experiment("exp-a") == info

    refreshed = ExperimentInfo("exp-a", "Experiment A", 8, {"name": "Experiment A"})
    await ledger.upsert_experiment(refreshed)
    assert await ledger.get_experiment("exp-a") == refreshed


async def test_experiment_ids_include_experiments_known_only_by_records(ledger: Ledger) -> None:
    await ledger.upsert_experiment(ExperimentInfo("exp-meta", "m", 1, {}))
    await ledger.upsert_records([make_record("r1", experiment_id="exp-records")])

    assert sorted(await ledger.experiment_ids()) == ["exp-meta", "exp-records"]


async def test_ensure_indexes_is_idempotent(ledger: Ledger) -> None:
    await ledger.ensure_indexes()
    await ledger.upsert_records([make_record("t1")])
    await ledger.ensure_indexes()
    assert await ledger.count_records("exp-a") == 1


async def test_concurrent_writers_each_trial_ends_with_one_of_their_versions(
    ledger_factory: Callable[[], Ledger],
) -> None:
    first, second = ledger_factory(), ledger_factory()
    await first.ensure_indexes()
    ids = [f"t{i:03d}" for i in range(60)]
    versions = {
        "a": [make_record(i, reward=0.0) for i in ids],
        "b": [make_record(i, reward=1.0) for i in ids],
    }

    out_a, out_b = await asyncio.gather(
        first.upsert_records(versions["a"]), second.upsert_records(versions["b"])
    )

    for outcome in (out_a, out_b):
        reported = outcome.inserted + outcome.updated + outcome.unchanged
        assert sorted(reported) == ids
    # Exactly one insert per trial across both writers, whatever the interleaving.
    assert sorted(out_a.inserted + out_b.inserted) == ids
    stored = await first.records_for("exp-a")
    assert [r.trial_id for r in stored] == ids
    assert all(r.evaluation.main_reward in (0.0, 1.0) for r in stored)
    await first.close()
    await second.close()


# -- MongoLedger only ----------------------------------------------------------------


async def test_mongo_document_carries_hash_and_import_time(ledger_url: str, ledger_db: str) -> None:
    record = make_record("t1")
    async with ledger_and_documents(ledger_url, ledger_db) as (ledger, db):
        await ledger.upsert_records([record])
        doc = await db["trials"].find_one({"trial_id": "t1"})
        indexes = await db["trials"].index_information()
    assert doc is not None
    assert doc["content_hash"] == record_content_hash(record)
    assert doc["order_key"] == "1|2026-01-02T03:04:06.654321|0000000001"
    assert isinstance(doc["imported_at"], datetime)
    assert doc["timing"]["started_at"] == "2026-01-02T03:04:05.123456Z"
    assert indexes["trial_id_1"].get("unique") is True
    assert "experiment_id_1" in indexes


async def test_mongo_retries_an_item_that_lost_a_race(
    ledger_url: str, ledger_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, other = MongoLedger(ledger_url, ledger_db), MongoLedger(ledger_url, ledger_db)
    await ledger.ensure_indexes()
    await ledger.upsert_records([make_record("t1", status="partial", reward=None)])
    mine = make_record("t1", reward=1.0)
    real_stored = MongoLedger._stored
    calls = 0

    async def read_then_another_writer(self: MongoLedger, trial_ids: Any) -> Any:
        # We read the stored partial record, then another writer replaces it before our
        # update: replacing that third version while subtracting the partial's tally
        # would be a lie twice (its tally subtracted twice, a count of -1 partial).
        nonlocal calls
        calls += 1
        stored = await real_stored(self, trial_ids)
        if calls == 1:
            await other.upsert_records([make_record("t1", reward=0.5)])
        return stored

    monkeypatch.setattr(MongoLedger, "_stored", read_then_another_writer)
    try:
        outcome = await ledger.upsert_records([mine])
        # Ours, the other writer's, ours again (the pinned update found another version).
        assert calls == 3
        assert outcome.updated == ["t1"]
        assert await ledger.get_record("t1") == mine
        assert await ledger.experiment_tally("exp-a") == tally_of([mine])
    finally:
        await ledger.close()
        await other.close()


async def test_mongo_unreachable_server_raises_ledger_unavailable() -> None:
    # A port nothing listens on: connection refused until server selection gives up
    # (PyMongo waits ~0.5 s per operation whatever the timeout: its minimum heartbeat).
    port = free_port()
    ledger = MongoLedger(f"mongodb://127.0.0.1:{port}", "nowhere", server_selection_timeout_ms=100)
    try:
        with pytest.raises(LedgerUnavailable, match="upsert_records") as raised:
            await ledger.upsert_records([make_record("t1")])
        # One line a person reads: the server and why, not pymongo's topology dump.
        message = str(raised.value)
        assert message.startswith(f"ledger unreachable during upsert_records: 127.0.0.1:{port}: ")
        assert "Connect call failed" in message or "refused" in message, message
        assert "Topology Description" not in message and "configured timeouts" not in message
        assert len(message) < 200, message
        assert "Topology Description" in str(raised.value.__cause__)  # what was cut
        with pytest.raises(LedgerUnavailable):
            await ledger.scored_trial_ids("exp-a")
    finally:
        await ledger.close()


async def test_mongo_a_document_without_order_key_ranks_by_status(
    ledger_url: str, ledger_db: str
) -> None:
    # Documents written before order keys existed: a partial still never replaces a
    # complete one, and any complete record replaces them (they carry no rank).
    stored = make_record("t1", attempts=5, finished_at=FINISHED + SECOND)
    async with ledger_and_documents(ledger_url, ledger_db) as (ledger, db):
        await ledger.upsert_records([stored])
        trials = db["trials"]
        await trials.update_one({"trial_id": "t1"}, {"$unset": {"order_key": ""}})
        partial = make_record("t1", status="partial", reward=None, attempts=9)
        assert (await ledger.upsert_records([partial])).unchanged == ["t1"]
        assert await ledger.get_record("t1") == stored
        # Negative control: an older complete record would lose to an order key, not here.
        older = make_record("t1", reward=0.0, attempts=1)
        assert (await ledger.upsert_records([older])).updated == ["t1"]
        assert await ledger.get_record("t1") == older
        doc = await trials.find_one({"trial_id": "t1"})
        assert doc is not None and doc["order_key"].startswith("1|")
