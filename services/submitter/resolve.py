"""Resolving a manifest's task entries to Harbor task folders on disk."""

from __future__ import annotations

import glob
import hashlib
import tomllib
from pathlib import Path

from schemas.events import TaskRef
from schemas.manifest import DatasetRef, ExperimentManifest, TaskPath
from services.common.errors import ManifestError

# What makes a folder a Harbor task (see Harbor's task format).
_REQUIRED = ("task.toml", "instruction.md")
_MAX_TASK_FILES = 20_000


def task_checksum(task_dir: Path) -> str:
    """sha256 over the task folder's relative file paths and contents."""
    h = hashlib.sha256()
    files = sorted(p for p in task_dir.rglob("*") if p.is_file())
    if len(files) > _MAX_TASK_FILES:
        raise ManifestError(
            f"{task_dir}: more than {_MAX_TASK_FILES} files; is this a task folder?"
        )
    for p in files:
        h.update(p.relative_to(task_dir).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def check_task_dir(task_dir: Path, where: str) -> None:
    """Raise ManifestError naming what is missing from a Harbor task folder."""
    if not task_dir.is_dir():
        if task_dir.exists():
            raise ManifestError(f"{where}: {task_dir} is not a folder; list Harbor task folders")
        raise ManifestError(f"{where}: task folder {task_dir} does not exist")
    missing = [name for name in _REQUIRED if not (task_dir / name).is_file()]
    tests = task_dir / "tests"
    if not (tests / "test.sh").is_file() and not any(tests.glob("test.*")):
        missing.append("tests/test.sh")
    if missing:
        raise ManifestError(
            f"{where}: {task_dir} is not a Harbor task folder: missing {', '.join(missing)}"
        )
    # Harbor reads task.toml only when a trial starts: refuse a broken one here, once,
    # instead of failing every trial of the experiment on the runners.
    toml_path = task_dir / "task.toml"
    try:
        tomllib.loads(toml_path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise ManifestError(f"{where}: {toml_path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{where}: {toml_path}: not valid TOML: {exc}") from None


def resolve_tasks(
    manifest: ExperimentManifest, base_dir: Path, tasks_root: Path | None = None
) -> list[TaskRef]:
    """Task folders of a manifest, in manifest order, each once."""
    base = base_dir.resolve()
    root = tasks_root.resolve() if tasks_root else None
    seen: dict[Path, TaskRef] = {}
    names: dict[str, Path] = {}
    for i, spec in enumerate(manifest.tasks):
        where = f"tasks[{i}]"
        if isinstance(spec, DatasetRef):
            raise ManifestError(
                f"{where}: dataset {spec.dataset!r}: registry datasets are not resolved by "
                "this trialbus version; download the dataset with `harbor download` and "
                "list its task folders (or a glob) instead"
            )
        assert isinstance(spec, TaskPath)
        pattern = spec.path if Path(spec.path).is_absolute() else str(base / spec.path)
        matches = (
            sorted(Path(p) for p in glob.glob(pattern) if Path(p).is_dir())
            if glob.has_magic(spec.path)
            else [Path(pattern)]
        )
        if not matches:
            raise ManifestError(f"{where}: glob {spec.path!r} matches no task folder under {base}")
        try:
            # resolve() raises on a NUL byte, is_dir() on a name too long for the disk.
            resolved = [m.resolve() for m in matches]
            for m in resolved:
                m.is_dir()
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ManifestError(f"{where}: {spec.path!r} is not a usable path: {reason}") from None
        for task_dir in resolved:
            if root is not None and not task_dir.is_relative_to(root):
                raise ManifestError(
                    f"{where}: {spec.path!r} resolves to {task_dir}, outside the tasks root {root}"
                )
            check_task_dir(task_dir, where)
            if task_dir in seen:
                continue
            name = task_dir.name
            if name in names:
                raise ManifestError(
                    f"{where}: two task folders are named {name!r} ({names[name]} and "
                    f"{task_dir}); task names must be unique within an experiment"
                )
            names[name] = task_dir
            seen[task_dir] = TaskRef(
                name=name, path=str(task_dir), checksum=task_checksum(task_dir)
            )
    return list(seen.values())
