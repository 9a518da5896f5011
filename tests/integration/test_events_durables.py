"""The importer's durable on a real nats-server: only the events it acts on reach it.

An installation from before the filter has an importer durable that takes every
event; provisioning again narrows it in place, and what it already held is kept:
the event it delivered and was not yet acknowledged stays acknowledgeable, and
nothing after its position is skipped.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import ConsumerConfig

from infra.nats_provision import events_durable_configs, provision
from schemas.subjects import Topology
from services.common.adapters.jetstream import ensure_streams
from services.importer.handlers import importer_filters

pytestmark = pytest.mark.integration


def _unfiltered_importer(topo: Topology) -> ConsumerConfig:
    """The importer's durable as trialbus made it before the filter: every event."""
    importer = events_durable_configs(topo)[0]
    return dataclasses.replace(importer, filter_subjects=None, filter_subject=topo.event_filter())


async def _publish(nc: NatsClient, topo: Topology, *types: str) -> None:
    js = nc.jetstream()
    for event_type in types:
        await js.publish(topo.event_subject(event_type, "exp1"), event_type.encode())


async def _fetch_all(nc: NatsClient, topo: Topology) -> list[bytes]:
    psub = await nc.jetstream().pull_subscribe_bind(
        topo.importer_durable, stream=topo.events_stream
    )
    got: list[bytes] = []
    try:
        while True:
            msgs = await psub.fetch(batch=50, timeout=1)
            for m in msgs:
                await m.ack()
            got += [m.data for m in msgs]
    except TimeoutError:
        return got
    finally:
        await psub.unsubscribe()


async def _provision(nc: NatsClient, topo: Topology) -> None:
    await provision(nc.jetstream(), topo, lease_ttl_s=30, runner_ack_wait_s=30)


async def test_a_new_importer_durable_takes_only_its_events(nc: NatsClient) -> None:
    topo = Topology(f"f{uuid.uuid4().hex[:8]}")
    await _provision(nc, topo)
    info = await nc.jetstream().consumer_info(topo.events_stream, topo.importer_durable)
    assert sorted(info.config.filter_subjects or []) == sorted(importer_filters(topo))
    await _publish(nc, topo, "trial_started", "trial_completed", "result_imported", "trial_failed")
    assert await _fetch_all(nc, topo) == [b"trial_completed", b"trial_failed"]
    # The watcher still sees every event.
    watcher = await nc.jetstream().consumer_info(topo.events_stream, topo.watcher_durable)
    assert watcher.num_pending == 4


async def test_an_unfiltered_importer_durable_is_narrowed_and_loses_nothing(
    nc: NatsClient,
) -> None:
    js = nc.jetstream()
    topo = Topology(f"f{uuid.uuid4().hex[:8]}")
    await ensure_streams(js, topo)
    await js.add_consumer(topo.events_stream, _unfiltered_importer(topo))
    await _publish(nc, topo, "trial_completed", "trial_started")
    # One event delivered and not acknowledged when the durable is narrowed.
    psub = await js.pull_subscribe_bind(topo.importer_durable, stream=topo.events_stream)
    held = await psub.fetch(batch=1, timeout=5)
    await psub.unsubscribe()
    # Control: unfiltered, the durable hands out what the importer does not use.
    before = await js.consumer_info(topo.events_stream, topo.importer_durable)
    assert before.num_pending == 1 and before.config.filter_subject == topo.event_filter()

    await _provision(nc, topo)

    after = await js.consumer_info(topo.events_stream, topo.importer_durable)
    assert sorted(after.config.filter_subjects or []) == sorted(importer_filters(topo))
    assert after.num_ack_pending == 1  # the held event is still its to acknowledge
    await held[0].ack_sync()
    await _publish(nc, topo, "result_imported", "experiment_completed")
    assert await _fetch_all(nc, topo) == [b"experiment_completed"]
