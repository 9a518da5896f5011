"""The counts fair share reads from the bus (services/runner/fair_share.py), over nats-py.

Two ``STREAM.INFO`` requests with a subjects filter, rights every runner already has:
the work stream's messages per subject of one pool, and the leases bucket's share
marks of that pool (a released mark is purged, so it leaves no message).
"""

from __future__ import annotations

from nats.js import JetStreamContext

from infra.nats_permissions import kv_stream
from schemas.subjects import Topology
from services.common.fair_share import SHARE_MARK


class NatsPoolLoad:
    """``PoolLoad`` over one JetStream context."""

    def __init__(self, js: JetStreamContext, topology: Topology) -> None:
        self._js = js
        self._topology = topology

    async def work_counts(self, pool: str) -> dict[str, int]:
        """Messages per work subject of ``pool``."""
        topo = self._topology
        info = await self._js.stream_info(
            topo.work_stream, subjects_filter=topo.work_pool_filter(pool)
        )
        return dict(info.state.subjects or {})

    async def share_marks(self, pool: str) -> dict[str, int]:
        """Share marks of ``pool``: key relative to the bucket -> messages."""
        bucket = self._topology.leases_bucket
        head = f"$KV.{bucket}."
        info = await self._js.stream_info(
            kv_stream(bucket), subjects_filter=f"{head}{SHARE_MARK}.{pool}.>"
        )
        return {s[len(head) :]: n for s, n in (info.state.subjects or {}).items()}
