"""A runner pool behind a boundary, reached through a NATS leaf node.

The hub is a nats-server with JetStream and the generated per-role users
(infra.nats_auth, with a runner user for pool ``remote``), provisioned by the admin
role (one runner durable per pool). The remote site runs its own nats-server as a
LEAF node without JetStream: its clients' JetStream requests cross the leaf connection
to the hub's streams, addressed to the hub's JetStream domain (``$JS.hub.API.>``:
nats-server does not carry the plain ``$JS.API.>`` over a leaf connection; checked
with nats-server 2.15, a request there finds no responders). The leaf authenticates
to the hub as ``runner-remote``, so the connection carries only what that user may
do. A client of the leaf server (a runner at the remote site, which holds no hub
credentials at all) then takes and acks pool ``remote``'s work, and cannot get pool
``default``'s. Negative control: the same leaf client, behind a leaf that
authenticates with an unscoped user (admin), can.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import ServiceUnavailableError

from infra.embedded import NatsServer, ServerStartupError, leaf_remote_url
from schemas.subjects import DEFAULT_POOL, Topology
from tests.support.bus_roles import RoleBus, require_nats_server, role_server

pytestmark = pytest.mark.integration

TOPO = Topology("leafpool")
POOL = "remote"
ACK_WAIT_S = 30.0
HUB_DOMAIN = "hub"
"""The hub's JetStream domain: how leaf clients address it ($JS.hub.API.>)."""
LEAF_CONNECT_S = 15.0
"""Bound on the leaf connection coming up (it is awaited, not slept on)."""


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RoleBus]:
    require_nats_server()
    with role_server(
        tmp_path_factory.mktemp("leaf-pool"),
        TOPO,
        pools=[POOL],
        ack_wait_s=ACK_WAIT_S,
        js_domain=HUB_DOMAIN,
        accept_leafnodes=True,
    ) as hub:
        yield hub


@asynccontextmanager
async def leaf_client(hub: RoleBus, principal: str) -> AsyncIterator[NatsClient]:
    """A leaf server authenticating to the hub as ``principal``, and a client of it.

    The client connects to the leaf without credentials (the leaf has no users of its
    own); it uses the principal's inbox, the only one whose replies the hub sends over.
    """
    cred = hub.credentials(principal)
    data = hub.root / f"leaf-{principal}-{uuid.uuid4().hex[:6]}"
    data.mkdir()
    remote = leaf_remote_url(hub.server.leafnode_url, cred.user, cred.password)
    before = hub.server.leafnode_connections()
    with NatsServer(data, jetstream=False, leaf_remotes=[remote]) as leaf:
        assert leaf.config_path.stat().st_mode & 0o077 == 0  # it holds the password
        await _leaf_connected(hub.server, before + 1)
        nc = await nats.connect(leaf.url, inbox_prefix=cred.inbox_prefix, name="leaf-runner")
        try:
            await _hub_jetstream_reachable(nc)
            yield nc
        finally:
            await nc.close()


async def _leaf_connected(server: NatsServer, count: int) -> None:
    deadline = time.monotonic() + LEAF_CONNECT_S
    while server.leafnode_connections() < count:
        if time.monotonic() > deadline:
            raise ServerStartupError(
                f"leaf node did not connect to the hub within {LEAF_CONNECT_S:.0f} s; "
                f"logs in {server.data_dir}"
            )
        await asyncio.sleep(0.05)  # polling the hub's /leafz


async def _hub_jetstream_reachable(nc: NatsClient) -> None:
    """Wait until the hub's JetStream answers through the leaf.

    The hub counts the leaf as connected before the two servers have exchanged their
    interest; until then a request finds no responders.
    """
    deadline = time.monotonic() + LEAF_CONNECT_S
    while True:
        try:
            await nc.jetstream(timeout=1.0, domain=HUB_DOMAIN).stream_info(TOPO.work_stream)
            return
        except (NoRespondersError, ServiceUnavailableError, NatsTimeoutError) as exc:
            if time.monotonic() > deadline:
                raise ServerStartupError(
                    f"the hub's JetStream does not answer through the leaf node: {exc!r}"
                ) from exc
        await asyncio.sleep(0.05)  # the interest exchange is not observable otherwise


async def _publish_work(hub: RoleBus, exp: str) -> dict[str, str]:
    """One TrialRequested-like message per pool, as the submitter role publishes it."""
    subjects = {pool: TOPO.work_subject(exp, pool) for pool in (DEFAULT_POOL, POOL)}
    nc = await hub.connect("submitter", name="hub-submitter")
    try:
        js = nc.jetstream()
        for pool, subject in subjects.items():
            body = {"type": "trial_requested", "experiment_id": exp, "pool": pool}
            ack = await js.publish(subject, json.dumps(body).encode())
            assert ack.stream == TOPO.work_stream
    finally:
        await nc.close()
    return subjects


async def _pending(hub: RoleBus, pool: str) -> int:
    """Messages pool's durable has not delivered yet (seen by the hub's admin)."""
    nc = await hub.connect("admin", name="hub-admin")
    try:
        info = await nc.jetstream().consumer_info(TOPO.work_stream, TOPO.runner_durable_for(pool))
        return int(info.num_pending) + int(info.num_ack_pending)
    finally:
        await nc.close()


async def _fetch(nc: NatsClient, pool: str, wait_s: float) -> list[Msg]:
    psub = await nc.jetstream(timeout=wait_s, domain=HUB_DOMAIN).pull_subscribe_bind(
        TOPO.runner_durable_for(pool), stream=TOPO.work_stream
    )
    try:
        return await psub.fetch(batch=10, timeout=wait_s)
    except (NatsTimeoutError, TimeoutError):
        return []
    finally:
        await psub.unsubscribe()


async def test_a_leaf_pool_takes_only_its_pools_work(hub: RoleBus) -> None:
    exp = f"exp-{uuid.uuid4().hex[:8]}"
    subjects = await _publish_work(hub, exp)
    async with leaf_client(hub, f"runner-{POOL}") as runner:
        msgs = await _fetch(runner, POOL, wait_s=5)
        assert [m.subject for m in msgs] == [subjects[POOL]]
        assert json.loads(msgs[0].data)["pool"] == POOL
        await msgs[0].ack_sync()  # the ack crosses the leaf too, and the hub confirms it
        assert await _pending(hub, POOL) == 0
        # The default pool's durable is out of this leaf's reach: the hub never offers
        # that durable's API across this leaf connection, so the request finds no one...
        with pytest.raises(ServiceUnavailableError):
            await _fetch(runner, DEFAULT_POOL, wait_s=2)
    # ...and the message is still waiting for the default pool's runners.
    assert await _pending(hub, DEFAULT_POOL) == 1
    # Negative control: a leaf with an unscoped credential gets it (so the refusal
    # above is the credential's scope, not a broken leaf setup).
    async with leaf_client(hub, "admin") as unscoped:
        msgs = await _fetch(unscoped, DEFAULT_POOL, wait_s=5)
        assert [m.subject for m in msgs] == [subjects[DEFAULT_POOL]]
        await msgs[0].ack_sync()
    assert await _pending(hub, DEFAULT_POOL) == 0
