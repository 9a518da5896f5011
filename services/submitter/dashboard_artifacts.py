"""A trial's stored folder on the dashboard: the archive and its files, for download.

``GET /ui/experiments/{exp}/trials/{trial}/archive`` answers the stored .tar.gz (the
ObjectRef of the trial's record, ``artifacts.archive``, in the results bucket, checked
against its sha256 as every reader does); ``.../files/{path}`` one regular file out of
it. Both are behind the dashboard's guard (a token, or the session cookie on GET),
name the experiment so a link cannot serve another experiment's trial, are always
attachments (``Content-Disposition`` with a safe name: an HTML file in a trial folder
never runs on this origin) and bounded in size. Whatever is missing is a 404 naming
it: the trial, its record, its archive, the object, or the file.

The folder was redacted when the runner packed it (services.common.trial_folders), so
these serve nothing the importer does not already read. The submitter's NATS user may
read the results bucket, never write it (infra/nats_permissions.py).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from schemas.objects import ObjectRef
from schemas.record import TrialRecord
from services.common.errors import ObjectCorrupt, ObjectMissing, TrialbusError
from services.common.logging import get_logger
from services.reports import queries
from services.submitter import dashboard_trial as trial_files
from services.submitter.live_feeds import valid_experiment_id, valid_trial_id

log = get_logger(__name__)

Render = Callable[..., HTMLResponse]


class Refusal(Exception):
    """A download that cannot be served: the status and the sentence saying why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def trial_base_url(experiment_id: str, trial_id: str) -> str:
    """Where a trial's downloads live."""
    return f"/ui/experiments/{quote(experiment_id, safe='')}/trials/{quote(trial_id, safe='')}"


def file_url(experiment_id: str, trial_id: str, path: str) -> str:
    """One archived file's download link."""
    return f"{trial_base_url(experiment_id, trial_id)}/files/{quote(path, safe='/')}"


def archive_of(record: TrialRecord, bucket: str) -> ObjectRef:
    """The record's stored archive in ``bucket``; Refusal 404 naming what is missing."""
    ref = record.artifacts.archive
    if ref is None:
        raise Refusal(
            404,
            f"trial {record.trial_id!r} has no stored archive (a trial imported from a "
            "job folder, or an attempt that left no folder, has none)",
        )
    if ref.bucket != bucket:
        raise Refusal(
            404, f"trial {record.trial_id!r}'s archive is in bucket {ref.bucket!r}, not {bucket!r}"
        )
    if ref.size > trial_files.DOWNLOAD_MAX_BYTES:
        raise Refusal(
            413,
            f"trial {record.trial_id!r}'s archive is {ref.size} bytes, over the dashboard's "
            f"{trial_files.DOWNLOAD_MAX_BYTES}-byte download limit",
        )
    return ref


async def _record(request: Request, experiment_id: str, trial_id: str) -> TrialRecord:
    if not valid_experiment_id(experiment_id) or not valid_trial_id(trial_id):
        raise Refusal(404, f"{experiment_id!r} / {trial_id!r} is not an experiment / trial id")
    record = await queries.trial_record(request.app.state.ports.ledger, trial_id)
    if record is None:
        raise Refusal(404, f"no record of trial {trial_id!r} in the ledger (yet)")
    if record.experiment_id != experiment_id:
        raise Refusal(404, f"trial {trial_id!r} is not a trial of experiment {experiment_id!r}")
    return record


async def _fetch(request: Request, record: TrialRecord) -> tuple[ObjectRef, bytes]:
    try:
        store = await request.app.state.nats.results()
    except TrialbusError as exc:  # NATS away, or a user without the bucket's read right
        raise Refusal(503, f"the results bucket cannot be read now: {exc}") from None
    ref = archive_of(record, store.bucket)
    try:
        return ref, await store.get(ref)
    except ObjectMissing:
        raise Refusal(
            404,
            f"trial {record.trial_id!r}'s archive {ref.name!r} is no longer in bucket "
            f"{ref.bucket!r} (the results bucket keeps folders for a limited time)",
        ) from None
    except ObjectCorrupt as exc:
        log.warning("stored archive corrupt", trial_id=record.trial_id, error=str(exc))
        raise Refusal(502, f"trial {record.trial_id!r}'s archive is corrupt: {exc}") from None
    except TrialbusError as exc:
        raise Refusal(503, f"the results bucket cannot be read now: {exc}") from None


LISTING_CACHE_FILES = 20_000
"""Listed files the trial page's cache holds at most, over all its archives (an entry
weighs its files + 1; a full listing is ``FILES_LISTED_MAX``): a few MiB."""

Listing = tuple[list[trial_files.ArchivedFile], bool]


class ListingCache:
    """Archive listings by the archive's sha256 (its ObjectRef's digest), least
    recently used out first past ``max_files``.

    An object's bytes never change under its digest, so a listing never goes stale:
    a trial page viewed again lists its folder without fetching the archive from the
    results bucket (up to 16 MiB) and unpacking it. Only listings of bytes that were
    fetched and checked against the digest are kept; a refusal (missing, bucket away)
    is not, so the next view tries again. What a cached listing cannot know is that
    retention has since removed the object: its download links then answer 404.
    """

    def __init__(self, max_files: int = LISTING_CACHE_FILES) -> None:
        self._max = max_files
        self._entries: OrderedDict[str, Listing] = OrderedDict()
        self._weight = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, sha256: str) -> Listing | None:
        """The listing of the archive with this digest, if kept (now the most recent)."""
        found = self._entries.get(sha256)
        if found is None:
            self.misses += 1
            return None
        self._entries.move_to_end(sha256)
        self.hits += 1
        return found

    def put(self, sha256: str, listing: Listing) -> None:
        """Keep ``listing``; drop the least recently used past the bound."""
        if sha256 in self._entries:
            return
        self._entries[sha256] = listing
        self._weight += len(listing[0]) + 1
        while self._weight > self._max and len(self._entries) > 1:
            _, dropped = self._entries.popitem(last=False)
            self._weight -= len(dropped[0]) + 1


async def archive_listing(
    request: Request, record: TrialRecord, cache: ListingCache
) -> dict[str, Any]:
    """The trial page's "Stored folder" part: the archive's link and size, and its
    files (when the archive is small enough to open for a page), or why not;
    ``cache``: listings already made, by digest."""
    ref = record.artifacts.archive
    if ref is None:
        return {"archive": None, "files": [], "note": "No stored folder for this trial."}
    base = trial_base_url(record.experiment_id, record.trial_id)
    out: dict[str, Any] = {
        "archive": {"url": f"{base}/archive", "size": ref.size, "name": ref.name},
        "files": [],
        "note": "",
    }
    if ref.size > trial_files.LIST_MAX_BYTES:
        out["note"] = f"The archive is {ref.size} bytes: download it to see its files."
        return out
    listing = cache.get(ref.sha256)
    if listing is None:
        try:
            _, data = await _fetch(request, record)
            listing = await asyncio.to_thread(trial_files.archive_files, data)
        except Refusal as exc:
            out["note"] = str(exc)
            return out
        except trial_files.ArchiveUnreadable as exc:
            out["note"] = f"The archive cannot be listed: {exc}."
            return out
        cache.put(ref.sha256, listing)
    files, more = listing
    out["files"] = [
        {
            "path": f.path,
            "size": f.size,
            "url": file_url(record.experiment_id, record.trial_id, f.path),
        }
        for f in files
    ]
    if more:
        out["note"] = f"The first {len(files)} files are listed; the archive holds them all."
    return out


def build_artifact_routes(render: Render, headers: dict[str, str]) -> APIRouter:
    """The download routes (included under ``/ui`` by the dashboard); ``render``: the
    dashboard's page renderer, for the refusals; ``headers``: its security headers."""
    router = APIRouter()

    def refused(request: Request, exc: Refusal) -> HTMLResponse:
        title = {404: "Not found", 413: "Too large", 503: "Unavailable"}.get(
            exc.status, "Cannot serve"
        )
        return render("message.html", request, exc.status, title=title, message=str(exc))

    def download(body: bytes, name: str, media_type: str) -> Response:
        sent = {**headers, "Content-Disposition": trial_files.attachment(name)}
        return Response(body, media_type=media_type, headers=sent)

    @router.get("/experiments/{experiment_id}/trials/{trial_id}/archive")
    async def archive(request: Request, experiment_id: str, trial_id: str) -> Response:
        try:
            record = await _record(request, experiment_id, trial_id)
            _, data = await _fetch(request, record)
        except Refusal as exc:
            return refused(request, exc)
        return download(data, f"{trial_id}.tar.gz", "application/gzip")

    @router.get("/experiments/{experiment_id}/trials/{trial_id}/files/{path:path}")
    async def archived_file(
        request: Request, experiment_id: str, trial_id: str, path: str
    ) -> Response:
        try:
            record = await _record(request, experiment_id, trial_id)
            _, data = await _fetch(request, record)
            body = await asyncio.to_thread(trial_files.archive_member, data, path)
        except Refusal as exc:
            return refused(request, exc)
        except trial_files.FileTooLarge as exc:
            return refused(request, Refusal(413, str(exc)))
        except trial_files.ArchiveUnreadable as exc:
            return refused(request, Refusal(502, f"trial {trial_id!r}'s archive is {exc}"))
        if body is None:
            return refused(
                request, Refusal(404, f"no file {path!r} in trial {trial_id!r}'s stored archive")
            )
        return download(body, path, "application/octet-stream")

    return router
