"""Computed report values kept in the ledger, so a new process reads one document.

The submitter's ``ReportCache`` keeps what it computes in memory; a new process (the
API after a restart, every one-shot CLI ``leaderboard`` / ``report``) would still
read every record of the experiment: seconds at 10,000 trials (docs/performance.md).
``queries.derived`` therefore also keeps each computed value in the ledger
(``Ledger.keep_derived``) and looks there before reading the records
(``Ledger.stored_derived``), under a token made of

- the experiment's content version (``Ledger.experiment_version``): a value kept
  before a write is never found after it, whatever process asks;
- ``FORMAT`` and a fingerprint of the code that builds and encodes the values (the
  sources of services/reports, the dashboard's views and schemas): an upgraded
  trialbus never decodes a value of another shape or computed by other rules.

Values are encoded by the kind's ``Codec`` to JSON, then zlib-compressed: a
10,000-trial report is ~0.8 MB of JSON, a page view with every trial row ~2 MB
(tens to hundreds of KiB compressed; 100,000 trials: ~12 MB of JSON).
Keeping is best effort: a value larger than ``MAX_DERIVED_BYTES`` once compressed,
a value that does not encode, a failed write or one slower than ``KEEP_TIMEOUT_S``
is logged and skipped, and the answer is returned all the same; so is a kept value
that does not decode (it is computed again). No pickle: the ledger is shared with
other processes, and a kept value must never be code.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from schemas.record import TrialRecord
from services.common.logging import get_logger
from services.common.ports import MAX_DERIVED_BYTES, ExperimentInfo, Ledger
from services.reports.progress import Recorded
from services.reports.report_cache import deep_size

log = get_logger(__name__)

KEEP_TIMEOUT_S: Final = 5.0
"""Longest a keep may delay its answer; past it the value is not kept (logged)."""
FORMAT: Final = 1
"""Of the stored blob (JSON, zlib); part of every token."""
_ROOT = Path(__file__).resolve().parents[2]
_BUILDERS: Final = (
    ("services/reports", "*.py"),
    ("services/submitter", "dashboard_*.py"),
    ("schemas", "*.py"),
)
"""What decides a kept value's content and shape (fingerprinted, see the module doc)."""


@dataclass(frozen=True, slots=True)
class Codec[T]:
    """How a derived value of one kind is kept: to a JSON-able value, and back.

    ``decode(encode(v)) == v`` must hold, so a value read from the ledger shows what
    computing it would (tests/unit/test_stored_values.py checks each kind's).
    """

    encode: Callable[[T], Any]
    decode: Callable[[Any], T]


def _same(value: Any) -> Any:
    return value


REPORT_CODEC: Final[Codec[dict[str, Any]]] = Codec(_same, _same)
"""The report is JSON already (``build_report``: what ``report --json`` prints)."""
ROWS_CODEC: Final[Codec[list[dict[str, Any]]]] = Codec(_same, _same)
"""Rows that are JSON already (``leaderboard --json``, ``trials --json``)."""


@functools.cache
def fingerprint() -> str:
    """sha256 (16 hex digits) of the sources that build and encode kept values."""
    digest = hashlib.sha256()
    for folder, pattern in _BUILDERS:
        for path in sorted((_ROOT / folder).glob(pattern)):
            digest.update(f"{folder}/{path.name}".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def token(version: str) -> str:
    """What a value of content ``version`` is kept under (see the module doc)."""
    return f"{version}/{FORMAT}.{fingerprint()}"


def encode[T](value: T, codec: Codec[T]) -> bytes:
    """``value`` as stored: the codec's JSON, compressed."""
    text = json.dumps(codec.encode(value), separators=(",", ":"), ensure_ascii=False)
    return zlib.compress(text.encode(), 6)


def decode[T](blob: bytes, codec: Codec[T]) -> T:
    """The value ``encode`` made ``blob`` of."""
    return _decode_sized(blob, codec)[0]


BYTES_PER_JSON_BYTE: Final = 5
"""Memory held by a decoded value per byte of its JSON: 3.7-4.9 measured (``deep_size``)
for each kind at 10,000 trials (2026-11-26), rounded up."""


def _decode_sized[T](blob: bytes, codec: Codec[T]) -> tuple[T, int]:
    text = zlib.decompress(blob)
    return codec.decode(json.loads(text)), BYTES_PER_JSON_BYTE * len(text)


def built[T](
    build: Callable[[str, ExperimentInfo | None, list[TrialRecord]], T],
    experiment_id: str,
    info: ExperimentInfo | None,
    records: list[TrialRecord],
    sized: bool,
    codec: Codec[T] | None,
    kind: str,
) -> tuple[T, int, bytes | None]:
    """``build``'s value, its size when ``sized``, and with ``codec`` its packed form
    (``queries.derived`` runs this in a thread): a packed value is sized from its JSON
    (``packed``), cheaper than ``deep_size``."""
    value = build(experiment_id, info, records)
    done = packed(value, codec, kind, experiment_id) if codec is not None else None
    if done is not None:
        return value, done[1], done[0]
    return value, deep_size(value) if sized else 0, None


def _warn(event: str, kind: str, experiment_id: str, error: str) -> None:
    # One shape for every best-effort step that failed: the caller computes or answers anyway.
    log.warning(event, kind=kind, experiment_id=experiment_id, error=error)


async def load[T](
    ledger: Ledger, experiment_id: str, kind: str, version: str, codec: Codec[T]
) -> tuple[T, int] | None:
    """(the value kept for (experiment, kind) at content ``version``, an estimate of
    the bytes it holds in memory), or None: none kept, or it could not be read or
    decoded (then the caller computes it).

    The estimate is ``BYTES_PER_JSON_BYTE`` times its JSON's length: walking a
    10,000-trial page view with ``deep_size`` costs more than decoding it."""
    try:
        blob = await ledger.stored_derived(experiment_id, kind, token(version))
    except Exception as exc:  # noqa: BLE001 - best effort: the records' read reports an outage
        _warn("stored report value unreadable", kind, experiment_id, type(exc).__name__)
        return None
    if blob is None:
        return None
    try:
        return await asyncio.to_thread(_decode_sized, blob, codec)
    except Exception as exc:  # noqa: BLE001 - damaged or foreign: computed again, never served
        _warn("stored report value undecodable", kind, experiment_id, type(exc).__name__)
        return None


def packed[T](value: T, codec: Codec[T], kind: str, experiment_id: str) -> tuple[bytes, int] | None:
    """(``encode(value)``, an estimate of the bytes ``value`` holds: as ``load``'s), or
    None when it does not encode (logged; the value is then not kept). Run it in the
    thread that built the value: it costs CPU time, less than ``deep_size``."""
    try:
        text = json.dumps(codec.encode(value), separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:  # not JSON (a manifest with odd values)
        _warn("report value not kept: does not encode", kind, experiment_id, str(exc)[:200])
        return None
    raw = text.encode()
    return zlib.compress(raw, 6), BYTES_PER_JSON_BYTE * len(raw)


async def keep(ledger: Ledger, experiment_id: str, kind: str, version: str, blob: bytes) -> bool:
    """Keep ``blob`` (``packed``'s) for (experiment, kind) at content ``version``;
    whether it was. Never raises: the caller has its answer already and returns it
    either way.
    """
    if len(blob) > MAX_DERIVED_BYTES:
        log.info(
            "report value not kept: too large",
            kind=kind,
            experiment_id=experiment_id,
            bytes=len(blob),
            limit=MAX_DERIVED_BYTES,
        )
        return False
    try:
        # Bounded: the answer is computed already and must not wait on a slow ledger.
        await asyncio.wait_for(
            ledger.keep_derived(experiment_id, kind, token(version), blob), KEEP_TIMEOUT_S
        )
    except Exception as exc:  # noqa: BLE001 - best effort: a read-only ledger user, an outage
        _warn("report value not kept: ledger write failed", kind, experiment_id, type(exc).__name__)
        return False
    return True


def info_to_json(info: ExperimentInfo | None) -> dict[str, Any] | None:
    """``ExperimentInfo`` as JSON (a kept value's part; ``info_of_json`` reads it)."""
    if info is None:
        return None
    return {"id": info.experiment_id, "name": info.name, "n": info.n_trials, "m": info.manifest}


def info_of_json(data: dict[str, Any] | None) -> ExperimentInfo | None:
    """The ``ExperimentInfo`` of ``info_to_json``."""
    if data is None:
        return None
    return ExperimentInfo(data["id"], data["name"], data["n"], data["m"])


def recorded_to_json(recorded: Recorded) -> dict[str, Any]:
    """``Recorded`` as JSON (a kept value's part; ``recorded_of_json`` reads it)."""
    return {
        "counts": recorded.counts,
        "ids": sorted(recorded.trial_ids),
        "first": _iso(recorded.first_start),
        "last": _iso(recorded.last_end),
    }


def recorded_of_json(data: dict[str, Any]) -> Recorded:
    """The ``Recorded`` of ``recorded_to_json``."""
    return Recorded(
        counts=data["counts"],
        trial_ids=frozenset(data["ids"]),
        first_start=_datetime(data["first"]),
        last_end=_datetime(data["last"]),
    )


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def _datetime(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text is not None else None


PROGRESS_CODEC: Codec[tuple[ExperimentInfo | None, Recorded]] = Codec(
    lambda v: [info_to_json(v[0]), recorded_to_json(v[1])],
    lambda d: (info_of_json(d[0]), recorded_of_json(d[1])),
)
"""How ``progress_basis`` is kept in the ledger (services/reports/stored.py)."""
