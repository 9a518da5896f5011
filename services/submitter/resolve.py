"""Resolving a manifest's task entries to Harbor task folders on disk.

The folders are on the submitter's disk only: ``resolve_tasks`` names each by its
content checksum (``TaskRef``, what events carry) and keeps the folder beside it
(``ResolvedTask``) for the upload of its archive to the tasks bucket.
"""

from __future__ import annotations

import difflib
import glob
import itertools
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from schemas.events import TaskRef
from schemas.manifest import DatasetRef, ExperimentManifest, StoredTask, TaskPath
from schemas.trial_events import TASK_NAME_PATTERN
from services.common.errors import ManifestError
from services.common.task_identity import task_checksum
from services.submitter.datasets import FetchedDatasets

# What makes a folder a Harbor task (see Harbor's task format).
_REQUIRED = ("task.toml", "instruction.md")
_TASK_NAME_RE = re.compile(TASK_NAME_PATTERN)


@dataclass(frozen=True, slots=True)
class ResolvedTask:
    """A task as events name it, and the folder it was read from (submitter side)."""

    ref: TaskRef
    folder: Path | None
    """None: already in the tasks bucket (a manifest's ``{name, checksum}`` entry)."""


@dataclass(frozen=True, slots=True)
class TaskFolders:
    """Where a manifest's relative task folders are on this machine: ``base_dir``, and
    the ``tasks_root`` every folder must stay within (the HTTP API's; None: anywhere)."""

    base_dir: Path
    tasks_root: Path | None = None

    def resolve(self, manifest: ExperimentManifest) -> list[ResolvedTask]:
        """The manifest's task folders, resolved against these (``resolve_tasks``)."""
        return resolve_tasks(manifest, self.base_dir, self.tasks_root)


def check_task_dir(
    task_dir: Path,
    where: str,
    *,
    written: str | None = None,
    base: Path | None = None,
    root: Path | None = None,
) -> None:
    """Raise ManifestError naming what is missing from a Harbor task folder. With
    ``written`` (the path as the manifest gives it, relative to ``base``), a folder that
    does not exist is named with the closest one inside ``root`` (``_did_you_mean``)."""
    if not task_dir.is_dir():
        if task_dir.exists():
            raise ManifestError(f"{where}: {task_dir} is not a folder; list Harbor task folders")
        hint = _did_you_mean(task_dir, written, base, root) if written else None
        did_you_mean = f"; did you mean {hint!r}?" if hint else ""
        raise ManifestError(f"{where}: task folder {task_dir} does not exist{did_you_mean}")
    missing = [name for name in _REQUIRED if not (task_dir / name).is_file()]
    tests = task_dir / "tests"
    if not (tests / "test.sh").is_file() and not any(tests.glob("test.*")):
        missing.append("tests/test.sh")
    if missing:
        inside = _task_folders_inside(task_dir)
        hint = (
            f"; it holds {len(inside)} task folders ({', '.join(inside[:3])}"
            f"{', ...' if len(inside) > 3 else ''}): write "
            f"{str(Path(written or task_dir) / '*')!r} to run them all"
            if inside
            else ""
        )
        raise ManifestError(
            f"{where}: {task_dir} is not a Harbor task folder: missing {', '.join(missing)}{hint}"
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


_SIBLINGS_READ = 10_000
"""Entries of a missing folder's parent looked at for a close name, at most."""
_FOLDERS_DOWN = 2
"""How many folders down from the manifest's folder a misplaced path is looked for."""
_PLACES_READ = 200
"""Places looked at for a misplaced path, at most (``_moved``)."""


def _task_folders_inside(folder: Path) -> list[str]:
    """The names of the Harbor task folders right inside ``folder`` (a dataset's folder
    given for a task), sorted; entries past ``_SIBLINGS_READ`` are not looked at, nor
    links (which may lead out of the tasks root)."""
    names = []
    for entry in itertools.islice(folder.iterdir(), _SIBLINGS_READ):
        if not entry.is_symlink() and all((entry / name).is_file() for name in _REQUIRED):
            names.append(entry.name)
    return sorted(names)


def _did_you_mean(missing: Path, written: str, base: Path | None, root: Path | None) -> str | None:
    """What the manifest may have meant instead of ``written`` (as it would write it): a
    folder beside ``missing`` with a close name (a typo), else the same task folder
    relative to another folder (``_moved``). Never a folder outside ``root``."""
    if close := _closest_folder(missing, root):
        return str(Path(written).with_name(close))
    if base is None or Path(written).is_absolute() or glob.has_magic(written):
        return None
    return _moved(Path(written), base, root)


def _moved(written: Path, base: Path, root: Path | None) -> str | None:
    """``written`` with leading folders dropped, or one or two added, where that names a
    Harbor task folder under ``base`` (and ``root``): the path was written relative to
    another folder (the current one instead of the manifest's, say)."""
    parts = written.parts
    tails = [Path(*parts[k:]) for k in range(1, len(parts))]
    heads: list[Path] = []
    for depth in range(1, _FOLDERS_DOWN + 1):
        pattern = os.path.join(glob.escape(str(base)), *["*"] * depth, str(written))
        # Lazily: the walk stops at the cap (a POSTed manifest can ask for this).
        found = itertools.islice(glob.iglob(pattern), _PLACES_READ)
        heads += sorted(Path(p).relative_to(base) for p in found)
    for candidate in [*tails, *heads][:_PLACES_READ]:
        folder = (base / candidate).resolve()
        inside = folder.is_relative_to(root if root is not None else base)
        if inside and ".." not in candidate.parts and (folder / "task.toml").is_file():
            return str(candidate)
    return None


def _closest_folder(missing: Path, root: Path | None) -> str | None:
    """The name of a folder beside ``missing`` that is close to its name (a typo), if
    any; only inside ``root``, so a reply never names a folder the caller may not use."""
    parent = missing.parent
    if root is not None and not parent.is_relative_to(root):
        return None
    try:
        with os.scandir(parent) as entries:
            names = [
                e.name
                for e in itertools.islice(entries, _SIBLINGS_READ)
                if e.is_dir(follow_symlinks=False)
            ]
    except OSError:
        return None
    close = difflib.get_close_matches(missing.name, names, n=1)
    return close[0] if close else None


def resolve_tasks(
    manifest: ExperimentManifest,
    base_dir: Path,
    tasks_root: Path | None = None,
    datasets: FetchedDatasets | None = None,
) -> list[ResolvedTask]:
    """Task folders of a manifest, in manifest order, each once. A dataset entry's
    folders are ``datasets[i]`` (services/submitter/datasets.fetch_datasets); without
    them the entry is refused (the HTTP API fetches none)."""
    base = base_dir.resolve()
    root = tasks_root.resolve() if tasks_root else None
    # Keyed by where a task comes from: a folder, or a stored archive.
    seen: dict[str, ResolvedTask] = {}
    names: dict[str, str] = {}
    for i, spec in enumerate(manifest.tasks):
        where = f"tasks[{i}]"
        if isinstance(spec, DatasetRef):
            if datasets is None or i not in datasets:
                raise ManifestError(
                    f"{where}: dataset {spec.dataset!r}: not fetched here: `trialbus "
                    "submit` fetches registry datasets on its user's machine, the HTTP API "
                    "only from the registries its operator allows "
                    "(TRIALBUS_API_DATASET_REGISTRIES, unset here); submit the manifest with "
                    "`trialbus submit`, or upload the tasks (POST /tasks) and list them by "
                    "name and checksum"
                )
            from_dataset = f"{where} (dataset {spec.dataset!r})"
            for task_dir in (d.resolve() for d in datasets[i]):
                check_task_dir(task_dir, from_dataset)
                _add_folder(task_dir, from_dataset, seen, names)
            continue
        if isinstance(spec, StoredTask):
            if spec.name in names:
                raise ManifestError(
                    f"{where}: two tasks are named {spec.name!r}; task names must be unique "
                    "within an experiment"
                )
            names[spec.name] = f"the stored task {spec.checksum[:12]}"
            ref = TaskRef(name=spec.name, checksum=spec.checksum)
            seen[f"stored:{spec.checksum}:{spec.name}"] = ResolvedTask(ref, None)
            continue
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
            check_task_dir(task_dir, where, written=spec.path, base=base, root=root)
            _add_folder(task_dir, where, seen, names)
    return list(seen.values())


def _add_folder(
    task_dir: Path, where: str, seen: dict[str, ResolvedTask], names: dict[str, str]
) -> None:
    """Add the task folder ``task_dir`` (resolved, checked: ``check_task_dir``) to
    ``seen`` once, its name to ``names``: the name must be a task name, and unique
    within the experiment."""
    if str(task_dir) in seen:
        return
    name = task_dir.name
    if not _TASK_NAME_RE.match(name):
        raise ManifestError(
            f"{where}: task folder name {name!r} must match {TASK_NAME_PATTERN} "
            "(letters, digits, '_', '.', '-'; the name is the folder's name on "
            "every runner); rename the folder"
        )
    if name in names:
        raise ManifestError(
            f"{where}: two task folders are named {name!r} ({names[name]} and "
            f"{task_dir}); task names must be unique within an experiment"
        )
    names[name] = str(task_dir)
    ref = TaskRef(name=name, checksum=task_checksum(task_dir))
    seen[str(task_dir)] = ResolvedTask(ref, task_dir)
