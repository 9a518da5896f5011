"""trialbus installs generic top-level names (schemas, services, infra): no dependency may.

Until the imports move under a ``trialbus.`` prefix (the plan is in docs/operations.md),
the names are safe only while nothing else in the environment ships them; a
dependency that did would shadow trialbus's package, or be shadowed, depending on
sys.path order. This test reads every installed distribution's file list.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import Distribution, distributions
from pathlib import PurePosixPath

OURS = ("schemas", "services", "infra")


def top_level_names(dist: Distribution) -> set[str]:
    """Import names a distribution puts at the top of site-packages."""
    declared = dist.read_text("top_level.txt")
    if declared:
        return set(declared.split())
    names = set()
    for file in dist.files or []:
        first = PurePosixPath(str(file)).parts[0]
        if first.endswith((".dist-info", ".data", ".pth")) or first in {"..", "__pycache__"}:
            continue
        names.add(first.removesuffix(".py"))
    return names


def collisions(dists: Iterable[Distribution]) -> dict[str, list[str]]:
    """For each of trialbus's top-level names, the other distributions that ship it."""
    found: dict[str, list[str]] = {}
    for dist in dists:
        if dist.metadata["Name"] == "trialbus":
            continue
        for name in top_level_names(dist) & set(OURS):
            found.setdefault(name, []).append(dist.metadata["Name"])
    return found


def test_no_installed_distribution_ships_our_top_level_names() -> None:
    dists = list(distributions())
    assert len(dists) > 50  # the real environment was read, not an empty one
    assert collisions(dists) == {}


class _Fake(Distribution):
    """A distribution that ships ``services/__init__.py`` (the collision to detect)."""

    def read_text(self, filename: str) -> str | None:
        return {"METADATA": "Name: other-tool\n"}.get(filename)

    def locate_file(self, path: str | PurePosixPath) -> PurePosixPath:  # type: ignore[override]
        return PurePosixPath(path)

    @property
    def files(self) -> list[PurePosixPath]:  # type: ignore[override]
        return [
            PurePosixPath("services/__init__.py"),
            PurePosixPath("other_tool-1.dist-info/RECORD"),
        ]


def test_the_check_reports_a_distribution_that_ships_services() -> None:
    # Negative control: the check above can fail.
    assert collisions([_Fake()]) == {"services": ["other-tool"]}
