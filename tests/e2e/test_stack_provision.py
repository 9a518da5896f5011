"""A stack on a given server has its buckets and durables made before any service
starts, with the runners' settings, as a stack with its own server has.

Without it each service created what it found missing on start: the leases bucket
took the TTL of whichever service came first (the submitter's 60 s instead of the
runners' ack wait), and two creates at once could stop a runner.
"""

from __future__ import annotations

import nats
import pytest

from tests.e2e.conftest import Stacks
from tests.e2e.faultkit import instant_runner_env

pytestmark = pytest.mark.e2e


async def test_a_stack_on_a_given_server_provisions_with_the_runners_ack_wait(
    stacks: Stacks,
) -> None:
    # No runner of its own (they join from elsewhere): nothing but the stack itself
    # knows the runners' ack wait (4 s) when the other services start.
    stack = await stacks.start(n_runners=0, runner_env=instant_runner_env(0.0))
    topology = stacks.servers.topology
    nc = await nats.connect(stack.nats_url or "")
    try:
        js = nc.jetstream()
        leases = await js.key_value(topology.leases_bucket)
        assert (await leases.status()).ttl == 4.0
        durable = await js.consumer_info(topology.work_stream, topology.runner_durable)
        assert durable.config.ack_wait == 4.0
    finally:
        await nc.close()
