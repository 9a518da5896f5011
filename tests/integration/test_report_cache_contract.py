"""The report cache cannot serve a stale report, against every Ledger adapter.

``Ledger.experiment_version`` must change with every write that changes a record or
the metadata of the experiment, and stay put while nothing changes (else the cache
would never hit). ``queries.derived`` keys the computed leaderboard, report and
experiment page by it (services/reports/report_cache.py), so after any write the next
read shows the write. A ledger whose version does not move is the negative control:
the same reads then do serve the stale report, so these tests can fail.
MongoLedger's version also says None while a write batch is in flight (nothing is
kept then) and never repeats for an experiment written again from scratch.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

import pytest

from benchmarks.wrapped_ledger import WrappedLedger
from services.common.ports import ExperimentInfo, Ledger
from services.reports import queries
from services.reports.report_cache import ReportCache
from services.submitter.dashboard_stream import page_view
from tests.integration.test_ledger_contract import (  # noqa: F401 (fixtures)
    ledger,
    ledger_factory,
    make_record,
)
from tests.support.ledger_documents import age_pending_marks, ledger_and_documents, write_then_die

pytestmark = pytest.mark.integration


class PinnedVersion(WrappedLedger):
    """A ledger whose content version never moves (the negative control)."""

    async def experiment_version(self, experiment_id: str) -> str | None:
        """Always the same token: what a version not bumped by a write would do."""
        return "pinned"


async def test_a_write_changes_the_version_and_a_read_does_not(ledger: Ledger) -> None:  # noqa: F811
    assert await ledger.experiment_version("exp-a") is None  # unknown: nothing to keep
    await ledger.upsert_records([make_record("t1")])
    first = await ledger.experiment_version("exp-a")
    assert first is not None

    # Negative controls: reads, and writes to another experiment, leave it alone.
    await ledger.records_for("exp-a")
    await ledger.experiment_tally("exp-a")
    await ledger.upsert_records([make_record("o1", experiment_id="exp-b")])
    assert await ledger.experiment_version("exp-a") == first

    await ledger.upsert_records([make_record("t2")])  # a new record
    second = await ledger.experiment_version("exp-a")
    await ledger.upsert_records([make_record("t2", note="changed")])  # a replaced one
    third = await ledger.experiment_version("exp-a")
    await ledger.upsert_experiment(ExperimentInfo("exp-a", "a", 9, {}))  # the metadata
    fourth = await ledger.experiment_version("exp-a")
    assert len({first, second, third, fourth}) == 4


async def test_the_next_read_after_a_write_shows_it(ledger: Ledger) -> None:  # noqa: F811
    await ledger.upsert_experiment(ExperimentInfo("exp-a", "a", 3, {}))
    await ledger.upsert_records([make_record("t1", reward=1.0)])
    cache = ReportCache()
    report = await queries.experiment_report(ledger, "exp-a", cache=cache)
    assert report["status"]["recorded"] == 1
    again = await queries.experiment_report(ledger, "exp-a", cache=cache)
    assert again is report and cache.stats().hits == 1  # kept: the ledger did not change

    await ledger.upsert_records([make_record("t2", reward=0.0)])
    after = await queries.experiment_report(ledger, "exp-a", cache=cache)
    assert after["status"]["recorded"] == 2
    # The same numbers as an uncached read (the CLI's): one read path.
    assert after == await queries.experiment_report(ledger, "exp-a")

    _, rows = await queries.experiment_leaderboard(ledger, "exp-a", cache=cache)
    await ledger.upsert_records([make_record("t1", reward=0.0, note="rescored")])
    _, rescored = await queries.experiment_leaderboard(ledger, "exp-a", cache=cache)
    assert rows[0]["mean_reward"] == 0.5 and rescored[0]["mean_reward"] == 0.0
    assert rescored == (await queries.experiment_leaderboard(ledger, "exp-a"))[1]

    view = await page_view(ledger, "exp-a", cache)
    await ledger.upsert_experiment(ExperimentInfo("exp-a", "renamed", 4, {}))
    renamed = await page_view(ledger, "exp-a", cache)
    assert (view.report["name"], view.recorded.counts["pending"]) == ("a", 1)
    assert (renamed.report["name"], renamed.recorded.counts["pending"]) == ("renamed", 2)


async def test_the_experiments_list_row_follows_every_write(ledger: Ledger) -> None:  # noqa: F811
    await ledger.upsert_experiment(ExperimentInfo("exp-a", "a", 2, {}))
    await ledger.upsert_records([make_record("t1")])
    cache = ReportCache()

    async def started_of(_exp: str) -> list[str]:
        return ["t1", "t2"]

    started = queries.Lookups(started_of=started_of)

    now = datetime(2026, 2, 1, tzinfo=UTC)  # a running experiment's duration runs to now
    row = await queries.experiment_progress(ledger, "exp-a", started, cache=cache, now=now)
    assert (row.progress.done, row.progress.running) == (1, 1)
    assert await queries.experiment_progress(ledger, "exp-a", started, cache=cache, now=now) == row
    await ledger.upsert_records([make_record("t2")])
    done = await queries.experiment_progress(ledger, "exp-a", started, cache=cache, now=now)
    assert (done.progress.done, done.progress.running, done.progress.state) == (2, 0, "complete")
    assert done == await queries.experiment_progress(ledger, "exp-a", started, now=now)
    assert cache.stats().hits == 1


async def test_negative_control_a_version_that_does_not_move_serves_a_stale_report(
    ledger: Ledger,  # noqa: F811
) -> None:
    pinned = cast(Ledger, PinnedVersion(ledger))
    await ledger.upsert_records([make_record("t1")])
    cache = ReportCache()
    assert (await queries.experiment_report(pinned, "exp-a", cache=cache))["status"][
        "recorded"
    ] == 1
    await ledger.upsert_records([make_record("t2")])
    stale = await queries.experiment_report(pinned, "exp-a", cache=cache)
    assert stale["status"]["recorded"] == 1  # what the tests above rule out


# -- MongoLedger only ----------------------------------------------------------------


async def test_mongo_nothing_is_kept_while_a_write_batch_is_in_flight(
    ledger_url: str, ledger_db: str
) -> None:
    async with ledger_and_documents(ledger_url, ledger_db) as (mongo, db):
        await mongo.upsert_records([make_record("t1")])
        settled = await mongo.experiment_version("exp-a")
        assert settled is not None  # negative control for the None below
        # The records are written, the batch's mark is still on: a live writer.
        await write_then_die(mongo, [make_record("t2")])
        assert await mongo.experiment_version("exp-a") is None
        cache = ReportCache()
        for _ in range(2):
            report = await queries.experiment_report(mongo, "exp-a", cache=cache)
            assert report["status"]["recorded"] == 2
        assert cache.stats().entries == 0 and cache.stats().uncached == 2

        # A mark older than STALE_PENDING is a dead writer: its records are settled.
        await age_pending_marks(db, "exp-a")
        assert await mongo.experiment_version("exp-a") not in (None, settled)


async def test_mongo_an_experiment_written_again_never_repeats_a_version(
    ledger_url: str, ledger_db: str
) -> None:
    async with ledger_and_documents(ledger_url, ledger_db) as (mongo, db):
        await mongo.upsert_records([make_record("t1", reward=1.0)])
        before = await mongo.experiment_version("exp-a")
        cache = ReportCache()
        assert (await queries.experiment_report(mongo, "exp-a", cache=cache))["leaderboard"][0][
            "mean_reward"
        ] == 1.0
        # Deleted, then the same sequence of writes with other content: the counter
        # part of the token is the same again, the document's id is not.
        await db["trials"].delete_many({})
        await db["experiments"].delete_many({})
        await mongo.upsert_records([make_record("t1", reward=0.0)])
        after = await mongo.experiment_version("exp-a")
        assert before is not None and after is not None
        assert before.split(".")[1] == after.split(".")[1] and before != after
        report = await queries.experiment_report(mongo, "exp-a", cache=cache)
        assert report["leaderboard"][0]["mean_reward"] == 0.0
