"""Packaging and licensing invariants.

trialbus installs generic top-level names (schemas, services, infra): no dependency may.

Until the imports move under a ``trialbus.`` prefix (the plan is in docs/operations.md),
the names are safe only while nothing else in the environment ships them; a
dependency that did would shadow trialbus's package, or be shadowed, depending on
sys.path order. This test reads every installed distribution's file list.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterable
from importlib.metadata import Distribution, distributions
from pathlib import Path, PurePosixPath

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


# SecantusDB is GPL-2.0-only: trialbus (Apache-2.0) runs its server, `secantusd-py`, as a
# separate process and talks to it over the MongoDB wire protocol; it never imports it.
ROOT = Path(__file__).resolve().parents[2]
CODE = ("schemas", "services", "infra", "benchmarks", "tests")
IMPORTS_SECANTUS = re.compile(
    r"^\s*(import|from)\s+secantus\b|import_module\(\s*['\"]secantus", re.M
)
ENTRYPOINTS = (
    "services.cli",
    "services.runner.app",
    "services.importer.app",
    "services.watcher.app",
    "services.submitter.app",
    "infra.stack",
)


def test_no_source_file_imports_secantus() -> None:
    sources = [p for top in CODE for p in (ROOT / top).rglob("*.py")]
    assert len(sources) > 100
    offenders = [str(p) for p in sources if IMPORTS_SECANTUS.search(p.read_text())]
    assert offenders == []
    # Negative control: the pattern does see an import.
    assert IMPORTS_SECANTUS.search("x = 1\nfrom secantus.server import main\n")


def test_no_process_entrypoint_loads_secantus() -> None:
    # A fresh interpreter imports every entrypoint, as the services do at startup, and
    # lists what got loaded (a dependency importing SecantusDB would show up too).
    script = (
        "import importlib, json, sys\n"
        f"for m in {list(ENTRYPOINTS)!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = json.loads(done.stdout)
    assert "pymongo" in loaded and "nats" in loaded  # negative control: imports are seen
    assert [m for m in loaded if m.split(".")[0] == "secantus"] == []
