"""The importer's durable on a real nats-server: only the events it acts on reach it.

An installation from before the filter has an importer durable that takes every
event; provisioning again narrows it in place, and what it already held is kept:
the event it delivered and was not yet acknowledged stays acknowledgeable, and
nothing after its position is skipped.
"""

from __future__ import annotations

import dataclasses

import pytest
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig

from infra.nats_provision import events_durable_configs, provision
from schemas.subjects import Topology
from services.importer.handlers import importer_filters

pytestmark = pytest.mark.integration


def _unfiltered_importer(topo: Topology) -> ConsumerConfig:
    """The importer's durable as trialbus made it before the filter: every event."""
    importer = events_durable_configs(topo)[0]
    return dataclasses.replace(importer, filter_subjects=None, filter_subject=topo.event_filter())


async def _publish(js: JetStreamContext, topo: Topology, *types: str) -> None:
    for event_type in types:
        await js.publish(topo.event_subject(event_type, "exp1"), event_type.encode())


async def _fetch_all(js: JetStreamContext, topo: Topology) -> list[bytes]:
    psub = await js.pull_subscribe_bind(topo.importer_durable, stream=topo.events_stream)
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


async def _provision(js: JetStreamContext, topo: Topology) -> None:
    await provision(js, topo, lease_ttl_s=30, runner_ack_wait_s=30)


async def test_a_new_importer_durable_takes_only_its_events(
    js: JetStreamContext, topology: Topology
) -> None:
    await _provision(js, topology)
    info = await js.consumer_info(topology.events_stream, topology.importer_durable)
    assert sorted(info.config.filter_subjects or []) == sorted(importer_filters(topology))
    await _publish(
        js, topology, "trial_started", "trial_completed", "result_imported", "trial_failed"
    )
    assert await _fetch_all(js, topology) == [b"trial_completed", b"trial_failed"]
    # The watcher still sees every event.
    watcher = await js.consumer_info(topology.events_stream, topology.watcher_durable)
    assert watcher.num_pending == 4


async def test_an_unfiltered_importer_durable_is_narrowed_and_loses_nothing(
    js: JetStreamContext, topology: Topology
) -> None:
    await js.add_consumer(topology.events_stream, _unfiltered_importer(topology))
    await _publish(js, topology, "trial_completed", "trial_started")
    # One event delivered and not acknowledged when the durable is narrowed.
    psub = await js.pull_subscribe_bind(topology.importer_durable, stream=topology.events_stream)
    held = await psub.fetch(batch=1, timeout=5)
    await psub.unsubscribe()
    # Control: unfiltered, the durable hands out what the importer does not use.
    before = await js.consumer_info(topology.events_stream, topology.importer_durable)
    assert before.num_pending == 1 and before.config.filter_subject == topology.event_filter()

    await _provision(js, topology)

    after = await js.consumer_info(topology.events_stream, topology.importer_durable)
    assert sorted(after.config.filter_subjects or []) == sorted(importer_filters(topology))
    assert after.num_ack_pending == 1  # the held event is still its to acknowledge
    await held[0].ack_sync()
    await _publish(js, topology, "result_imported", "experiment_completed")
    assert await _fetch_all(js, topology) == [b"experiment_completed"]
