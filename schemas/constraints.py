"""Named bounds of the schemas' numbers, so each bound is written (and changed) once.

A field keeps its own default and docstring at the field, so a reader (and mypy's
pydantic plugin) sees there whether it is optional; the alias carries only the
bounds. Pydantic merges the alias's ``Field`` with the field's own: the JSON schema
is the one the bounds written at the field gave (``trialbus api-docs --check``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

MAX_INT64 = 2**63 - 1
"""Largest integer the ledger (BSON int64) stores; larger ones fail every write."""

Count = Annotated[int, Field(ge=0, le=MAX_INT64)]
"""A count or 0-based index the ledger stores: 0 up to int64."""

PositiveCount = Annotated[int, Field(ge=1, le=MAX_INT64)]
"""A count from 1 (an attempt number, a limit of trials): 1 up to int64."""

FiniteAmount = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A finite amount that may be 0 (a spend cap in US dollars)."""

PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A finite amount above 0 (a cost limit, a timeout factor)."""

DelaySeconds = Annotated[float, Field(ge=0, le=3600, allow_inf_nan=False)]
"""A delay between attempts: finite, from 0 to an hour."""


def require_either[M: BaseModel](model: M, first: str, second: str, why: str) -> M:
    """``model`` when ``first`` or ``second`` (or both) is set; a model validator's
    ValueError naming the two fields otherwise (``why``: what they are for)."""
    if getattr(model, first) is None and getattr(model, second) is None:
        raise ValueError(f"give {first}, {second} or both ({why})")
    return model
