"""Computed report values kept in the ledger (services/reports/stored.py), against
every Ledger adapter (the fake and SecantusDB).

A new process (a fresh adapter, no ReportCache: the one-shot CLI; or a fresh cache:
the API after a restart) finds the value computed earlier and reads no record. A
write to the experiment changes its content version, so the next read computes
again and shows the write; a ledger whose version does not move is the negative
control (the kept value is then served stale). Old versions do not pile up, and a
failed, refused or damaged keep never costs the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest

from benchmarks.wrapped_ledger import WrappedLedger, counting_reads
from services.common.errors import LedgerUnavailable
from services.common.ports import MAX_DERIVED_BYTES, ExperimentInfo, Ledger
from services.reports import queries, stored
from services.reports.report_cache import ReportCache
from services.submitter.dashboard_stream import page_view
from tests.integration.test_ledger_contract import (  # noqa: F401 (fixtures)
    ledger,
    ledger_factory,
    make_record,
)
from tests.integration.test_report_cache_contract import PinnedVersion
from tests.support.ledger_documents import ledger_and_documents

pytestmark = pytest.mark.integration


class Refusing(WrappedLedger):
    """A ledger whose derived reads and writes fail (an outage, a read-only user)."""

    async def stored_derived(self, *_args: object) -> bytes | None:
        """Fails."""
        raise LedgerUnavailable("ledger unreachable during stored_derived: test")

    async def keep_derived(self, *_args: object) -> None:
        """Fails."""
        raise LedgerUnavailable("ledger unreachable during keep_derived: test")


async def _seed(into: Ledger) -> None:
    await into.upsert_experiment(ExperimentInfo("exp-a", "a", 4, {"agents": [{"name": "oracle"}]}))
    await into.upsert_records([make_record("t1", reward=1.0), make_record("t2", reward=0.0)])


async def test_a_new_process_reads_the_kept_value_and_no_record(
    ledger_factory: Callable[[], Ledger],  # noqa: F811
) -> None:
    first = ledger_factory()
    await first.ensure_indexes()
    await _seed(first)
    # Negative control: nothing kept yet, so the first read reads the records.
    reader, count = counting_reads(first)
    report = await queries.experiment_report(reader, "exp-a")
    _, board = await queries.experiment_leaderboard(reader, "exp-a")
    view = await page_view(reader, "exp-a", None)
    assert count.record_reads == 3

    # A new process: another adapter (connection), no cache, then a fresh cache.
    for cache in (None, ReportCache()):
        again, count = counting_reads(ledger_factory())
        assert await queries.experiment_report(again, "exp-a", cache=cache) == report
        assert (await queries.experiment_leaderboard(again, "exp-a", cache=cache))[1] == board
        assert await page_view(again, "exp-a", cache) == view
        assert count.record_reads == 0
    # What was kept is what computing shows (one read path).
    assert report == queries.report_value("exp-a", *(await _info_records(first)))
    assert report["status"]["recorded"] == 2 and board[0]["mean_reward"] == 0.5


async def _info_records(of: Ledger) -> tuple[ExperimentInfo | None, list[Any]]:
    return await of.get_experiment("exp-a"), await of.records_for("exp-a")


async def test_a_write_makes_the_next_read_compute_again(ledger: Ledger) -> None:  # noqa: F811
    await _seed(ledger)
    await queries.experiment_report(ledger, "exp-a")  # computed and kept
    await ledger.upsert_records([make_record("t3", reward=1.0)])
    reader, count = counting_reads(ledger)
    after = await queries.experiment_report(reader, "exp-a")
    assert count.record_reads == 1 and after["status"]["recorded"] == 3
    await ledger.upsert_experiment(ExperimentInfo("exp-a", "renamed", 4, {}))  # metadata
    renamed = await page_view(reader, "exp-a", ReportCache())
    assert renamed.report["name"] == "renamed" and count.record_reads == 2
    # And kept again: the next new reader reads no record.
    fresh, count = counting_reads(ledger)
    assert (await page_view(fresh, "exp-a", None)).report["name"] == "renamed"
    assert count.record_reads == 0


async def test_negative_control_a_pinned_version_serves_the_kept_value_stale(
    ledger: Ledger,  # noqa: F811
) -> None:
    pinned = cast(Ledger, PinnedVersion(ledger))
    await _seed(ledger)
    assert (await queries.experiment_report(pinned, "exp-a"))["status"]["recorded"] == 2
    await ledger.upsert_records([make_record("t3", reward=1.0)])
    stale = await queries.experiment_report(pinned, "exp-a")
    assert stale["status"]["recorded"] == 2  # what the version in the key rules out


async def test_one_value_per_experiment_and_kind(ledger: Ledger) -> None:  # noqa: F811
    await _seed(ledger)
    old = await ledger.experiment_version("exp-a")
    assert old is not None
    await queries.experiment_report(ledger, "exp-a")
    assert await ledger.stored_derived("exp-a", "report", stored.token(old)) is not None
    await ledger.upsert_records([make_record("t3")])
    new = await ledger.experiment_version("exp-a")
    assert new is not None and new != old
    await queries.experiment_report(ledger, "exp-a")
    # The old version's value is gone, replaced by the new one's: bounded.
    assert await ledger.stored_derived("exp-a", "report", stored.token(old)) is None
    assert await ledger.stored_derived("exp-a", "report", stored.token(new)) is not None
    # Other kinds and experiments are their own keys.
    assert await ledger.stored_derived("exp-a", "leaderboard", stored.token(new)) is None
    assert await ledger.stored_derived("exp-b", "report", stored.token(new)) is None


async def test_a_failing_or_damaged_store_never_costs_the_answer(
    ledger: Ledger,  # noqa: F811
) -> None:
    await _seed(ledger)
    expected = queries.report_value("exp-a", *(await _info_records(ledger)))
    refusing = cast(Ledger, Refusing(ledger))
    assert await queries.experiment_report(refusing, "exp-a") == expected
    assert await page_view(refusing, "exp-a", ReportCache()) is not None

    version = await ledger.experiment_version("exp-a")
    assert version is not None
    await ledger.keep_derived("exp-a", "report", stored.token(version), b"not zlib")
    reader, count = counting_reads(ledger)
    assert await queries.experiment_report(reader, "exp-a") == expected
    assert count.record_reads == 1  # damaged: computed again, never served
    # ... and kept again, decodable this time.
    blob = await ledger.stored_derived("exp-a", "report", stored.token(version))
    assert blob is not None and stored.decode(blob, stored.REPORT_CODEC) == expected


async def test_a_value_over_the_limit_is_refused_and_not_kept(
    ledger: Ledger,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await _seed(ledger)
    with pytest.raises(ValueError, match="over"):
        await ledger.keep_derived("exp-a", "report", "v", b"x" * (MAX_DERIVED_BYTES + 1))
    monkeypatch.setattr(stored, "MAX_DERIVED_BYTES", 16)  # every value is "too large"
    report = await queries.experiment_report(ledger, "exp-a")
    version = await ledger.experiment_version("exp-a")
    assert version is not None and report["status"]["recorded"] == 2
    assert await ledger.stored_derived("exp-a", "report", stored.token(version)) is None
    monkeypatch.undo()  # control: the same read keeps it under the real limit
    await queries.experiment_report(ledger, "exp-a")
    assert await ledger.stored_derived("exp-a", "report", stored.token(version)) is not None


# -- MongoLedger only ----------------------------------------------------------------


async def test_mongo_the_derived_collection_holds_one_document_per_kind(
    ledger_url: str, ledger_db: str
) -> None:
    async with ledger_and_documents(ledger_url, ledger_db) as (mongo, db):
        for n in range(3):  # three versions of each kind
            await mongo.upsert_records([make_record(f"t{n}")])
            await queries.experiment_report(mongo, "exp-a")
            await queries.experiment_leaderboard(mongo, "exp-a")
        docs = await db["derived"].find({}, {"blob": 0}).to_list()
        assert sorted(d["_id"]["kind"] for d in docs) == ["leaderboard", "report"]
        version = await mongo.experiment_version("exp-a")
        assert version is not None
        assert {d["version"] for d in docs} == {stored.token(version)}
