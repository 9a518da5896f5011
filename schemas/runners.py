"""What a runner says about itself in the runner registry (a KV bucket with a TTL).

Each runner process keeps one :class:`RunnerInfo` under the key ``<pool>.<runner_id>``
of ``Topology.runners_bucket``, rewritten every heartbeat; a runner that stops
heartbeating drops out when the bucket's max age passes. The submitter reads the live
records to refuse a manifest no live runner can run (services.common.pools).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from schemas.manifest import CAPABILITY_PATTERN
from schemas.subjects import DEFAULT_POOL, POOL_PATTERN, check_pool

RUNNER_ID_PATTERN = r"^[A-Za-z0-9_=-][A-Za-z0-9_.=-]{0,127}$"
"""A runner id is part of its registry key, which NATS KV limits to these characters."""


Capability = Annotated[str, Field(pattern=CAPABILITY_PATTERN)]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class RunnerInfo(BaseModel):
    """One live runner process: where it is, which pool it serves, what it can run."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    runner_id: str = Field(
        pattern=RUNNER_ID_PATTERN,
        description="The runner's id (settings.runner_id, default host-pid); unique.",
    )
    host: str = Field(max_length=255, description="Host name the runner runs on.")
    pool: str = Field(
        default=DEFAULT_POOL, pattern=POOL_PATTERN, description="Pool whose work it takes."
    )
    capabilities: list[Capability] = Field(
        default_factory=list,
        max_length=64,
        description="Environments it was found able to run (detected at start, e.g. "
        "'local' when bubblewrap works, 'docker' when the Docker daemon answers).",
    )
    labels: list[Capability] = Field(
        default_factory=list,
        max_length=64,
        description="Operator-declared capabilities (settings), e.g. 'gpu'.",
    )
    harbor_version: str | None = Field(
        default=None, max_length=64, description="Version of Harbor the runner uses."
    )
    concurrency: int = Field(ge=1, le=4096, description="Trials it runs at once.")
    started_at: AwareDatetime = Field(
        default_factory=_utcnow, description="When the runner process started (UTC)."
    )
    last_seen: AwareDatetime = Field(
        default_factory=_utcnow, description="When this record was written (UTC)."
    )

    @property
    def offers(self) -> frozenset[str]:
        """Everything a manifest's ``compute.requires`` may be matched against."""
        return frozenset(self.capabilities) | frozenset(self.labels)

    def seen_now(self) -> RunnerInfo:
        """This record with ``last_seen`` set to now (what a heartbeat writes)."""
        return self.model_copy(update={"last_seen": _utcnow()})


def registry_key(pool: str, runner_id: str) -> str:
    """Key of a runner's record in the runners bucket: ``<pool>.<runner_id>``.

    The pool comes first so a runner user's write right can be one pool's keys
    (infra/nats_permissions.py grants ``$KV.<bucket>.<pool>.>``).
    """
    if not re.match(RUNNER_ID_PATTERN, runner_id):
        raise ValueError(f"runner id {runner_id!r} must match {RUNNER_ID_PATTERN}")
    return f"{check_pool(pool)}.{runner_id}"


def check_capability(name: str) -> str:
    """Return ``name``, or raise ValueError when it cannot be a capability or label."""
    if not re.match(CAPABILITY_PATTERN, name):
        raise ValueError(
            f"capability {name!r} must match {CAPABILITY_PATTERN} (lowercase letters, "
            "digits, '_', '.', '-', starting with a letter, at most 32 characters)"
        )
    return name
