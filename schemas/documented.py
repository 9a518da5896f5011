"""Fields are documented by a docstring under each field, as any Python attribute.

The contract's models, the service settings and the operator's files (team quotas, API
tokens) read those docstrings as their fields' descriptions (pydantic's
``use_attribute_docstrings``), so the type and default stay on the field's
own line and its documentation below it, where editors show it too. A docstring
wrapped over several lines is one description: the JSON schema (the API docs,
``trialbus api-docs``) gets it on one line, as it was written before the wrap.

Pydantic reads the docstrings from the class's source file when the class is built;
a model whose source cannot be read (no ``.py`` beside it) would have no descriptions,
which tests/unit/test_schema_descriptions.py would report.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import ConfigDict


def fold_field_descriptions(schema: dict[str, Any]) -> None:
    """A field description's line breaks (a wrapped docstring's) become single spaces."""
    for field in schema.get("properties", {}).values():
        text = field.get("description")
        if isinstance(text, str) and "\n" in text:
            field["description"] = " ".join(text.split())


DOCUMENTED: Final = ConfigDict(
    use_attribute_docstrings=True, json_schema_extra=fold_field_descriptions
)
"""The part of every model's config that reads its fields' docstrings."""
