"""What the read paths compute from an experiment's records, kept per content version.

Building a report means reading every record of the experiment (seconds at 10,000
trials on the embedded ledger, docs/performance.md) and computing the leaderboard,
the task x agent matrix and the rest from them. ``ReportCache`` keeps the *computed*
values (never the records), keyed by (kind, experiment id, ``Ledger.experiment_version``):
the ledger changes that token with every write that changes a record or the
experiment's metadata, so an entry can only be found while what it was computed from
is still what the ledger holds. A stale entry is never evicted for being stale: it is
simply never asked for again, and the LRU drops it.

- Bounded by an estimate of the bytes its values hold (``deep_size``), least recently
  used first; a value larger than the whole budget is returned but not kept.
- One build per key at a time: requests arriving while a value is being computed
  wait for that computation (a page and its live feed opened together read once).
- With no token (a write batch in progress, an experiment the ledger does not know)
  the value is computed and not kept.

``services.reports.queries.derived`` is the one way in: it reads the token before
the records, which is what makes an entry never older than its key.
"""

from __future__ import annotations

import asyncio
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Final

from pydantic import BaseModel

CacheKey = tuple[str, str, str]
"""(kind, experiment id, content version)."""

DEFAULT_MAX_BYTES: Final = 256 * 2**20


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters of a ReportCache (tests and the benchmark read them)."""

    hits: int
    misses: int
    uncached: int
    evictions: int
    entries: int
    bytes: int


class ReportCache:
    """A size-bounded LRU of computed report values (see the module docstring)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[CacheKey, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._building: dict[CacheKey, asyncio.Task[Any]] = {}
        self._hits = self._misses = self._uncached = self._evictions = 0

    def peek(self, key: CacheKey) -> Any | None:
        """The value kept under ``key`` (marked recently used), or None."""
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        self._hits += 1
        return found[0]

    def put(self, key: CacheKey, value: Any, size: int | None = None) -> None:
        """Keep ``value`` under ``key``, evicting the least recently used to fit."""
        nbytes = deep_size(value) if size is None else size
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        if nbytes > self.max_bytes:
            return
        self._entries[key] = (value, nbytes)
        self._bytes += nbytes
        while self._bytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self._bytes -= dropped
            self._evictions += 1

    async def get_or_build(
        self, key: CacheKey | None, build: Callable[[], Awaitable[tuple[Any, int]]]
    ) -> Any:
        """The value under ``key``, else ``build()``'s (value, size), kept under it.

        ``key`` None: built and not kept. Concurrent callers of one key share one
        build; a caller that goes away does not cancel it for the others.
        """
        if key is None:
            self._uncached += 1
            value, _ = await build()
            return value
        found = self.peek(key)
        if found is not None:
            return found
        task = self._building.get(key)
        if task is None:
            self._misses += 1
            task = asyncio.create_task(self._build(key, build))
            self._building[key] = task
            task.add_done_callback(lambda t: self._built(key, t))
        else:
            self._hits += 1
        return await asyncio.shield(task)

    def _built(self, key: CacheKey, task: asyncio.Task[Any]) -> None:
        self._building.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have gone away

    async def _build(self, key: CacheKey, build: Callable[[], Awaitable[tuple[Any, int]]]) -> Any:
        value, size = await build()
        self.put(key, value, size)
        return value

    def stats(self) -> CacheStats:
        """Counters so far and what is held now."""
        return CacheStats(
            self._hits,
            self._misses,
            self._uncached,
            self._evictions,
            len(self._entries),
            self._bytes,
        )


def deep_size(value: Any) -> int:
    """Bytes ``value`` holds, approximately: ``sys.getsizeof`` over the containers,
    dataclasses and pydantic models it reaches, each object counted once."""
    seen: set[int] = set()
    stack = [value]
    total = 0
    sizeof = sys.getsizeof
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sizeof(obj)
        kind = type(obj)
        if kind is dict:
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif kind in _SEQUENCES:
            stack.extend(obj)
        elif kind in _ATOMS:
            continue
        elif isinstance(obj, BaseModel):
            stack.append(obj.__dict__)
        elif is_dataclass(obj) and not isinstance(obj, type):
            stack.extend(getattr(obj, name) for name in _field_names(kind))
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
    return total


_SEQUENCES: Final = frozenset({list, tuple, set, frozenset})
_ATOMS: Final = frozenset({str, int, float, bool, type(None), bytes})


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(kind: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(kind)
    if names is None:
        names = _FIELD_NAMES[kind] = tuple(f.name for f in fields(kind))
    return names
