"""Every field of the contract carries a description.

Generated API docs (AsyncAPI for the events, OpenAPI for the HTTP API) are built from
the models' JSON schemas; a property without a description is a hole in them. The
check walks the JSON schema of every model defined in the contract modules, in both
validation and serialization mode, nested models and ``$defs`` included.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from types import ModuleType
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from schemas import envelope, events, experiment_events, manifest, record, runners, trial_events
from schemas.documented import DOCUMENTED

# schemas.harbor_result is not part of the contract: it reads Harbor's files leniently.
CONTRACT_MODULES: tuple[ModuleType, ...] = (
    envelope,
    experiment_events,
    trial_events,
    record,
    manifest,
    runners,
)
MODES: tuple[Literal["validation", "serialization"], ...] = ("validation", "serialization")


def undescribed(schema: dict[str, Any], where: str) -> list[str]:
    """``Model.field`` of every property in ``schema`` (recursively) with no description."""
    missing: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item, path)
            return
        if not isinstance(node, dict):
            return
        owner = node.get("title", path)
        for name, prop in (node.get("properties") or {}).items():
            text = prop.get("description") if isinstance(prop, dict) else None
            if not (isinstance(text, str) and text.strip()):
                missing.append(f"{owner}.{name}")
        for key, value in node.items():
            if key == "$defs" and isinstance(value, dict):
                for def_name, sub in value.items():
                    walk(sub, def_name)
            elif key != "properties":
                walk(value, path)
        for prop in (node.get("properties") or {}).values():
            walk(prop, path)

    walk(schema, where)
    return sorted(set(missing))


def contract_models() -> Iterator[type[BaseModel]]:
    """Every pydantic model class defined (not just imported) in the contract modules."""
    for module in CONTRACT_MODULES:
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseModel) and obj.__module__ == module.__name__:
                yield obj


def test_the_walk_finds_the_contract_models() -> None:
    names = {m.__name__ for m in contract_models()}
    assert {"Envelope", "RunEvent", "TrialFailed", "TrialRecord", "ExperimentManifest"} <= names
    assert "HarborTrialResult" not in names


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", list(contract_models()), ids=lambda m: m.__name__)
def test_every_model_field_has_a_description(
    model: type[BaseModel], mode: Literal["validation", "serialization"]
) -> None:
    schema = model.model_json_schema(mode=mode)
    # A schema that lost its properties (e.g. to a model serializer's return type)
    # would have nothing left to check: every field must be there.
    assert set(schema.get("properties", {})) == set(model.model_fields)
    assert undescribed(schema, model.__name__) == []


@pytest.mark.parametrize("mode", MODES)
def test_every_field_of_the_event_union_has_a_description(
    mode: Literal["validation", "serialization"],
) -> None:
    schema = TypeAdapter(events.Event).json_schema(mode=mode)
    for name in ("TrialRequested", "TrialStarted", "TrialCompleted", "TrialFailed"):
        assert set(schema["$defs"][name]["properties"]) >= {"run_id", "trial_id", "type"}
    assert undescribed(schema, "Event") == []


# -- negative controls: the check reports what it should ------------------------------


class _Inner(BaseModel):
    described: int = Field(description="Has one.")
    bare: int


class _Throwaway(BaseModel):
    documented: str = Field(description="Has one.")
    blank: str = Field(description="   ")
    plain: str
    nested: _Inner = Field(description="The nested model's own fields are checked too.")
    optional_nested: _Inner | None = None


def test_missing_blank_and_nested_descriptions_are_reported() -> None:
    assert undescribed(_Throwaway.model_json_schema(), "_Throwaway") == [
        "_Inner.bare",
        "_Throwaway.blank",
        "_Throwaway.optional_nested",
        "_Throwaway.plain",
    ]


def test_a_model_without_descriptions_in_an_event_union_is_reported() -> None:
    union = TypeAdapter(events.TrialStarted | _Inner)
    assert undescribed(union.json_schema(), "union") == ["_Inner.bare"]


# -- field docstrings: a wrapped one is one description ----------------------------------


class _Wrapped(BaseModel):
    model_config = ConfigDict(**DOCUMENTED)

    budget: int = 0
    """Stop starting trials once the experiment's attempts cost this much, as the agents
    report it, attempts without a price counting tokens only."""
    short: int = 0
    """One line."""


class _WrappedUnfolded(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    budget: int = 0
    """Stop starting trials once the experiment's attempts cost this much, as the agents
    report it, attempts without a price counting tokens only."""


def test_a_wrapped_field_docstring_is_one_line_in_the_schema() -> None:
    props = _Wrapped.model_json_schema()["properties"]
    assert props["budget"]["description"] == (
        "Stop starting trials once the experiment's attempts cost this much, as the agents "
        "report it, attempts without a price counting tokens only."
    )
    assert props["short"]["description"] == "One line."
    # Control: without the fold, pydantic keeps the docstring's line break.
    unfolded = _WrappedUnfolded.model_json_schema()["properties"]["budget"]["description"]
    assert "\n" in unfolded
