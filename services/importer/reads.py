"""Bounded, never-raising reads of the files in a Harbor trial folder.

A trial folder is written by an agent, a verifier and Harbor, any of which may be
broken or hostile: every read here is size-limited, refuses FIFOs and devices, and
turns every problem into one diagnostic line (naming the file) instead of raising.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

MAX_FILE_BYTES: Final = 16 * 1024 * 1024
"""Files larger than this are refused (with a diagnostic) instead of read."""


def read_text(path: Path, label: str, errors: list[str]) -> str | None:
    """The file's text, or None with a diagnostic (a missing file adds none)."""
    try:
        mode = path.stat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            # Opening a FIFO waits forever for a writer; a device never ends.
            errors.append(f"{label}: not a regular file (FIFO, device or socket); not read")
            return None
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            # Read at most one byte past the limit: the file may grow after fstat.
            raw = b"" if size > MAX_FILE_BYTES else fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        errors.append(f"{label}: unreadable: {exc.strerror or exc}")
        return None
    except ValueError as exc:
        # A path the OS cannot name (a NUL byte, from an event's trial_dir): the
        # system call refuses it before any file is looked for.
        errors.append(f"{label}: unreadable: invalid path ({exc})")
        return None
    if size > MAX_FILE_BYTES or len(raw) > MAX_FILE_BYTES:
        errors.append(
            f"{label}: {max(size, len(raw))} bytes exceeds the "
            f"{MAX_FILE_BYTES // (1024 * 1024)} MiB limit; not read"
        )
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        errors.append(f"{label}: not UTF-8 text (invalid byte at offset {exc.start})")
        return None


def parse_object(text: str, label: str, errors: list[str]) -> dict[str, Any] | None:
    """Parse a JSON object, or None with a diagnostic."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        errors.append(f"{label}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}")
        return None
    except RecursionError:
        errors.append(f"{label}: invalid JSON: nested too deeply")
        return None
    except ValueError as exc:  # an integer beyond Python's digit limit
        errors.append(f"{label}: invalid JSON: {str(exc).split(';')[0]}")
        return None
    if not isinstance(data, dict):
        errors.append(f"{label}: expected a JSON object, found {_json_type(data)}")
        return None
    return data


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "null" if value is None else type(value).__name__


def short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for quoting bad input in a diagnostic."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- small typed getters over Harbor's free-form dicts (config, step results) ----------


def get_path(data: Mapping[str, Any] | None, *keys: str) -> Any:
    """``data[k1][k2]...``, or None where a level is missing or not a mapping."""
    value: Any = data
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def nonempty_str(value: Any) -> str | None:
    """``value`` when it is a non-empty string, else None."""
    return value if isinstance(value, str) and value else None
