"""docs/events.md and docs/manifest.md list exactly the fields the models have.

The docs' field tables are written by hand (prose a reader wants), so this test keeps
them honest: a field added to, removed from or made optional in a model without the
docs following fails here, naming the table and the field.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from schemas.events import (
    EVENT_TYPES,
    Envelope,
    ExperimentCompleted,
    ExperimentSubmitted,
    ResultImported,
    TrialCompleted,
    TrialFailed,
    TrialLog,
    TrialRequested,
    TrialStarted,
)
from schemas.manifest import (
    AgentSpec,
    BudgetSpec,
    ComputeSpec,
    DatasetRef,
    ExperimentManifest,
    RetrySpec,
    StoredTask,
    TaskPath,
)

DOCS = Path(__file__).resolve().parents[2] / "docs"
EVENTS_MD = (DOCS / "events.md").read_text(encoding="utf-8")
MANIFEST_MD = (DOCS / "manifest.md").read_text(encoding="utf-8")

MODELS: dict[str, type[Envelope]] = {
    "experiment_submitted": ExperimentSubmitted,
    "trial_requested": TrialRequested,
    "trial_started": TrialStarted,
    "trial_log": TrialLog,
    "trial_completed": TrialCompleted,
    "trial_failed": TrialFailed,
    "result_imported": ResultImported,
    "experiment_completed": ExperimentCompleted,
}
_TICKED = re.compile(r"`([^`]+)`")


def table_after(markdown: str, anchor: str) -> dict[str, str]:
    """The first table after the line ``anchor``: each backticked name in a row's first
    cell, mapped to the row's last cell."""
    lines = markdown.splitlines()
    if anchor not in lines:
        raise AssertionError(f"no line {anchor!r} in the document")
    rows: dict[str, str] = {}
    for line in lines[lines.index(anchor) + 1 :]:
        if line.startswith("#"):
            break
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        for name in _TICKED.findall(cells[0]):
            rows[name] = cells[-1]
    return rows


def payload_fields(model: type[BaseModel]) -> dict[str, bool]:
    """Field name -> required, for the fields a model adds to the envelope."""
    envelope = set(Envelope.model_fields) - {"trial_id"}
    return {
        name: info.is_required()
        for name, info in model.model_fields.items()
        if name not in envelope | {"type"}
        and (name != "trial_id" or info.is_required())  # trial_id: where it is required
    }


def drift(documented: dict[str, str], fields: dict[str, bool], marks_required: bool) -> list[str]:
    """What differs between a docs table and a model: missing, extra, wrong 'required'."""
    problems = [f"{name}: not documented" for name in fields if name not in documented]
    problems += [f"{name}: documented, not a field" for name in documented if name not in fields]
    if marks_required:
        problems += [
            f"{name}: {'required' if required else 'optional'} in the model"
            for name, required in fields.items()
            if name in documented and ("(required" in documented[name]) != required
        ]
    return problems


# -- docs/events.md ------------------------------------------------------------------


def test_models_map_covers_every_event_type() -> None:
    assert set(MODELS) == set(EVENT_TYPES)
    assert all(m.model_fields["type"].default == t for t, m in MODELS.items())


def test_envelope_table_matches_the_envelope() -> None:
    documented = table_after(EVENTS_MD, "## Envelope (every event)")
    assert set(documented) == {*Envelope.model_fields, "type"}


def test_types_table_lists_every_event_type() -> None:
    assert set(table_after(EVENTS_MD, "## Types")) == set(EVENT_TYPES)


@pytest.mark.parametrize("event_type", sorted(MODELS))
def test_field_table_matches_the_model(event_type: str) -> None:
    documented = table_after(EVENTS_MD, f"### `{event_type}`")
    assert drift(documented, payload_fields(MODELS[event_type]), marks_required=True) == []


# -- docs/manifest.md ----------------------------------------------------------------


def test_manifest_table_matches_the_manifest() -> None:
    top = {n: i.is_required() for n, i in ExperimentManifest.model_fields.items()}
    nested: dict[str, type[BaseModel]] = {
        "compute": ComputeSpec,
        "retry": RetrySpec,
        "budget": BudgetSpec,
    }
    fields = {n: r for n, r in top.items() if n not in nested}
    for prefix, model in nested.items():
        fields |= {f"{prefix}.{n}": i.is_required() for n, i in model.model_fields.items()}
    documented = table_after(MANIFEST_MD, "# Experiment manifest")
    assert drift(documented, fields, marks_required=False) == []


@pytest.mark.parametrize(
    ("anchor", "models"),
    [
        ("Agent entries:", (AgentSpec,)),
        (
            "Task entries (a plain string is the same as `{path: ...}`):",
            (TaskPath, DatasetRef, StoredTask),
        ),
    ],
)
def test_entry_tables_match_their_models(anchor: str, models: tuple[type[BaseModel], ...]) -> None:
    fields = {n: i.is_required() for m in models for n, i in m.model_fields.items()}
    assert drift(table_after(MANIFEST_MD, anchor), fields, marks_required=False) == []


# -- negative controls ----------------------------------------------------------------

_STALE = """### `trial_started`

| field | meaning |
|---|---|
| `trial_id` | the trial (required) |
| `runner_id`, `host` | who runs it (required) |
| `attempt` | which start (default 1) |
| `worker` | renamed long ago |

### `trial_log`
"""


def test_a_stale_table_is_reported_field_by_field() -> None:
    documented = table_after(_STALE, "### `trial_started`")
    assert set(documented) == {"trial_id", "runner_id", "host", "attempt", "worker"}
    assert sorted(drift(documented, payload_fields(TrialStarted), marks_required=True)) == [
        "agent_label: not documented",
        "attempt: required in the model",
        "handed_back: not documented",
        "model: not documented",
        "run_id: not documented",
        "task_name: not documented",
        "worker: documented, not a field",
    ]


def test_a_missing_section_is_an_error() -> None:
    with pytest.raises(AssertionError, match="no line"):
        table_after(EVENTS_MD, "### `trial_exploded`")
