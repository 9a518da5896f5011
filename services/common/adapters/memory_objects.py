"""InMemoryObjectStore: the ObjectStore port held in a dict, for unit tests.

Same semantics as NatsObjectStore (tests/integration/test_object_store.py runs one
contract against both): a put of an existing name with the same sha256 writes nothing,
``get`` verifies size and sha256 against the reference (ObjectCorrupt) and raises
ObjectMissing for an absent object, a put past the bucket's ``max_bytes`` raises
TransientError and stores nothing. Retention (TTL) is not emulated.
"""

from __future__ import annotations

import hashlib

from schemas.objects import ObjectRef
from services.common.errors import InternalError, ObjectCorrupt, ObjectMissing, TransientError


class InMemoryObjectStore:
    """The ObjectStore port over a dict; counts puts and gets for tests."""

    def __init__(self, bucket: str = "MEMORY_OBJECTS", *, max_bytes: int | None = None) -> None:
        self._bucket = bucket
        self._max_bytes = max_bytes
        self._objects: dict[str, bytes] = {}
        self.puts = 0
        """Puts that wrote bytes (a same-content put is not counted)."""
        self.gets = 0
        """Gets that returned bytes."""

    @property
    def bucket(self) -> str:
        """The bucket's name (as ObjectRef.bucket)."""
        return self._bucket

    def _ref(self, name: str, data: bytes) -> ObjectRef:
        return ObjectRef(
            bucket=self._bucket, name=name, size=len(data), sha256=hashlib.sha256(data).hexdigest()
        )

    async def put(self, name: str, data: bytes) -> ObjectRef:
        """Store ``data`` under ``name`` (replacing it) and return its reference."""
        ref = self._ref(name, data)
        existing = self._objects.get(name)
        if existing is not None and hashlib.sha256(existing).hexdigest() == ref.sha256:
            return ref
        used = sum(len(v) for k, v in self._objects.items() if k != name)
        if self._max_bytes is not None and used + len(data) > self._max_bytes:
            raise TransientError(
                f"object store bucket {self._bucket} is full ({self._max_bytes} bytes): "
                f"{name} ({len(data)} bytes) not stored"
            )
        self._objects[name] = bytes(data)
        self.puts += 1
        return ref

    async def get(self, ref: ObjectRef) -> bytes:
        """The object's bytes; raises ObjectMissing or ObjectCorrupt (sha256/size differ)."""
        if ref.bucket != self._bucket:
            raise InternalError(f"reference to bucket {ref.bucket} given to bucket {self._bucket}")
        data = self._objects.get(ref.name)
        if data is None:
            raise ObjectMissing(f"{ref.bucket}/{ref.name}: no such object")
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
            raise ObjectCorrupt(
                f"{ref.bucket}/{ref.name}: stored bytes differ from the reference "
                f"(size {len(data)} vs {ref.size})"
            )
        self.gets += 1
        return data

    async def info(self, name: str) -> ObjectRef | None:
        """The stored object's reference, or None when there is none."""
        data = self._objects.get(name)
        return None if data is None else self._ref(name, data)

    async def delete(self, name: str) -> None:
        """Remove an object (a missing one is not an error)."""
        self._objects.pop(name, None)

    def tamper(self, name: str) -> None:
        """Flip the stored bytes' last bit without updating anything (test helper)."""
        data = bytearray(self._objects[name])
        data[-1] ^= 1
        self._objects[name] = bytes(data)
