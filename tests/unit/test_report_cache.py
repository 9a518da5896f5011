"""ReportCache: bounded by size (least recently used out first), one build per key,
nothing kept without a key or after a failed build; and the experiment page built
from a cached PageView equals the page built from the records."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from schemas.events import TrialStarted
from services.common.adapters.memory import InMemoryLedger
from services.common.ports import ExperimentInfo
from services.reports.progress import recorded_of
from services.reports.report_cache import ReportCache, deep_size
from services.submitter import dashboard_views
from services.submitter.dashboard_stream import page_row, page_view, sections, view_sections
from services.submitter.dashboard_views import experiment_row
from tests.support.records import report_record, single_reward


def key(n: int) -> tuple[str, str, str]:
    return ("report", f"exp-{n}", "v1")


def test_least_recently_used_goes_first_when_the_budget_is_full() -> None:
    cache = ReportCache(max_bytes=300)
    for n in range(3):
        cache.put(key(n), f"value {n}", size=100)
    assert cache.peek(key(0)) == "value 0"  # used: now the most recent
    cache.put(key(3), "value 3", size=100)
    assert cache.peek(key(1)) is None  # the least recently used went
    assert [cache.peek(key(n)) for n in (0, 2, 3)] == ["value 0", "value 2", "value 3"]
    stats = cache.stats()
    assert (stats.entries, stats.bytes, stats.evictions) == (3, 300, 1)


def test_a_value_larger_than_the_budget_is_not_kept() -> None:
    cache = ReportCache(max_bytes=100)
    cache.put(key(0), "small", size=50)
    cache.put(key(1), "huge", size=101)
    assert cache.peek(key(1)) is None
    assert cache.peek(key(0)) == "small"  # control: it evicted nothing either


def test_deep_size_grows_with_the_value_and_counts_shared_objects_once() -> None:
    row = {"agent": "a" * 1000, "mean": 0.5}
    assert deep_size([row]) > 1000
    assert deep_size([row] * 50) < 2 * deep_size([row])  # the same row 50 times
    distinct = [{"agent": f"{i}" + "a" * 1000, "mean": 0.5} for i in range(50)]
    assert deep_size(distinct) > 50 * 1000


async def test_concurrent_requests_share_one_build() -> None:
    cache = ReportCache()
    release = asyncio.Event()
    builds = 0

    async def build() -> tuple[str, int]:
        nonlocal builds
        builds += 1
        await release.wait()
        return "report", 10

    waiting = [asyncio.create_task(cache.get_or_build(key(0), build)) for _ in range(3)]
    await asyncio.sleep(0)  # every request is waiting on the one build
    release.set()
    assert await asyncio.gather(*waiting) == ["report"] * 3
    assert builds == 1
    assert await cache.get_or_build(key(0), build) == "report" and builds == 1
    # Negative control: without a key (a write in flight) every request builds.
    assert await cache.get_or_build(None, build) == "report"
    assert builds == 2 and cache.stats().uncached == 1


async def test_a_failed_build_is_not_kept() -> None:
    cache = ReportCache()
    calls = 0

    async def build() -> tuple[str, int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("ledger went away")
        return "report", 10

    with pytest.raises(ConnectionError):
        await cache.get_or_build(key(0), build)
    assert await cache.get_or_build(key(0), build) == "report" and calls == 2


def started(trial_id: str) -> TrialStarted:
    return TrialStarted(
        experiment_id="exp",
        trial_id=trial_id,
        runner_id="r",
        host="host-1",
        attempt=1,
        occurred_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


@pytest.mark.parametrize(("page_rows", "page"), [(3, 1), (3, 2), (3, 4), (3, 99), (100, 1)])
async def test_the_page_from_a_cached_view_is_the_page_from_the_records(
    page_rows: int, page: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dashboard_views, "PAGE_ROWS", page_rows)
    records = [
        report_record(single_reward(float(i % 2)), task=f"t{i % 3}", agent=a)
        for i in range(4)
        for a in ("oracle", "nop")
    ]
    ledger = InMemoryLedger()
    await ledger.upsert_experiment(ExperimentInfo("exp", "page", 12, {}))
    await ledger.upsert_records(records)
    live = {"r1": started("r1"), "r2": started("r2"), records[0].trial_id: started("x")}

    view = await page_view(ledger, "exp", ReportCache())
    expected = await sections(ledger, "exp", records, live, page)
    assert view_sections("exp", view, live, page).html() == expected.html()
    pager = view_sections("exp", view, live, page).context["pager"]
    assert pager == expected.context["pager"]
    assert pager["total"] == 10 and pager["pages"] == -(-10 // page_rows)
    info = await ledger.get_experiment("exp")
    row, from_records = (
        page_row("exp", view, live),
        experiment_row("exp", info, recorded_of(records, info), live),
    )
    assert (row.progress, row.started, row.name) == (
        from_records.progress,
        from_records.started,
        from_records.name,
    )
    assert row.progress.running == 2  # r1, r2; the third started trial has its record
    # Negative control: another trial running changes both the same way.
    more = {**live, "r3": started("r3")}
    assert view_sections("exp", view, more, page).html() != expected.html()
    assert (
        view_sections("exp", view, more, page).html()
        == (await sections(ledger, "exp", records, more, page)).html()
    )
