"""References to objects in a JetStream object store bucket.

Events never carry host paths (runners share no disk with the submitter or the
importer); they carry an ObjectRef: which bucket, which object, its size and sha256,
so the reader can fetch the bytes from any machine and verify them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from schemas.constraints import Count
from schemas.documented import DOCUMENTED

OBJECT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.=:/-]{0,254}$"
"""Object names trialbus writes: no spaces, no '..' segments (checked by the model)."""

SHA256_PATTERN = r"^[0-9a-f]{64}$"


class ObjectRef(BaseModel):
    """Where a stored object is and how to check it."""

    model_config = ConfigDict(frozen=True, extra="forbid", **DOCUMENTED)

    bucket: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """Object store bucket name."""
    name: str = Field(pattern=OBJECT_NAME_PATTERN)
    """Object name inside the bucket."""
    size: Count
    """Size of the object in bytes."""
    sha256: str = Field(pattern=SHA256_PATTERN)
    """sha256 of the object's bytes (lowercase hex)."""
