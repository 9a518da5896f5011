"""Priority classes: the operator's names and weights, parsed once (docs/scheduling.md).

``TRIALBUS_PRIORITY_CLASSES`` lists the classes of an installation with their weights,
``urgent=8,normal=3,batch=1`` by default; ``TRIALBUS_DEFAULT_PRIORITY_CLASS`` names the
class of a manifest that names none (``normal``). The submitter refuses a manifest
whose ``compute.priority_class`` is not listed, the admin provisions one runner
durable per (pool, class), and each runner weighs its fetches by these weights
(services.runner.selection). Every process of an installation must share the setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from schemas.subjects import check_class

DEFAULT_CLASSES = "urgent=8,normal=3,batch=1"
DEFAULT_CLASS = "normal"
MAX_WEIGHT = 1000


@dataclass(frozen=True, slots=True)
class PriorityClasses:
    """The classes of an installation (highest weight first) and its default class."""

    weights: tuple[tuple[str, int], ...]
    default: str

    @classmethod
    def parse(cls, spec: str, default: str = DEFAULT_CLASS) -> PriorityClasses:
        """``"urgent=8,normal=3,batch=1"`` -> classes; ValueError names what is wrong."""
        found: dict[str, int] = {}
        for item in (part.strip() for part in spec.split(",")):
            if not item:
                continue
            name, sep, weight = item.partition("=")
            name = name.strip()
            check_class(name)
            if not sep or not weight.strip().isdigit():
                raise ValueError(
                    f"priority class {name!r}: weight must be a whole number 1-{MAX_WEIGHT} "
                    f"(write {name}=<weight>, e.g. {DEFAULT_CLASSES})"
                )
            if name in found:
                raise ValueError(f"priority class {name!r} is listed twice in {spec!r}")
            found[name] = int(weight)
            if not 1 <= found[name] <= MAX_WEIGHT:
                raise ValueError(
                    f"priority class {name!r}: weight {found[name]} is not in 1-{MAX_WEIGHT}"
                )
        if not found:
            raise ValueError(f"no priority class in {spec!r} (e.g. {DEFAULT_CLASSES})")
        if default not in found:
            raise ValueError(
                f"default priority class {default!r} is not one of the classes "
                f"{', '.join(found)} (TRIALBUS_DEFAULT_PRIORITY_CLASS)"
            )
        ordered = sorted(found.items(), key=lambda kv: -kv[1])
        return cls(weights=tuple(ordered), default=default)

    @property
    def names(self) -> tuple[str, ...]:
        """Class names, highest weight first."""
        return tuple(name for name, _ in self.weights)

    def weight(self, name: str) -> int:
        """The weight of class ``name`` (KeyError if unknown)."""
        return dict(self.weights)[name]

    def resolve(self, requested: str | None) -> str:
        """The class a manifest's ``compute.priority_class`` means (None: the default)."""
        return self.default if requested is None else requested

    def refusal(self, requested: str | None) -> str | None:
        """None when ``requested`` is a class of this installation, else why not."""
        if requested is None or requested in self.names:
            return None
        return (
            f"compute.priority_class: unknown priority class {requested!r}; this "
            f"installation's classes are {', '.join(self.names)} (default {self.default}); "
            "use one of them or leave the field out"
        )

    def durable_class(self, name: str) -> str | None:
        """The class token of ``name``'s durable: None for the default class (it keeps
        the pool's durable name from before classes existed)."""
        return None if name == self.default else name


DEFAULT_PRIORITY_CLASSES: Final = PriorityClasses.parse(DEFAULT_CLASSES)
"""The classes of an installation that sets none: ``DEFAULT_CLASSES``, default class
``DEFAULT_CLASS``."""
