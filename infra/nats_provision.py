"""Everything a trialbus installation keeps in JetStream, created once by the admin role.

With per-role NATS users (infra.nats_auth) only ``admin`` may create streams, buckets
and consumers. The services still call ``ensure_streams`` / ``NatsCoordinator.open`` /
``ensure_runner_consumers`` / FastStream's durable subscribe, but against objects that
already exist those only look (STREAM.INFO, CONSUMER.INFO), which their roles may do.
So ``trialbus up`` (or a compose init step) runs :func:`provision` as admin before
starting any service.
"""

from __future__ import annotations

from collections.abc import Sequence

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    ObjectStoreConfig,
    StorageType,
)
from nats.js.errors import BucketNotFoundError, NotFoundError

from schemas.subjects import DEFAULT_POOL, Topology
from services.common.adapters.jetstream import ensure_streams, kv_config
from services.common.logging import get_logger
from services.common.priority import DEFAULT_PRIORITY_CLASSES, PriorityClasses
from services.importer.handlers import importer_filters
from services.runner.durables import consumer_filters, ensure_runner_durables

log = get_logger(__name__)

EVENTS_ACK_WAIT_S = 10.0
"""ack_wait of the importer's and watcher's durables (their apps' ACK_WAIT_S)."""


def events_durable_configs(topology: Topology) -> list[ConsumerConfig]:
    """The importer's and watcher's durables on the events stream.

    Mirrors the ``ConsumerConfig`` their FastStream subscribers pass (services/importer
    and services/watcher app.py): FastStream binds to an existing durable without
    updating it, so these values are the ones in force. The importer takes only the
    events it acts on (``importer_filters``); the watcher, every event.
    """
    return [
        _events_durable(
            topology,
            topology.importer_durable,
            max_ack_pending=50_000,
            filters=importer_filters(topology),
        ),
        _events_durable(
            topology,
            topology.watcher_durable,
            max_ack_pending=None,
            filters=[topology.event_filter()],
        ),
    ]


def _events_durable(
    topology: Topology, durable: str, *, max_ack_pending: int | None, filters: list[str]
) -> ConsumerConfig:
    # One filter goes in filter_subject, as durables were made before the importer's
    # was narrowed: a watcher durable provisioned then compares equal and is left alone.
    return ConsumerConfig(
        name=durable,
        durable_name=durable,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        filter_subject=filters[0] if len(filters) == 1 else None,
        filter_subjects=filters if len(filters) > 1 else None,
        ack_wait=EVENTS_ACK_WAIT_S,
        max_deliver=-1,
        max_ack_pending=max_ack_pending,
    )


async def provision(
    js: JetStreamContext,
    topology: Topology,
    *,
    lease_ttl_s: float,
    runner_ack_wait_s: float,
    runners_ttl_s: float | None = None,
    replicas: int = 1,
    pools: Sequence[str] = (DEFAULT_POOL,),
    classes: PriorityClasses = DEFAULT_PRIORITY_CLASSES,
) -> None:
    """Create the streams, buckets and durables that are missing; leave the rest alone.

    ``lease_ttl_s`` and ``runner_ack_wait_s`` are the runners' ``ack_wait_s`` (a lease
    lives as long as an unacknowledged trial); ``runners_ttl_s`` (default: the lease
    TTL) is how long a silent runner's registry record stays (about three heartbeats,
    see services.common.adapters.nats_registry). ``pools`` get one runner durable each
    (runners may not create their own) per priority class of ``classes`` (default:
    services.common.priority's defaults).
    """
    await ensure_streams(js, topology, replicas)
    for bucket, ttl in (
        (topology.leases_bucket, lease_ttl_s),
        (topology.control_bucket, None),
        (topology.runners_bucket, runners_ttl_s if runners_ttl_s is not None else lease_ttl_s),
    ):
        try:
            await js.key_value(bucket)
        except BucketNotFoundError:
            await js.create_key_value(kv_config(bucket, ttl_s=ttl, replicas=replicas))
            log.info("bucket created", bucket=bucket)
    for bucket in (topology.tasks_bucket, topology.results_bucket):
        try:
            await js.object_store(bucket)
        except BucketNotFoundError:
            await js.create_object_store(
                bucket, ObjectStoreConfig(storage=StorageType.FILE, replicas=replicas)
            )
            log.info("object store created", bucket=bucket)
    await ensure_runner_durables(js, topology, runner_ack_wait_s, pools, classes)
    for config in events_durable_configs(topology):
        await _ensure_events_durable(js, topology, config)


async def _ensure_events_durable(
    js: JetStreamContext, topology: Topology, config: ConsumerConfig
) -> None:
    """Create the durable when missing; re-filter it when its filters are not ours
    (an importer durable from before it was narrowed took every event)."""
    assert config.durable_name is not None
    wanted = sorted(config.filter_subjects or [config.filter_subject or ""])
    try:
        info = await js.consumer_info(topology.events_stream, config.durable_name)
    except NotFoundError:
        await js.add_consumer(topology.events_stream, config)
        log.info("consumer created", durable=config.durable_name)
        return
    if consumer_filters(info) != wanted:
        # An update keeps the durable's position and its pending messages: events
        # already delivered are still acknowledged, and none after it is skipped.
        await js.add_consumer(topology.events_stream, config)
        log.warning(
            "events durable re-filtered",
            durable=config.durable_name,
            was=consumer_filters(info),
            now=wanted,
        )
