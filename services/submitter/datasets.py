"""A manifest's registry datasets (``{dataset: name@version}``), fetched as Harbor does.

``trialbus submit`` (the CLI, on the user's machine) asks Harbor's own clients: the
registry client names the dataset's tasks (Harbor's ``DatasetConfig`` applies
``task_names``, ``exclude_task_names`` and ``n_tasks``), and Harbor's task client
downloads them into its task cache (a git task at its pinned commit: sparse clone,
kept and reused). The folders it gives back are then task folders like any other:
checked, named by their checksum, uploaded to the tasks bucket
(services/submitter/resolve.py). So a runner never reaches the registry, and the
tasks a dataset reference runs are the ones ``harbor run --dataset`` runs.

The HTTP API fetches a posted manifest's datasets only from the registries its
operator allows (``TRIALBUS_API_DATASET_REGISTRIES``: ``AllowedRegistries``; unset,
none): otherwise it would download from registries and repositories a client names
onto the API's host (docs/security.md). An entry naming another registry is refused
before any request leaves the host.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from schemas.manifest import DatasetRef, ExperimentManifest
from services.common.errors import ManifestError, TransientError

FetchedDatasets = Mapping[int, Sequence[Path]]
"""Task folders of each dataset entry of a manifest, by the entry's index in ``tasks``."""

REGISTRY_NAMES_SHOWN = 8
"""Datasets a "not found" error lists, at most."""


HARBOR_REGISTRY = "harbor"
"""How ``TRIALBUS_API_DATASET_REGISTRIES`` names Harbor's own registry (an entry with
neither ``registry_path`` nor ``registry_url``)."""


@dataclass(frozen=True, slots=True)
class AllowedRegistries:
    """The registries the HTTP API may fetch datasets from (its operator's setting)."""

    harbor: bool = False
    """Harbor's registry (the default of an entry that names none)."""
    urls: frozenset[str] = frozenset()
    """Registry files by URL, as a manifest's ``registry_url`` must give them."""
    paths: frozenset[Path] = frozenset()
    """Registry files on the API's host (resolved), as ``registry_path`` must lead to."""

    @classmethod
    def parse(cls, setting: str) -> AllowedRegistries:
        """From the comma-separated setting: ``harbor``, ``http(s)://`` URLs, absolute
        paths; ValueError naming an entry that is none of these."""
        harbor, urls, paths = False, set(), set()
        for entry in (e.strip() for e in setting.split(",")):
            if entry == HARBOR_REGISTRY:
                harbor = True
            elif entry.startswith(("http://", "https://")):
                urls.add(entry)
            elif Path(entry).is_absolute():
                paths.add(Path(entry).resolve())
            elif entry:
                raise ValueError(
                    f"{entry!r} is not a registry: write {HARBOR_REGISTRY!r}, an http(s):// "
                    "URL or an absolute path of a registry file"
                )
        return cls(harbor, frozenset(urls), frozenset(paths))

    def refusal(self, spec: DatasetRef, registry_path: Path | None) -> str | None:
        """Why ``spec``'s registry (``registry_path``: its file, resolved) may not be
        fetched from, or None when it may."""
        if registry_path is not None:
            allowed = registry_path in self.paths
        elif spec.registry_url is not None:
            allowed = spec.registry_url in self.urls
        else:
            allowed = self.harbor
        if allowed:
            return None
        return (
            f"the HTTP API does not fetch from {registry_of(spec)}: only from the registries its "
            "operator allows (TRIALBUS_API_DATASET_REGISTRIES); submit the manifest with "
            "`trialbus submit`, which fetches on your machine, or upload the tasks "
            "(POST /tasks) and list them by name and checksum"
        )


def dataset_indexes(manifest: ExperimentManifest) -> list[int]:
    """Indexes of the manifest's ``tasks`` entries that are registry datasets."""
    return [i for i, spec in enumerate(manifest.tasks) if isinstance(spec, DatasetRef)]


async def fetch_datasets(
    manifest: ExperimentManifest,
    base_dir: Path,
    cache_dir: Path | None,
    say: Callable[[str], None] | None = None,
    allowed: AllowedRegistries | None = None,
) -> dict[int, list[Path]]:
    """Download every dataset entry's tasks (``cache_dir``: where; None: Harbor's task
    cache, shared with ``harbor download``) and return their folders; raise
    ManifestError naming the entry, the dataset and what went wrong. ``say`` gets one
    line per dataset: its tasks, how many were downloaded, how long it took. With
    ``allowed`` (the HTTP API's), every entry's registry is checked against it before
    anything is fetched."""
    entries: list[tuple[int, DatasetRef, str, Path | None]] = []
    for i in dataset_indexes(manifest):
        spec = manifest.tasks[i]
        assert isinstance(spec, DatasetRef)
        where = f"tasks[{i}]: dataset {spec.dataset!r}"
        registry_path = (
            None if spec.registry_path is None else (base_dir / spec.registry_path).resolve()
        )
        if allowed is not None and (why := allowed.refusal(spec, registry_path)) is not None:
            raise ManifestError(f"{where}: {why}")
        entries.append((i, spec, where, registry_path))
    fetched: dict[int, list[Path]] = {}
    for i, spec, where, registry_path in entries:
        started = time.monotonic()
        fetched[i], downloaded = await _fetch(spec, registry_path, cache_dir, where)
        if say is not None:
            n = len(fetched[i])
            say(
                f"dataset {spec.dataset}: {n} tasks, {downloaded} downloaded, "
                f"{n - downloaded} already in the cache ({time.monotonic() - started:.1f} s)"
            )
    return fetched


_FETCHING = threading.Lock()
"""One blocking fetch at a time per process: two requests fetching the same task into
the cache at once would replace each other's folder while it is read."""
FETCH_WAIT_S = 30.0
"""How long a request waits for another's fetch before it is answered "busy" (a
worker thread is held meanwhile: a queue of waiting requests would hold them all)."""


class DatasetsBusy(TransientError):
    """Another request's datasets are being fetched; try again shortly (HTTP 503)."""


def fetch_datasets_blocking(
    manifest: ExperimentManifest,
    base_dir: Path,
    cache_dir: Path | None,
    allowed: AllowedRegistries,
) -> dict[int, list[Path]]:
    """``fetch_datasets`` from a worker thread (the HTTP API's request threads), one at
    a time, held to ``allowed``; DatasetsBusy after ``FETCH_WAIT_S`` behind another."""
    if not _FETCHING.acquire(timeout=FETCH_WAIT_S):
        raise DatasetsBusy(
            f"another request's registry datasets are being fetched (for over "
            f"{FETCH_WAIT_S:g} s): try again shortly; a dataset fetched once is then "
            "read from the cache"
        )
    try:
        return asyncio.run(fetch_datasets(manifest, base_dir, cache_dir, allowed=allowed))
    finally:
        _FETCHING.release()


async def _fetch(
    spec: DatasetRef, registry_path: Path | None, cache_dir: Path | None, where: str
) -> tuple[list[Path], int]:
    """The dataset's task folders, and how many of them were downloaded now."""
    # Imported here: Harbor's registry modules are only needed by a dataset entry.
    from harbor.models.job.config import DatasetConfig
    from harbor.tasks.client import TaskClient

    name, _, version = spec.dataset.partition("@")
    _check_registry_file(spec, registry_path, where)
    try:
        config = DatasetConfig(
            name=name,
            version=version or None,
            registry_path=registry_path,
            registry_url=spec.registry_url,
            task_names=spec.task_names,
            exclude_task_names=spec.exclude_task_names,
            n_tasks=spec.n_tasks,
        )
        task_configs = await config.get_task_configs()
    except Exception as exc:  # noqa: BLE001 - any failure of the registry read, named
        cause = exc.__cause__ or exc.__context__
        if type(exc) is ValueError and cause is None:  # the registry's answer
            not_found = "not found" in str(exc)
            known = await _known_datasets(spec.registry_url, registry_path) if not_found else ""
            raise ManifestError(f"{where}: {_first_line(exc)}{known}") from None
        # Harbor wraps a failed request in a plain ValueError: name what failed.
        failure = cause if type(exc) is ValueError and cause is not None else exc
        raise ManifestError(
            f"{where}: the registry could not be read ({_registry_named(spec)}): "
            f"{type(failure).__name__}: {_first_line(failure)}"
        ) from None
    if not task_configs:
        raise ManifestError(f"{where}: the dataset lists no tasks")
    task_ids = [c.get_task_id() for c in task_configs]
    try:
        result = await TaskClient().download_tasks(task_ids, output_dir=cache_dir)
    except subprocess.CalledProcessError as exc:
        raise ManifestError(f"{where}: {_git_failure(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - any failure of the download, named
        raise ManifestError(
            f"{where}: its tasks could not be downloaded: {type(exc).__name__}: {_first_line(exc)}"
        ) from None
    return list(result.paths), sum(not r.cached for r in result.results)


def _check_registry_file(spec: DatasetRef, path: Path | None, where: str) -> None:
    """Raise ManifestError when the file ``registry_path`` leads to (``path``) is none."""
    if path is not None and not path.is_file():
        raise ManifestError(
            f"{where}: registry_path {spec.registry_path!r}: no file at {path} (a Harbor "
            "registry JSON file, relative to the manifest)"
        )


async def _known_datasets(url: str | None, path: Path | None) -> str:
    """ "; the registry has: a@1, b@2, ..." to follow a "not found", or "" when the
    registry cannot list them."""
    from harbor.registry.client.factory import RegistryClientFactory

    try:
        client = RegistryClientFactory.create(registry_url=url, registry_path=path)
        summaries = await client.list_datasets()
    except Exception:  # noqa: BLE001 - a hint only: without it the error still stands
        return ""
    names = sorted(f"{s.name}@{s.version}" if s.version else s.name for s in summaries)
    if not names:
        return "; the registry lists no dataset"
    more = f", ... ({len(names)} in all)" if len(names) > REGISTRY_NAMES_SHOWN else ""
    return f"; the registry has: {', '.join(names[:REGISTRY_NAMES_SHOWN])}{more}"


def registry_of(spec: DatasetRef) -> str:
    """The registry a dataset entry names, as messages name it."""
    if spec.registry_path is not None:
        return f"registry_path {spec.registry_path!r}"
    if spec.registry_url is not None:
        return f"registry_url {spec.registry_url!r}"
    return "Harbor's registry"


def _registry_named(spec: DatasetRef) -> str:
    """``registry_of``, with what reaching Harbor's registry takes."""
    if spec.registry_path is None and spec.registry_url is None:
        return (
            f"{registry_of(spec)}: it needs network access, or download the dataset with "
            "`harbor download` and list its task folders instead"
        )
    return registry_of(spec)


def _git_failure(exc: subprocess.CalledProcessError) -> str:
    """What git said when a task's repository could not be fetched."""
    said = exc.stderr.decode("utf-8", "replace") if isinstance(exc.stderr, bytes) else ""
    last = [line for line in said.splitlines() if line.strip()][-1:] or ["(no message)"]
    command = " ".join(str(a) for a in exc.cmd[:3]) if isinstance(exc.cmd, list) else "git"
    return f"a task repository could not be fetched: `{command} ...` failed: {last[0].strip()}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0] if isinstance(exc, ValidationError) else text
