"""Provisioning runner pools on a real nats-server: one durable per pool and priority
class, no overlap.

A work-queue stream refuses two consumers whose filters overlap, so the default pool's
durable, which took ``work.>`` before pools existed (and ``work.<pool>.>`` before
classes), is narrowed to its pool's default class when an installation is provisioned
again, and the work waiting in it is not lost.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import BadRequestError

from infra.embedded import NatsServer
from infra.nats_provision import provision
from schemas.subjects import DEFAULT_POOL, Topology
from services.common.adapters.jetstream import ensure_streams
from tests.support.bus_roles import require_nats_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_nats_server()
    with NatsServer(Path(tmp_path_factory.mktemp("pools"))) as server:
        yield server.url


def _older_default_durable(topo: Topology, filter_subject: str) -> ConsumerConfig:
    """The default durable as an older trialbus created it, on one ``filter_subject``
    (before pools: every work subject; before classes: the default pool's)."""
    return ConsumerConfig(
        durable_name=topo.runner_durable,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        filter_subject=filter_subject,
        ack_wait=30,
    )


async def test_a_legacy_default_durable_is_narrowed_and_keeps_its_work(nc: NatsClient) -> None:
    js = nc.jetstream()
    topo = Topology(f"p{uuid.uuid4().hex[:8]}")
    await ensure_streams(js, topo)
    await js.add_consumer(topo.work_stream, _older_default_durable(topo, topo.work_wildcard))
    await js.publish(topo.work_subject("exp1"), b"waiting")
    # Control: next to the legacy durable, a pool's durable is refused by the server.
    gpu = ConsumerConfig(
        durable_name=topo.runner_durable_for("gpu"),
        ack_policy=AckPolicy.EXPLICIT,
        filter_subject=topo.work_pool_filter("gpu"),
    )
    with pytest.raises(BadRequestError, match=r"(?i)unique|overlap"):
        await js.add_consumer(topo.work_stream, gpu)

    await provision(js, topo, lease_ttl_s=30, runner_ack_wait_s=30, pools=(DEFAULT_POOL, "gpu"))

    default = await js.consumer_info(topo.work_stream, topo.runner_durable)
    assert default.config.filter_subjects == [
        f"{topo.prefix}.work.default.*",
        f"{topo.prefix}.work.default.normal.*",
    ]
    gpu_info = await js.consumer_info(topo.work_stream, topo.runner_durable_for("gpu"))
    assert gpu_info.config.filter_subjects == [
        f"{topo.prefix}.work.gpu.*",
        f"{topo.prefix}.work.gpu.normal.*",
    ]
    # The waiting trial is still the default pool's, and a gpu trial goes to gpu.
    await js.publish(topo.work_subject("exp1", "gpu"), b"gpu work")
    for pool, body in ((DEFAULT_POOL, b"waiting"), ("gpu", b"gpu work")):
        psub = await js.pull_subscribe_bind(topo.runner_durable_for(pool), stream=topo.work_stream)
        msgs = await psub.fetch(batch=5, timeout=5)
        assert [m.data for m in msgs] == [body]
        await msgs[0].ack_sync()


async def test_a_pre_classes_durable_is_narrowed_and_each_class_gets_its_work(
    nc: NatsClient,
) -> None:
    js = nc.jetstream()
    topo = Topology(f"p{uuid.uuid4().hex[:8]}")
    await ensure_streams(js, topo)
    before_classes = _older_default_durable(topo, topo.work_pool_filter(DEFAULT_POOL))
    await js.add_consumer(topo.work_stream, before_classes)
    await js.publish(topo.work_subject("exp0"), b"queued before classes")
    # Control: next to it, a class durable is refused by the server (filters overlap).
    urgent = ConsumerConfig(
        durable_name=topo.runner_durable_for(DEFAULT_POOL, "urgent"),
        ack_policy=AckPolicy.EXPLICIT,
        filter_subject=f"{topo.prefix}.work.default.urgent.*",
    )
    with pytest.raises(BadRequestError, match=r"(?i)unique|overlap"):
        await js.add_consumer(topo.work_stream, urgent)

    await provision(js, topo, lease_ttl_s=30, runner_ack_wait_s=30)

    for exp, cls in (("exp1", "urgent"), ("exp2", "normal"), ("exp3", "batch")):
        await js.publish(topo.work_subject(exp, DEFAULT_POOL, cls), cls.encode())
    expected = {
        None: [b"queued before classes", b"normal"],  # the default class: normal
        "urgent": [b"urgent"],
        "batch": [b"batch"],
    }
    for token, bodies in expected.items():
        durable = topo.runner_durable_for(DEFAULT_POOL, token)
        psub = await js.pull_subscribe_bind(durable, stream=topo.work_stream)
        msgs = await psub.fetch(batch=5, timeout=5)
        assert [m.data for m in msgs] == bodies, durable
        for m in msgs:
            await m.ack_sync()


async def test_provisioning_again_changes_nothing(nc: NatsClient) -> None:
    js = nc.jetstream()
    topo = Topology(f"p{uuid.uuid4().hex[:8]}")
    pools = (DEFAULT_POOL, "remote")
    durables = [topo.runner_durable_for(p, c) for p in pools for c in (None, "urgent", "batch")]
    await provision(js, topo, lease_ttl_s=30, runner_ack_wait_s=30, pools=pools)
    before = {d: (await js.consumer_info(topo.work_stream, d)).created for d in durables}
    await provision(js, topo, lease_ttl_s=30, runner_ack_wait_s=30, pools=pools)
    after = {d: (await js.consumer_info(topo.work_stream, d)).created for d in durables}
    assert after == before
