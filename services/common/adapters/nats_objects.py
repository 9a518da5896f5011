"""NatsObjectStore: the ObjectStore port over a JetStream object store bucket.

Longer than 350 lines because it writes and reads nats-py's object-store wire format
itself (one lookup per put, direct gets with the subject in the body: the reasons are
below), and that format is one unit.

nats-py splits an object into 128 KiB chunks on subject ``$O.<bucket>.C.<nuid>`` and
keeps its metadata (size, ``SHA-256=<urlsafe base64>`` digest) on ``$O.<bucket>.M.<name>``
of the stream ``OBJ_<bucket>``. Beyond the library this adapter:

- turns the digest into the hex sha256 of ObjectRef, and skips a put whose name already
  holds the same bytes (task archives are named by checksum: uploaded once);
- writes objects in nats-py's format (chunks on a fresh nuid, the meta entry with a
  rollup, a replaced object's chunks purged) with ONE meta lookup (nats-py's put looks
  again after ours: a round trip per trial folder), or none in a bucket of new names
  (``new_names``: trial folders, named by run and attempt): the meta entry is written
  on condition that the name holds none, and only a taken name is looked up; reads the
  meta by direct get;
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
import json
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from nats.errors import ConnectionClosedError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import Header, ObjectInfo, ObjectMetaOptions, ObjectStoreConfig, StorageType
from nats.js.errors import (
    APIError,
    BadRequestError,
    BucketNotFoundError,
    NotFoundError,
    ObjectNotFoundError,
    ServiceUnavailableError,
)
from nats.js.manager import JetStreamManager
from nats.js.object_store import (
    OBJ_CHUNKS_PRE_TEMPLATE,
    OBJ_DEFAULT_CHUNK_SIZE,
    OBJ_DIGEST_TEMPLATE,
    OBJ_META_PRE_TEMPLATE,
)
from nats.js.object_store import ObjectStore as JsObjectStore
from nats.nuid import NUID

from schemas.objects import ObjectRef
from services.common.adapters.jetstream import await_leader, created_meanwhile
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
# The meta entry replaces the subject's previous one (nats-py's put sends the same).
_ROLLUP: dict[str, Any] = {Header.ROLLUP.value: "sub"}
# ... and, for a name expected new, only if the subject holds no meta entry yet.
_ROLLUP_IF_NEW: dict[str, Any] = {**_ROLLUP, Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: "0"}
# JetStream's "wrong last sequence" (10071; 10164 from newer servers): the name is taken.
_NAME_TAKEN = (10071, 10164)


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
        self,
        js: JetStreamContext,
        store: JsObjectStore,
        bucket: str,
        *,
        timeout_s: float = 60.0,
        new_names: bool = False,
    ) -> None:
        self._js = js
        self._store = store
        self._bucket = bucket
        self._stream = f"OBJ_{bucket}"
        self._timeout_s = timeout_s
        # Names are expected new (trial folders: one per run and attempt): a put writes
        # without looking first, and looks only when the name turns out taken. A
        # bucket of re-used names (task archives, by checksum) looks first, so an
        # archive already stored is not uploaded again.
        self._new_names = new_names
        self._nuid = NUID()

    @classmethod
    async def open(
        cls,
        js: JetStreamContext,
        bucket: str,
        *,
        create: BucketSettings | None = None,
        timeout_s: float = 60.0,
        new_names: bool = False,
    ) -> NatsObjectStore:
        """Open ``bucket``; create it with ``create`` when missing (else TransientError).

        ``new_names``: its puts are expected to use names not stored yet (see the
        constructor): one round trip fewer per put, one more when a name is taken."""
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
                try:
                    store = await js.create_object_store(bucket, config=config)
                except BadRequestError as exc:
                    if not created_meanwhile(exc):
                        raise
                    store = await js.object_store(bucket)
        except _UNAVAILABLE as exc:
            raise TransientError(f"object store bucket {bucket}: {type(exc).__name__}") from exc
        await await_leader(js, f"OBJ_{bucket}")
        return cls(js, store, bucket, timeout_s=timeout_s, new_names=new_names)

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

        Round trips: the meta lookup, one acknowledged publish per 128 KiB chunk, the
        meta entry; a replaced object's chunks are purged afterwards. In a bucket of
        ``new_names`` the lookup is left out unless the name turns out taken (the
        conditional meta entry is refused; its chunks are purged, then as above). Not
        wrapped in a timeout: each publish has the JetStream timeout, and a put that
        fails midway purges the chunks it wrote (a cancellation would leak them).
        """
        digest = hashlib.sha256(data).digest()
        sha = digest.hex()
        try:
            ObjectRef(bucket=self._bucket, name=name, size=len(data), sha256=sha)
        except ValueError as exc:
            raise InternalError(f"invalid object name {name!r}: {exc}") from None
        where = f"{self._bucket}/{name}"
        if self._new_names:
            written = await self._guarded(
                where, name, len(data), self._write(name, data, digest, new=True)
            )
            if written is not None:
                return self._ref(written)
        try:
            existing: ObjectInfo | None = await self._store.get_info(name)
        except ObjectNotFoundError:
            existing = None
        except _UNAVAILABLE as exc:
            raise self._unavailable(where, "lookup failed", exc) from exc
        if existing is not None:
            ref = self._ref(existing)
            if ref.sha256 == sha and ref.size == len(data):
                return ref
        info = await self._guarded(where, name, len(data), self._write(name, data, digest))
        assert info is not None  # only a conditional write finds the name taken
        if existing is not None and existing.nuid:
            # The name now points at the new chunks; the old ones are garbage. A role
            # without the purge right (infra/nats_permissions.py) leaves them to the
            # bucket's retention, as nats-py's put did (its purge failed the same way).
            with contextlib.suppress(*_UNAVAILABLE, APIError):
                await self._js.purge_stream(
                    self._stream, subject=self._chunk_subject(existing.nuid)
                )
        return self._ref(info)

    async def _guarded(
        self, where: str, name: str, size: int, write: Awaitable[ObjectInfo | None]
    ) -> ObjectInfo | None:
        """``write``'s result, its failures turned into trialbus errors."""
        try:
            return await write
        except _UNAVAILABLE as exc:
            raise self._unavailable(where, "upload not confirmed", exc) from exc
        except APIError as exc:
            if exc.err_code in _STORE_FULL:
                raise TransientError(
                    f"object store bucket {self._bucket} is full ({exc.description}): {name} "
                    f"({size} bytes) not stored; raise the bucket's size setting or "
                    "shorten its retention"
                ) from exc
            if isinstance(exc, ServiceUnavailableError):
                raise TransientError(f"{where}: {exc.description}") from exc
            raise

    def _chunk_subject(self, nuid: str) -> str:
        return OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=self._bucket, obj=nuid)

    def _meta_subject(self, name: str) -> str:
        encoded = base64.urlsafe_b64encode(name.encode()).decode()
        return OBJ_META_PRE_TEMPLATE.format(bucket=self._bucket, obj=encoded)

    async def _write(
        self, name: str, data: bytes, digest: bytes, *, new: bool = False
    ) -> ObjectInfo | None:
        """Chunks on a fresh subject, then the meta entry naming them (nats-py's format).

        Until the meta entry is stored the old object (if any) stays what the name
        reads; on a failure the new chunks are purged (best effort) and it re-raises.
        ``new``: the meta entry is stored only if the name has none; None (the chunks
        purged) when it has.
        """
        nuid = self._nuid.next().decode()
        chunk_subject = self._chunk_subject(nuid)
        size = OBJ_DEFAULT_CHUNK_SIZE
        chunks = [data[i : i + size] for i in range(0, len(data), size)]
        info = ObjectInfo(
            name=name,
            bucket=self._bucket,
            nuid=nuid,
            size=len(data),
            chunks=len(chunks),
            digest=OBJ_DIGEST_TEMPLATE.format(digest=base64.urlsafe_b64encode(digest).decode()),
            mtime=datetime.now(UTC).isoformat(),
            options=ObjectMetaOptions(max_chunk_size=size),
        )
        try:
            for chunk in chunks:
                await self._js.publish(chunk_subject, chunk)
            meta = json.dumps(info.as_dict()).encode()
            headers = _ROLLUP_IF_NEW if new else _ROLLUP
            await self._js.publish(self._meta_subject(name), meta, headers=headers)
        except Exception as exc:
            with contextlib.suppress(Exception):  # cleanup: the put's own error is raised
                await self._js.purge_stream(self._stream, subject=chunk_subject)
            if new and isinstance(exc, APIError) and exc.err_code in _NAME_TAKEN:
                return None
            raise
        return info

    async def _meta(self, name: str) -> ObjectInfo:
        """The object's meta entry by a direct get; ObjectNotFoundError when none.

        The request names the subject in its body (``last_by_subj``), not in its own
        subject: the readers' right is ``DIRECT.GET.<stream>`` exactly.
        """
        # nats-py sends the body form only for sequence reads: its connection, API
        # prefix (domain) and timeout are private attributes of the context.
        js: Any = self._js
        body = json.dumps({"last_by_subj": self._meta_subject(name)}).encode()
        msg = await js._nc.request(f"{js._prefix}.DIRECT.GET.{self._stream}", body, js._timeout)
        try:
            raw = JetStreamManager._lift_msg_to_raw_msg(msg)  # a 404 status: NotFoundError
            info: ObjectInfo = ObjectInfo.from_response(json.loads(raw.data or b""))
        except NotFoundError:
            raise ObjectNotFoundError from None
        except (ValueError, TypeError, KeyError) as exc:
            raise ObjectCorrupt(f"{self._bucket}/{name}: unreadable meta entry: {exc}") from None
        if info.deleted:
            raise ObjectNotFoundError
        return info

    async def get(self, ref: ObjectRef) -> bytes:
        """The object's bytes; raises ObjectMissing or ObjectCorrupt (sha256/size differ)."""
        if ref.bucket != self._bucket:
            raise InternalError(f"reference to bucket {ref.bucket} given to bucket {self._bucket}")
        where = f"{ref.bucket}/{ref.name}"
        try:
            info = await self._meta(ref.name)
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
    # Trial folders are named by run and attempt: a put finds its name free.
    return await NatsObjectStore.open(js, bucket, create=limits, new_names=kind == "results")
