"""Free-text manifest fields are capped: a long one is refused naming it, not stored.

Each cap has its control: the same manifest at the cap is accepted.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from schemas.manifest import MAX_DESCRIPTION_CHARS, MAX_NAME_CHARS, ExperimentManifest


def _manifest(**changes: Any) -> dict[str, Any]:
    agent = {"name": "nop", **changes.pop("agent", {})}
    return {"name": "caps", "tasks": ["hello-file"], "agents": [agent], **changes}


@pytest.mark.parametrize(
    ("changes", "field", "cap"),
    [
        ({"description": "d"}, "description", MAX_DESCRIPTION_CHARS),
        ({"agent": {"label": "l"}}, "agents.0.label", MAX_NAME_CHARS),
        ({"agent": {"model": "m"}}, "agents.0.model", MAX_NAME_CHARS),
        ({"tasks": [{"path": "p"}]}, "tasks.0", 4096),
    ],
)
def test_a_free_text_field_over_its_cap_is_refused_naming_it(
    changes: dict[str, Any], field: str, cap: int
) -> None:
    def sized(n: int) -> dict[str, Any]:
        def grow(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: grow(v) for k, v in value.items()}
            if isinstance(value, list):
                return [grow(v) for v in value]
            return value * n

        return _manifest(**grow(changes))

    ExperimentManifest.model_validate(sized(cap))  # control: at the cap
    with pytest.raises(ValidationError) as caught:
        ExperimentManifest.model_validate(sized(cap + 1))
    assert field in str(caught.value).replace("\n", " ").replace("\\.", "."), str(caught.value)
