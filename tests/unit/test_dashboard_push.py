"""The experiment page's live updates send what changed (dashboard_stream.Shown): every
section on a connection's first event, then only the sections whose HTML changed and,
while the matrix keeps its tasks and agents, only its changed cells, each the very
``<td>`` the whole matrix renders. Controls: nothing new sends nothing; a new task
sends the whole matrix; a changed reward sends its cell."""

from __future__ import annotations

from schemas.record import TrialRecord
from services.submitter.dashboard_stream import (
    PARTS,
    Sections,
    Shown,
    page_view_of,
    view_sections,
)
from tests.support.records import report_record, single_reward

BASE = [
    report_record(single_reward(1.0 if agent == "oracle" else 0.0), task=f"t{t}", agent=agent)
    for t in range(3)
    for agent in ("oracle", "nop")
]
"""oracle passes t0-t2, nop fails them (built once: the trials table shows their ids)."""
T1_NOP = {r: report_record(single_reward(r), task="t1", agent="nop") for r in (0.0, 1.0)}
T9 = report_record(single_reward(1.0), task="t9", agent="oracle")


def _records(reward_t1: float = 0.0, extra_task: bool = False) -> list[TrialRecord]:
    """BASE, nop's second attempt at t1 (``reward_t1``), and with ``extra_task`` t9."""
    return [*BASE, T1_NOP[reward_t1], *([T9] if extra_task else [])]


async def _parts(records: list[TrialRecord]) -> Sections:
    return view_sections("exp", page_view_of("exp", None, records), {})


async def test_first_event_sends_everything_then_nothing_when_nothing_changed() -> None:
    shown = Shown()
    parts = await _parts(_records())
    first = shown.changes(parts)
    assert set(first["sections"]) == set(PARTS) and first["cells"] == {}
    assert first["sections"] == parts.html()
    again = shown.changes(await _parts(_records()))
    assert again == {"sections": {}, "cells": {}}


async def test_a_changed_result_sends_its_cell_alone() -> None:
    shown = Shown()
    shown.changes(await _parts(_records(reward_t1=0.0)))
    after = await _parts(_records(reward_t1=1.0))
    update = shown.changes(after)
    assert "matrix" not in update["sections"]
    # t1 x nop went from 0 of 2 passed to 1 of 2 (nop stays second on the board):
    # row 1 (t0, t1, t2), the column of nop.
    agents = after.context["matrix"]["agents"]
    key = f"1-{agents.index('nop')}"
    assert list(update["cells"]) == [key]
    td = update["cells"][key]
    assert 'data-cell="' + key + '"' in td and "1/2 passed" in td
    # The cell is exactly what the whole matrix renders for it (one template).
    assert td in after.render("matrix")
    assert "leaderboard" in update["sections"]  # nop's numbers moved too


async def test_a_new_task_sends_the_whole_matrix() -> None:
    shown = Shown()
    shown.changes(await _parts(_records()))
    after = await _parts(_records(extra_task=True))
    update = shown.changes(after)
    assert update["sections"]["matrix"] == after.render("matrix") and update["cells"] == {}
    assert "t9" in update["sections"]["matrix"]
