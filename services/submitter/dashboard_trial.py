"""The trial page's phase timeline and its stored folder: listing and downloads.

Pure parts: ``timeline`` (a record's PhaseTiming as a server-rendered SVG Gantt bar,
styled by dashboard.css: the CSP allows no inline style) and the archive's reading
(``archive_files``, ``archive_member``: a stored trial folder is a .tar.gz, read in
memory within byte budgets, regular files only). ``download_name`` and
``attachment`` make a file name safe for a Content-Disposition header.

Phases are Harbor's: environment setup, agent setup, agent run, verifier. Each bar
starts where Harbor says the phase started (``PhaseTiming.phase_offsets_s``); a record
written before that field has durations only, and its phases are then drawn one after
the other from the trial's start, which the figure says (``approximate``).
"""

from __future__ import annotations

import io
import re
import tarfile
from dataclasses import dataclass
from typing import Final

from markupsafe import Markup, escape

from schemas.record import PhaseTiming
from services.reports.progress import duration

PHASES: Final = (
    ("environment_setup", "environment setup", "environment_setup_s"),
    ("agent_setup", "agent setup", "agent_setup_s"),
    ("agent_execution", "agent run", "agent_execution_s"),
    ("verifier", "verifier", "verifier_s"),
)
"""Harbor's phases: (key of phase_offsets_s, the page's words, PhaseTiming field)."""
WIDTH: Final = 600
_LABEL_W, _ROW_H, _BAR_H = 130, 18, 12

MiB: Final = 1024 * 1024
DOWNLOAD_MAX_BYTES: Final = 256 * MiB
"""Largest stored archive served (a trial folder is capped at 32 MiB by default)."""
LIST_MAX_BYTES: Final = 16 * MiB
"""Archives up to this size are opened to list their files on the trial page."""
FILE_MAX_BYTES: Final = 64 * MiB
"""Largest single file served out of an archive (its unpacked size)."""
READ_BUDGET_BYTES: Final = 512 * MiB
"""Unpacked bytes read from one archive at most (a gzip bomb stops here)."""
FILES_LISTED_MAX: Final = 2000


@dataclass(frozen=True, slots=True)
class PhaseBar:
    """One phase on the timeline: where it starts and how long it ran (seconds)."""

    key: str
    label: str
    start_s: float
    seconds: float


def phase_bars(timing: PhaseTiming) -> tuple[list[PhaseBar], bool]:
    """The phases that ran, in Harbor's order, and whether their starts are inferred
    (True: the record has durations only; phases drawn back to back)."""
    bars: list[PhaseBar] = []
    approximate = False
    cursor = 0.0
    for key, label, field in PHASES:
        seconds = getattr(timing, field)
        if seconds is None:
            continue
        start = timing.phase_offsets_s.get(key)
        if start is None:
            start, approximate = cursor, True
        bars.append(PhaseBar(key, label, max(0.0, start), max(0.0, seconds)))
        cursor = max(cursor, start + seconds)
    return bars, approximate


def timeline(timing: PhaseTiming) -> dict[str, object] | None:
    """The trial page's timeline: an SVG (one row per phase on one time axis from
    the trial's start to its end), its rows as text, and whether starts are inferred.
    None when the record has no phase times (the trial never ran a phase)."""
    bars, approximate = phase_bars(timing)
    if not bars:
        return None
    span = max([timing.total_s or 0.0, *(b.start_s + b.seconds for b in bars)]) or 1.0
    scale = (WIDTH - _LABEL_W - 10) / span
    rows = []
    for i, b in enumerate(bars):
        y = i * _ROW_H
        x, w = _LABEL_W + b.start_s * scale, max(1.0, b.seconds * scale)
        words = f"{b.label}: {_seconds(b.seconds)}, from +{b.start_s:.1f} s"
        rows.append(
            f'<g class="phase {b.key}"><title>{escape(words)}</title>'
            f'<text x="0" y="{y + _BAR_H - 2}">{escape(b.label)}</text>'
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{_BAR_H}"/></g>'
        )
    height = len(bars) * _ROW_H + 14
    axis_y = len(bars) * _ROW_H + 2
    total = f"total {_seconds(span)}"
    label = (
        "; ".join(f"{b.label} {b.seconds:.1f} s from +{b.start_s:.1f} s" for b in bars)
        + f"; {total}"
    )
    svg = Markup(
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="{escape(label)}"><title>{escape(label)}</title>{"".join(rows)}'
        f'<line class="axis" x1="{_LABEL_W}" x2="{WIDTH - 10}" y1="{axis_y}" y2="{axis_y}"/>'
        f'<text class="tick" x="{_LABEL_W}" y="{height - 1}">0 s</text>'
        f'<text class="tick end" x="{WIDTH - 10}" y="{height - 1}">{span:.1f} s</text></svg>'
    )
    table = [
        {
            "phase": b.label,
            "key": b.key,
            "start": f"+{b.start_s:.1f} s",
            "seconds": f"{b.seconds:.1f} s",
            "share": f"{100 * b.seconds / span:.0f}%",
        }
        for b in bars
    ]
    return {"svg": svg, "rows": table, "total": total, "approximate": approximate}


def _seconds(seconds: float) -> str:
    """``4m 05s (245.3 s)`` from a minute on; under it the seconds alone (``20.0 s``),
    where the rounded form would only repeat them (``20s (20.0 s)``, ``0s (0.2 s)``)."""
    return f"{duration(seconds)} ({seconds:.1f} s)" if seconds >= 60 else f"{seconds:.1f} s"


# -- the stored folder ------------------------------------------------------------------


class ArchiveUnreadable(ValueError):
    """The stored archive is not a readable .tar.gz, or exceeds a read budget."""


@dataclass(frozen=True, slots=True)
class ArchivedFile:
    """A regular file in a trial's archive."""

    path: str
    size: int


def _members(data: bytes) -> tarfile.TarFile:
    try:
        # Streaming mode: members are read in order, nothing seeks back or is extracted.
        return tarfile.open(fileobj=io.BytesIO(data), mode="r|gz")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArchiveUnreadable(f"not a readable .tar.gz: {exc}") from None


def archive_files(data: bytes) -> tuple[list[ArchivedFile], bool]:
    """The archive's regular files in archive order (at most ``FILES_LISTED_MAX``),
    and whether some were left out of the list. Raises ArchiveUnreadable."""
    files: list[ArchivedFile] = []
    unpacked = 0
    try:
        with _members(data) as tar:
            for member in tar:
                unpacked += member.size
                if unpacked > READ_BUDGET_BYTES:
                    raise ArchiveUnreadable(f"unpacks to more than {READ_BUDGET_BYTES} bytes")
                if not member.isreg():
                    continue
                if len(files) == FILES_LISTED_MAX:
                    return files, True
                files.append(ArchivedFile(member.name.removeprefix("./"), member.size))
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArchiveUnreadable(f"not a readable .tar.gz: {exc}") from None
    return files, False


def archive_member(data: bytes, path: str) -> bytes | None:
    """The bytes of the regular file ``path`` in the archive; None when there is none.
    Raises ArchiveUnreadable, or FileTooLarge past ``FILE_MAX_BYTES``."""
    unpacked = 0
    try:
        with _members(data) as tar:
            for member in tar:
                if member.isreg() and member.name.removeprefix("./") == path:
                    if member.size > FILE_MAX_BYTES:
                        raise FileTooLarge(
                            f"{path} is {member.size} bytes, over the {FILE_MAX_BYTES}-byte "
                            "limit for one file: download the whole archive"
                        )
                    body = tar.extractfile(member)
                    return body.read() if body is not None else None
                unpacked += member.size
                if unpacked > READ_BUDGET_BYTES:
                    raise ArchiveUnreadable(f"unpacks to more than {READ_BUDGET_BYTES} bytes")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArchiveUnreadable(f"not a readable .tar.gz: {exc}") from None
    return None


class FileTooLarge(ValueError):
    """A file (or archive) past its download limit."""


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def download_name(name: str, fallback: str = "download") -> str:
    """``name`` as a safe file name: its last path part, letters, digits, ``.``, ``_``
    and ``-`` only (others become ``_``), no leading dot, at most 120 characters."""
    base = _UNSAFE.sub("_", name.rsplit("/", 1)[-1]).lstrip(".")[:120]
    return base or fallback


def attachment(name: str) -> str:
    """A Content-Disposition header that saves the body as ``download_name(name)``
    (never shown inline: a stored HTML file is not run on this origin)."""
    return f'attachment; filename="{download_name(name)}"'
