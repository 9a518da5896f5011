"""A pydantic ``ValidationError`` as the lines a user reads: ``<source>: <field>: <message>``.

Every user-written file (an experiment manifest, the API tokens file) is validated by
a pydantic model; its errors are reported the same way, one line per problem, each
naming the file and the field. A caller words the messages its users need (a field's
value must not be echoed, an unknown field points to the docs); the rest keep
pydantic's own text.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import ValidationError
from pydantic_core import ErrorDetails

# Parts of a location that name a union member or a validator (the manifest's task and
# agent unions), not a field the user wrote.
_NOT_FIELDS = frozenset(
    {"TaskPath", "DatasetRef", "function-after[_one_of_name_or_import_path(), AgentSpec]"}
)


def field_path(loc: tuple[int | str, ...]) -> str:
    """``tasks[0].path`` for the location ``("tasks", 0, "path")``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _NOT_FIELDS:
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or "<top level>"


def problem_lines(
    source: str, exc: ValidationError, message: Callable[[ErrorDetails], str | None]
) -> str:
    """One line per problem; ``message`` words an error, or None for pydantic's text."""
    lines = []
    for err in exc.errors():
        msg = message(err)
        if msg is None:
            msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{source}: {field_path(err['loc'])}: {msg}")
    # Union members repeat the same complaint; keep each line once.
    return "\n".join(dict.fromkeys(lines))
