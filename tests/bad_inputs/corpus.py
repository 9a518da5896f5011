"""Loader of the bad-input corpus (``cases.yaml`` and the files next to it).

The corpus is data: each case is a file (or folder) on disk plus an entry in
``cases.yaml`` saying what it must produce. This module lists the cases, makes the
``generate:`` ones (too big for git, or a FIFO) at test time, and materializes
result cases into real Harbor trial folders. It runs no checks itself.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml

from services.importer.reads import MAX_FILE_BYTES
from services.submitter.manifest_io import MAX_MANIFEST_BYTES

CORPUS = Path(__file__).resolve().parent
TASKS_ROOT = CORPUS / "tasks"
"""Tasks root for ``stage: resolve`` manifests and for the task-folder cases."""

Kind = Literal["manifests", "tasks", "results", "events"]

HUGE_BYTES = MAX_FILE_BYTES + 1024 * 1024
"""Size of the generated huge files (sparse: nothing is actually written)."""

BAD_REWARD_KEYS = 300_000
"""Non-numeric rewards in ``thousands-of-bad-rewards``: one diagnostic each, ~25 MB."""


@dataclass(frozen=True, slots=True)
class Case:
    """One corpus entry."""

    kind: Kind
    name: str
    spec: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def expect(self) -> list[str]:
        return list(self.spec.get("expect", []))

    @property
    def expect_stored(self) -> list[str]:
        """What the record says when the folder came through the results bucket (a
        runner packs it first: links and special files stay out, listed); default
        ``expect``."""
        return list(self.spec.get("expect_stored", self.expect))

    @property
    def generate(self) -> str | None:
        value = self.spec.get("generate")
        return str(value) if value else None

    @property
    def path(self) -> Path:
        """The case's file or folder in the corpus (absent for generated cases)."""
        suffix = {"manifests": ".yaml", "events": ".json"}.get(self.kind, "")
        return CORPUS / self.kind / f"{self.name}{suffix}"


@cache
def _index() -> dict[str, dict[str, dict[str, Any]]]:
    data: dict[str, dict[str, dict[str, Any]]] = yaml.safe_load((CORPUS / "cases.yaml").read_text())
    return data


def cases(kind: Kind) -> list[Case]:
    """The cases of one kind, in index order."""
    return [Case(kind, name, spec or {}) for name, spec in _index()[kind].items()]


def on_disk(kind: Kind) -> set[str]:
    """Names of the cases of one kind that exist as files (to catch unindexed files)."""
    folder = CORPUS / kind
    return {p.name.removesuffix(".yaml").removesuffix(".json") for p in folder.iterdir()}


# -- manifests ---------------------------------------------------------------------------


def manifest_file(case: Case, tmp: Path) -> Path:
    """The manifest file of a case (generated ones are written under ``tmp``)."""
    if case.generate is None:
        return case.path
    if case.generate == "oversized-manifest":
        path = tmp / f"{case.name}.yaml"
        path.write_text("name: big\n# " + "x" * MAX_MANIFEST_BYTES + "\n")
        return path
    raise ValueError(f"unknown generator {case.generate!r} for {case.id}")


# -- events ------------------------------------------------------------------------------


def event_bytes(case: Case, size: int = 600 * 1024) -> bytes:
    """The raw message of an event case (generated ones: a TrialLog of ``size`` bytes)."""
    if case.generate is None:
        return case.path.read_bytes()
    if case.generate == "oversized-event":
        head = {
            "type": "trial_log",
            "experiment_id": "poison",
            "trial_id": "poison__big",
            "phase": "agent",
            "stream": "stdout",
            "text": "",
        }
        raw = json.dumps(head).encode()
        return raw[:-2] + b"x" * (size - len(raw)) + raw[-2:]
    raise ValueError(f"unknown generator {case.generate!r} for {case.id}")


# -- result folders ---------------------------------------------------------------------


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (null deletes a key)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge_patch(out.get(key), value)
    return out


def _sparse(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        fh.truncate(size)


def materialize_result(case: Case, real_trial: Path, dest: Path) -> Path:
    """Build the trial folder of a result case at ``dest``.

    ``real_trial`` is a trial folder Harbor wrote this session (never modified): it is
    copied first unless the case says ``base: none``, then the case's files are laid
    over the copy. Returns ``dest``.
    """
    if case.spec.get("base", "oracle") == "none":
        dest.mkdir(parents=True)
    else:
        shutil.copytree(real_trial, dest)
    for name in case.spec.get("remove", []):
        target = dest / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    if case.path.is_dir():
        for src in sorted(case.path.rglob("*")):
            rel = src.relative_to(case.path)
            if src.name == ".gitkeep":
                (dest / rel.parent).mkdir(parents=True, exist_ok=True)
            elif src.name == "result.patch.json":
                result = dest / "result.json"
                merged = _merge_patch(json.loads(result.read_text()), json.loads(src.read_text()))
                result.write_text(json.dumps(merged, indent=2))
            elif src.is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dest / rel)
    _generate_result(case, dest)
    return dest


def _generate_result(case: Case, dest: Path) -> None:
    match case.generate:
        case None:
            return
        case "huge-result":
            _sparse(dest / "result.json", HUGE_BYTES)
        case "huge-reward-json":
            _sparse(dest / "verifier" / "reward.json", HUGE_BYTES)
        case "fifo-result":
            (dest / "result.json").unlink()
            os.mkfifo(dest / "result.json")
        case "thousands-of-bad-rewards":
            result = dest / "result.json"
            data = json.loads(result.read_text())
            data["verifier_result"] = {"rewards": {f"k{i}": "x" for i in range(BAD_REWARD_KEYS)}}
            result.write_text(json.dumps(data))
        case other:
            raise ValueError(f"unknown generator {other!r} for {case.id}")
