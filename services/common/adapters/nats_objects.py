"""NatsObjectStore: the ObjectStore port over a JetStream object store bucket.

nats-py splits an object into 128 KiB chunks on subject ``$O.<bucket>.C.<nuid>`` and
keeps its metadata (size, ``SHA-256=<urlsafe base64>`` digest) on ``$O.<bucket>.M.<name>``
of the stream ``OBJ_<bucket>``. Beyond the library this adapter:

- turns the digest into the hex sha256 of ObjectRef, and skips a put whose name already
  holds the same bytes (task archives are named by checksum: uploaded once);
- reads an object's chunks with direct gets (no consumer per read: nats-py's ordered
  consumers outlive the read, and ~1000 reads in a few seconds hit the stream's
  consumer limit), and verifies the bytes against the caller's reference (size and
  sha256): ObjectCorrupt whether the chunks were damaged or the name re-used;
- maps a missing object to ObjectMissing, timeouts and an unreachable server to
  TransientError, a full bucket (``max_bytes``, discard new) to TransientError naming
  the setting;
- creates the bucket, when asked, with file storage, its replicas, ``max_bytes`` and a
  TTL (retention); an existing bucket is used as it is (one owner configures it).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
from dataclasses import dataclass
from typing import Literal

from nats.errors import ConnectionClosedError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import ObjectInfo, ObjectStoreConfig, StorageType
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    NotFoundError,
    ObjectNotFoundError,
    ServiceUnavailableError,
)
from nats.js.object_store import ObjectStore as JsObjectStore

from schemas.objects import ObjectRef
from services.common.errors import (
    InternalError,
    ObjectAccessDenied,
    ObjectCorrupt,
    ObjectMissing,
    TransientError,
    TrialbusError,
)
from services.common.settings import CommonSettings

_UNAVAILABLE = (NatsTimeoutError, NoRespondersError, ConnectionClosedError, TimeoutError)
# JetStream's error codes for a stream at its max_bytes (discard=new: 10077, "maximum
# bytes exceeded") and for a server out of JetStream storage (10047).
_STORE_FULL = (10077, 10047)


@dataclass(frozen=True, slots=True)
class BucketSettings:
    """How a bucket is created when missing (retention and size are settings)."""

    max_bytes: int | None = None
    """Bucket size limit in bytes (None: unlimited); a put past it is refused."""
    ttl_s: float | None = None
    """Objects older than this are removed by the server (None: kept)."""
    replicas: int = 1
    description: str | None = None


class NatsObjectStore:
    """The ObjectStore port over one JetStream object store bucket."""

    def __init__(
        self, js: JetStreamContext, store: JsObjectStore, bucket: str, *, timeout_s: float = 60.0
    ) -> None:
        self._js = js
        self._store = store
        self._bucket = bucket
        self._stream = f"OBJ_{bucket}"
        self._timeout_s = timeout_s

    @classmethod
    async def open(
        cls,
        js: JetStreamContext,
        bucket: str,
        *,
        create: BucketSettings | None = None,
        timeout_s: float = 60.0,
    ) -> NatsObjectStore:
        """Open ``bucket``; create it with ``create`` when missing (else TransientError)."""
        try:
            try:
                store = await js.object_store(bucket)
            except BucketNotFoundError:
                if create is None:
                    raise TransientError(
                        f"object store bucket {bucket} does not exist (yet): the service "
                        "that owns it creates it on start"
                    ) from None
                config = ObjectStoreConfig(
                    bucket=bucket,
                    description=create.description,
                    ttl=create.ttl_s,
                    max_bytes=create.max_bytes,
                    storage=StorageType.FILE,
                    replicas=create.replicas,
                )
                store = await js.create_object_store(bucket, config=config)
        except _UNAVAILABLE as exc:
            raise TransientError(f"object store bucket {bucket}: {type(exc).__name__}") from exc
        return cls(js, store, bucket, timeout_s=timeout_s)

    @property
    def bucket(self) -> str:
        """The bucket's name (as ObjectRef.bucket)."""
        return self._bucket

    def _unavailable(self, where: str, what: str, exc: BaseException) -> TrialbusError:
        """A timeout, unless the server refused this bucket to our user meanwhile.

        A request the server refuses (permissions) gets no answer, only an -ERR that
        nats-py hands to the error callback and keeps as ``last_error``: without this
        check a missing right looks like an endless series of timeouts.
        """
        nc = getattr(self._js, "_nc", None)
        # nats-py keeps the server's -ERR lowercased.
        err = str(getattr(nc, "last_error", None) or "")
        low = err.lower()
        ours = self._stream.lower() in low or f"$o.{self._bucket.lower()}." in low
        if "permissions violation" in low and ours:
            return ObjectAccessDenied(
                f"{where}: {what} refused: the NATS user lacks a right on bucket "
                f"{self._bucket} (server said: {err.removeprefix('nats: ')}); see "
                "infra/nats_permissions.py for the role's rights"
            )
        return TransientError(f"{where}: {what}: {type(exc).__name__}")

    def _ref(self, info: ObjectInfo) -> ObjectRef:
        digest = (info.digest or "").partition("=")[2]
        return ObjectRef(
            bucket=self._bucket,
            name=info.name,
            size=info.size or 0,
            sha256=base64.urlsafe_b64decode(digest).hex()
            if digest
            else hashlib.sha256().hexdigest(),
        )

    async def put(self, name: str, data: bytes) -> ObjectRef:
        """Store ``data`` under ``name`` (replacing it) and return its reference.

        Not wrapped in a timeout: each chunk's publish has the JetStream timeout, and on
        an error nats-py purges the chunks it wrote (a cancellation would leak them).
        """
        sha = hashlib.sha256(data).hexdigest()
        try:
            ObjectRef(bucket=self._bucket, name=name, size=len(data), sha256=sha)
        except ValueError as exc:
            raise InternalError(f"invalid object name {name!r}: {exc}") from None
        existing = await self.info(name)
        if existing is not None and existing.sha256 == sha and existing.size == len(data):
            return existing
        try:
            info = await self._store.put(name, data)
        except _UNAVAILABLE as exc:
            raise self._unavailable(f"{self._bucket}/{name}", "upload not confirmed", exc) from exc
        except APIError as exc:
            if exc.err_code in _STORE_FULL:
                raise TransientError(
                    f"object store bucket {self._bucket} is full ({exc.description}): {name} "
                    f"({len(data)} bytes) not stored; raise the bucket's size setting or "
                    "shorten its retention"
                ) from exc
            if isinstance(exc, ServiceUnavailableError):
                raise TransientError(f"{self._bucket}/{name}: {exc.description}") from exc
            raise
        ref = self._ref(info)
        if ref.sha256 != sha:
            raise ObjectCorrupt(f"{self._bucket}/{name}: stored digest differs from the data")
        return ref

    async def get(self, ref: ObjectRef) -> bytes:
        """The object's bytes; raises ObjectMissing or ObjectCorrupt (sha256/size differ)."""
        if ref.bucket != self._bucket:
            raise InternalError(f"reference to bucket {ref.bucket} given to bucket {self._bucket}")
        where = f"{ref.bucket}/{ref.name}"
        try:
            info = await self._store.get_info(ref.name)
            data = await asyncio.wait_for(self._chunks(info, where), self._timeout_s)
        except ObjectNotFoundError:
            raise ObjectMissing(
                f"{where}: no such object (never stored, deleted or expired)"
            ) from None
        except _UNAVAILABLE as exc:
            raise self._unavailable(where, "download failed", exc) from exc
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
            stored = self._ref(info)
            damaged = len(data) != stored.size or hashlib.sha256(data).hexdigest() != stored.sha256
            raise ObjectCorrupt(
                f"{where}: "
                + ("stored chunks do not match the object's digest" if damaged else "replaced")
                + f"; fetched {len(data)} bytes, the reference names {ref.size} bytes "
                f"with sha256 {ref.sha256[:12]}..."
            )
        return data

    async def _chunks(self, info: ObjectInfo, where: str) -> bytes:
        # Chunk by chunk with direct gets: nats-py's own get subscribes an ordered
        # consumer per object, and those linger after use, so about a thousand gets
        # within their inactivity window exhaust the stream's consumer limit.
        subject = f"$O.{self._bucket}.C.{info.nuid}"
        parts: list[bytes] = []
        seq = 1
        for _ in range(info.chunks or 0):
            try:
                msg = await self._js.get_msg(
                    self._stream, seq=seq, subject=subject, next=True, direct=True
                )
            except NotFoundError:
                raise ObjectMissing(
                    f"{where}: its data is gone (retention expired or purged)"
                ) from None
            parts.append(msg.data or b"")
            seq = (msg.seq or seq) + 1
        return b"".join(parts)

    async def info(self, name: str) -> ObjectRef | None:
        """The stored object's reference, or None when there is none."""
        try:
            return self._ref(await self._store.get_info(name))
        except ObjectNotFoundError:
            return None
        except _UNAVAILABLE as exc:
            raise self._unavailable(f"{self._bucket}/{name}", "lookup failed", exc) from exc

    async def delete(self, name: str) -> None:
        """Remove an object (a missing one is not an error)."""
        try:
            with contextlib.suppress(ObjectNotFoundError):
                await self._store.delete(name)
        except _UNAVAILABLE as exc:
            raise self._unavailable(f"{self._bucket}/{name}", "delete failed", exc) from exc


async def open_bucket(
    js: JetStreamContext, settings: CommonSettings, kind: Literal["tasks", "results"]
) -> NatsObjectStore:
    """The tasks or results bucket of ``settings``' topology, created when missing.

    Where one NATS user per role is in force, the admin creates both buckets when the
    stack is provisioned (infra/nats_provision.py) and the roles only open them.
    """
    topology = settings.topology
    if kind == "tasks":
        bucket, limits = (
            topology.tasks_bucket,
            BucketSettings(
                max_bytes=settings.tasks_bucket_max_bytes,
                replicas=settings.stream_replicas,
                description="trialbus task archives, named by content checksum",
            ),
        )
    else:
        bucket, limits = (
            topology.results_bucket,
            BucketSettings(
                max_bytes=settings.results_bucket_max_bytes,
                ttl_s=settings.results_ttl_s,
                replicas=settings.stream_replicas,
                description="trialbus trial folders, named by run and attempt",
            ),
        )
    return await NatsObjectStore.open(js, bucket, create=limits)
