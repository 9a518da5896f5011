"""The trial page's archive listing cache (dashboard_artifacts.ListingCache): kept by
digest, bounded by the files it holds, least recently used out first. Controls: an
unknown digest is a miss; a listing used again survives where an older one goes."""

from __future__ import annotations

from services.submitter.dashboard_artifacts import ListingCache
from services.submitter.dashboard_trial import ArchivedFile


def _listing(n: int) -> tuple[list[ArchivedFile], bool]:
    return [ArchivedFile(f"f{i}", i) for i in range(n)], False


def test_kept_by_digest_and_bounded_least_recent_first() -> None:
    cache = ListingCache(max_files=12)  # each listing below weighs 4 + 1
    cache.put("a" * 64, _listing(4))
    cache.put("b" * 64, _listing(4))
    assert cache.get("a" * 64) == _listing(4) and cache.get("c" * 64) is None
    assert (cache.hits, cache.misses) == (1, 1)
    cache.put("c" * 64, _listing(4))  # 15 > 12: the least recently used (b) goes
    assert len(cache) == 2
    assert cache.get("b" * 64) is None
    assert cache.get("a" * 64) is not None and cache.get("c" * 64) is not None


def test_one_listing_larger_than_the_bound_is_still_kept_alone() -> None:
    cache = ListingCache(max_files=3)
    cache.put("a" * 64, _listing(2))
    cache.put("b" * 64, _listing(10))
    assert len(cache) == 1 and cache.get("b" * 64) is not None
