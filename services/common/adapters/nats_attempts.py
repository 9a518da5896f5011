"""A run's attempt counter in the control bucket: key ``runs.<run_id>``.

The value is the number of counted starts, ``b"N"``, as it always was; once a start
has been handed back (preempted, or a runner's stop notice: docs/scheduling.md) it is
``b"N H"``: N counted starts and H starts taken back. Both numbers live in one key so
that counting a start and taking it back are each one compare-and-set: two runners
racing on the same run never count a start twice nor lose a take-back. Most runs are
never handed back: their value, and the one write of a first start, are unchanged.
"""

from __future__ import annotations

import contextlib

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from services.common.ports import AttemptStart


def parse(value: bytes | None) -> tuple[int, int]:
    """(counted starts, starts taken back) of a stored value (None: no start yet)."""
    if not value:
        return 0, 0
    parts = value.split()
    return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0


def encode(counted: int, taken_back: int) -> bytes:
    """The stored value; the old one-number form while nothing was taken back."""
    return f"{counted} {taken_back}".encode() if taken_back else str(counted).encode()


async def begin(control: KeyValue, key: str) -> AttemptStart:
    """Count one more start at ``key``."""
    # Most starts are first attempts: one conditional write, no read before it.
    with contextlib.suppress(KeyWrongLastSequenceError):
        await control.update(key, b"1", last=0)
        return AttemptStart(1, 0)
    while True:
        try:
            entry = await control.get(key)
        except KeyNotFoundError:
            try:
                await control.create(key, b"1")
                return AttemptStart(1, 0)
            except KeyWrongLastSequenceError:
                continue  # another runner raced us; read again
        assert entry.revision is not None
        counted, taken_back = parse(entry.value)
        try:
            await control.update(key, encode(counted + 1, taken_back), last=entry.revision)
            return AttemptStart(counted + 1, taken_back)
        except KeyWrongLastSequenceError:
            continue


async def take_back(control: KeyValue, key: str) -> int:
    """Uncount the last start at ``key``; the starts taken back so far."""
    while True:
        try:
            entry = await control.get(key)
        except KeyNotFoundError:
            counted, taken_back, revision = 0, 0, 0
        else:
            assert entry.revision is not None
            counted, taken_back = parse(entry.value)
            revision = entry.revision
        try:
            await control.update(key, encode(max(0, counted - 1), taken_back + 1), last=revision)
            return taken_back + 1
        except KeyWrongLastSequenceError:
            continue  # another runner counted or took back meanwhile: read again
