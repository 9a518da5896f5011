"""The bus boundary, proven against a real nats-server running the generated config.

One nats-server per module, configured with infra.nats_auth's include; the admin role
provisions the streams, buckets and durables (infra.nats_provision). Each test then
acts as one role and checks both sides: the operation the role needs succeeds, and an
operation it must not do is refused by the server (the ``Permissions Violation`` the
server reports, or a JetStream API error). Every denial has a negative control: the
same operation succeeds for the role that owns it, so a denial is never just a broken
setup. Tests isolate themselves by experiment id inside the shared streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from dataclasses import dataclass, field
from typing import Any

import nats
import pytest
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, NatsBroker, PullSub
from faststream.nats.annotations import NatsMessage
from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from nats.js.api import INBOX_PREFIX, ConsumerConfig, DeliverPolicy, StreamConfig

from infra.nats_auth import (
    connect_as,
    load_credentials,
)
from infra.nats_permissions import ROLES
from schemas.runners import RunnerInfo
from schemas.subjects import DEFAULT_POOL, Topology
from services.common.adapters.jetstream import JetStreamBus, ensure_streams
from services.common.adapters.memory import InMemoryLedger
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.adapters.nats_objects import NatsObjectStore
from services.common.adapters.nats_registry import NatsRunnerRegistry
from services.common.errors import ObjectAccessDenied
from services.common.fair_share import TeamShare
from services.common.ports import ExperimentInfo, Lease, Spend
from services.common.quotas import Quotas, TeamQuota
from services.common.settings import CommonSettings
from services.runner.consumer import ensure_runner_consumers
from services.submitter.connections import NatsSide
from services.submitter.follow import read_queue
from tests.support.bus_roles import RoleBus, require_nats_server, role_server

pytestmark = pytest.mark.integration

TOPO = Topology("trialbus")
POOL = "remote"
"""A second runner pool: its own durable, its own runner user (``runner-remote``)."""
ACK_WAIT_S = 30.0
DENIAL_WAIT_S = 20.0
"""How long a denial may take to be reported (it is an event; this is only a bound,
generous for a loaded machine: only a failing test waits it out)."""
JS_TIMEOUT_S = 10.0
"""JetStream API requests of the allowed operations (2 s timed out on a loaded machine)."""
REFUSED_PUT_TIMEOUT_S = 4.0
"""The JetStream timeout of an object store put the server refuses: a refused publish
gets no acknowledgement, so the adapter waits this out twice (the chunk, then the purge
of what it wrote) before it reads the refusal; with JS_TIMEOUT_S, 40 s of the test."""


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RoleBus]:
    require_nats_server()
    root = tmp_path_factory.mktemp("bus-auth")
    with role_server(root, TOPO, pools=[POOL], ack_wait_s=ACK_WAIT_S) as bus:
        yield bus


@dataclass(slots=True)
class Role:
    """A connection as one role, collecting the errors the server reports to it."""

    name: str
    nc: NatsClient
    errors: asyncio.Queue[str] = field(default_factory=asyncio.Queue)

    @property
    def js(self) -> Any:
        return self.nc.jetstream(timeout=JS_TIMEOUT_S)

    async def denied(
        self, operation: Awaitable[Any], kind: str, subject: str, wait_s: float = DENIAL_WAIT_S
    ) -> None:
        """Run ``operation`` and wait for the server to refuse ``kind`` to ``subject``.

        ``kind`` is ``Publish`` or ``Subscription``; ``subject`` may end with ``*`` to
        match a prefix. The operation itself then fails or hangs (a refused request gets
        no reply), so it is cancelled once the refusal is in.
        """
        task = asyncio.ensure_future(operation)
        seen: list[str] = []
        try:
            expected = f"permissions violation for {kind} to ".lower()
            while True:
                try:
                    err = await asyncio.wait_for(self.errors.get(), wait_s)
                except TimeoutError:
                    outcome = repr(task.exception()) if task.done() else "still running"
                    pytest.fail(
                        f"{self.name}: no refusal of {kind} to {subject}; server said "
                        f"{seen or 'nothing'}; the operation: {outcome}"
                    )
                seen.append(err)
                text = err.lower()
                if expected not in text:
                    continue
                got = text.split(expected, 1)[1].strip("'\" ")
                want = subject.lower()
                if got == want or (want.endswith("*") and got.startswith(want[:-1])):
                    return
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


@pytest.fixture
async def roles(bus: RoleBus) -> AsyncIterator[dict[str, Role]]:
    """One connection per role (and ``runner-remote``, the pool's), all closed at the end."""
    out: dict[str, Role] = {}
    for name in (*ROLES, f"runner-{POOL}"):
        queue: asyncio.Queue[str] = asyncio.Queue()

        async def on_error(exc: Exception, queue: asyncio.Queue[str] = queue) -> None:
            await queue.put(str(exc))

        nc = await bus.connect(name, name=f"test-{name}", error_cb=on_error)
        out[name] = Role(name, nc, queue)
    try:
        yield out
    finally:
        for r in out.values():
            await r.nc.close()


def _exp() -> str:
    return f"exp-{uuid.uuid4().hex[:10]}"


async def _stream_messages(admin: Role, stream: str) -> int:
    info = await admin.js.stream_info(stream)
    return int(info.state.messages)


# -- authentication -------------------------------------------------------------------
async def test_anonymous_and_wrong_password_are_refused(bus: RoleBus) -> None:
    for options in ({}, {"user": TOPO.prefix + "-runner", "password": "not-the-password"}):
        with pytest.raises(NatsError) as info:
            await nats.connect(bus.url, allow_reconnect=False, max_reconnect_attempts=0, **options)
        assert "authorization violation" in str(info.value).lower(), info.value
    # Negative control: the role's own file connects.
    cred = load_credentials(bus.files.credentials["runner"])
    nc = await connect_as([bus.url], cred, name="control", allow_reconnect=False)
    assert nc.is_connected
    await nc.close()


async def test_each_service_start_up_check_passes_as_its_role(roles: dict[str, Role]) -> None:
    """Every service calls ensure_streams at start: against provisioned streams it only
    looks, which each service role may do (and it would fail loudly if it tried more)."""
    for name in ("submitter", "runner", "importer", "watcher"):
        await ensure_streams(roles[name].js, TOPO)
        await roles[name].nc.flush()
        assert roles[name].errors.empty(), (name, roles[name].errors.get_nowait())
    # Negative control: the subscriber is no service and may not look at the work stream.
    subscriber = roles["subscriber"]
    await subscriber.denied(
        ensure_streams(subscriber.js, TOPO),
        "Publish",
        f"$JS.API.STREAM.INFO.{TOPO.work_stream}",
    )


async def test_submitter_cannot_forge_outcomes(roles: dict[str, Role]) -> None:
    submitter = roles["submitter"]
    exp = _exp()
    for kind, owner in (("trial_completed", "runner"), ("result_imported", "importer")):
        subject = TOPO.event_subject(kind, exp)
        await submitter.denied(submitter.js.publish(subject, b"{}"), "Publish", subject)
        assert (await roles[owner].js.publish(subject, b"{}")).stream == TOPO.events_stream


# -- runner ---------------------------------------------------------------------------
async def test_runner_takes_work_only_through_its_durable(roles: dict[str, Role]) -> None:
    submitter, runner, admin = roles["submitter"], roles["runner"], roles["admin"]
    exp = _exp()
    # The runner's start-up calls only look (the objects exist): they must pass.
    await ensure_streams(runner.js, TOPO)
    await ensure_runner_consumers(runner.js, TOPO, ACK_WAIT_S)
    await ensure_runner_consumers(roles[f"runner-{POOL}"].js, TOPO, ACK_WAIT_S, POOL)
    ack = await submitter.js.publish(TOPO.work_subject(exp), b'{"w": 1}')
    assert ack.stream == TOPO.work_stream
    psub = await runner.js.pull_subscribe_bind(TOPO.runner_durable, stream=TOPO.work_stream)
    seen = []
    while TOPO.work_subject(exp) not in seen:
        for msg in await psub.fetch(batch=10, timeout=5):
            seen.append(msg.subject)
            await msg.ack_sync()
    # It may not publish work, nor let the submitter's role take work.
    before = await _stream_messages(admin, TOPO.work_stream)
    await runner.denied(
        runner.js.publish(TOPO.work_subject(exp), b"{}"), "Publish", TOPO.work_subject(exp)
    )
    assert await _stream_messages(admin, TOPO.work_stream) == before
    next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{TOPO.work_stream}.{TOPO.runner_durable}"
    fetcher = await submitter.js.pull_subscribe_bind(TOPO.runner_durable, stream=TOPO.work_stream)
    await submitter.denied(fetcher.fetch(batch=1, timeout=2), "Publish", next_subject)


async def _take(role: Role, pool: str, subject: str, cls: str | None = None) -> None:
    """Fetch from ``pool``'s durable of class ``cls`` (None: the default class) as
    ``role`` until ``subject`` arrives (acking all)."""
    durable = TOPO.runner_durable_for(pool, cls)
    psub = await role.js.pull_subscribe_bind(durable, stream=TOPO.work_stream)
    seen: list[str] = []
    while subject not in seen:
        for msg in await psub.fetch(batch=10, timeout=5):
            seen.append(msg.subject)
            await msg.ack_sync()


async def test_a_pool_runner_takes_only_its_pools_work(roles: dict[str, Role]) -> None:
    """Work goes to a pool's own subject and durable; a runner user is scoped to one pool
    (the leaf-node pool test, tests/integration/test_leaf_pool.py, relies on this)."""
    submitter, runner, remote = roles["submitter"], roles["runner"], roles[f"runner-{POOL}"]
    exp = _exp()
    for pool in (DEFAULT_POOL, POOL):
        await submitter.js.publish(TOPO.work_subject(exp, pool), b'{"w": 1}')
    await _take(remote, POOL, TOPO.work_subject(exp, POOL))
    # Neither runner may fetch from the other pool's durable...
    for role, other in ((remote, DEFAULT_POOL), (runner, POOL)):
        durable = TOPO.runner_durable_for(other)
        psub = await role.js.pull_subscribe_bind(durable, stream=TOPO.work_stream)
        await role.denied(
            psub.fetch(batch=1, timeout=2),
            "Publish",
            f"$JS.API.CONSUMER.MSG.NEXT.{TOPO.work_stream}.{durable}",
        )
    # ...nor read the other's replies (where pulled messages arrive).
    inbox = f"_INBOX.{TOPO.prefix}.runner.>"
    await remote.denied(remote.nc.subscribe(inbox), "Subscription", inbox)
    inbox = f"_INBOX.{TOPO.prefix}.runner-{POOL}.>"
    await runner.denied(runner.nc.subscribe(inbox), "Subscription", inbox)
    # Negative control: the default pool's runner takes the default pool's message,
    # which the remote runner's fetch above did not (it is still there).
    await _take(runner, DEFAULT_POOL, TOPO.work_subject(exp, DEFAULT_POOL))


async def test_a_pool_runner_takes_each_class_only_through_its_pools_class_durables(
    roles: dict[str, Role],
) -> None:
    """One durable per (pool, priority class): a runner user may fetch through its own
    pool's durable of every class, never another pool's, and the submitter through none."""
    submitter, runner, remote = roles["submitter"], roles["runner"], roles[f"runner-{POOL}"]
    exp = _exp()
    for pool in (DEFAULT_POOL, POOL):
        for cls in ("urgent", "batch"):
            await submitter.js.publish(TOPO.work_subject(exp, pool, cls), b'{"w": 1}')
    for cls in ("urgent", "batch"):
        await _take(remote, POOL, TOPO.work_subject(exp, POOL, cls), cls)
        for role, other in ((remote, DEFAULT_POOL), (runner, POOL), (submitter, DEFAULT_POOL)):
            durable = TOPO.runner_durable_for(other, cls)
            psub = await role.js.pull_subscribe_bind(durable, stream=TOPO.work_stream)
            await role.denied(
                psub.fetch(batch=1, timeout=2),
                "Publish",
                f"$JS.API.CONSUMER.MSG.NEXT.{TOPO.work_stream}.{durable}",
            )
        # Negative control: the default pool's runner takes its pool's message of the
        # class, which the denied fetches above did not take.
        await _take(runner, DEFAULT_POOL, TOPO.work_subject(exp, DEFAULT_POOL, cls), cls)


async def test_a_runner_writes_only_its_pools_registry_keys(roles: dict[str, Role]) -> None:
    remote, runner, submitter = roles[f"runner-{POOL}"], roles["runner"], roles["submitter"]
    me = RunnerInfo(runner_id=f"r-{uuid.uuid4().hex[:6]}", host="h", pool=POOL, concurrency=1)
    await (await NatsRunnerRegistry.open(remote.js, TOPO)).announce(me)
    # The submitter lists live runners with the rights it has (no consumer needed).
    listed = await (await NatsRunnerRegistry.open(submitter.js, TOPO)).live_runners()
    assert me in listed
    kv = await remote.js.key_value(TOPO.runners_bucket)
    key = f"{DEFAULT_POOL}.forged-{uuid.uuid4().hex[:6]}"
    await remote.denied(kv.put(key, b"{}"), "Publish", f"$KV.{TOPO.runners_bucket}.{key}")
    # Negative control: the default pool's runner owns that key.
    assert await (await runner.js.key_value(TOPO.runners_bucket)).put(key, b"{}")
    # Nor may the submitter announce a runner (a fake pool would pass its own check).
    sub_kv = await submitter.js.key_value(TOPO.runners_bucket)
    await submitter.denied(
        sub_kv.put(f"{POOL}.fake", b"{}"), "Publish", f"$KV.{TOPO.runners_bucket}.{POOL}.fake"
    )


async def test_runner_publishes_run_events_but_no_experiment_events(
    roles: dict[str, Role],
) -> None:
    runner, watcher, submitter = roles["runner"], roles["watcher"], roles["submitter"]
    exp = _exp()
    for kind in ("trial_started", "trial_completed", "trial_failed"):
        ack = await runner.js.publish(TOPO.event_subject(kind, exp), b"{}")
        assert ack.stream == TOPO.events_stream
    await runner.nc.publish(TOPO.log_subject(exp, "t1"), b"{}")  # core publish, like live_logs
    await runner.nc.flush()
    for kind, owner in (
        ("experiment_submitted", submitter),
        ("experiment_completed", watcher),
        ("result_imported", roles["importer"]),
    ):
        subject = TOPO.event_subject(kind, exp)
        await runner.denied(runner.js.publish(subject, b"{}"), "Publish", subject)
        assert (await owner.js.publish(subject, b"{}")).stream == TOPO.events_stream


async def test_only_admin_touches_stream_and_consumer_configuration(
    roles: dict[str, Role],
) -> None:
    admin = roles["admin"]
    api = "$JS.API"
    await roles["watcher"].js.publish(TOPO.event_subject("experiment_completed", _exp()), b"{}")
    events_before = await _stream_messages(admin, TOPO.events_stream)
    assert events_before > 0
    for name in ("runner", "submitter", "importer", "watcher", "subscriber"):
        role = roles[name]
        await role.denied(
            role.js.add_stream(StreamConfig(name="TRIALBUS_EVIL", subjects=["evil.>"])),
            "Publish",
            f"{api}.STREAM.CREATE.TRIALBUS_EVIL",
        )
        await role.denied(
            role.js.delete_stream(TOPO.work_stream), "Publish", f"{api}.STREAM.DELETE.*"
        )
        await role.denied(
            role.js.purge_stream(TOPO.events_stream), "Publish", f"{api}.STREAM.PURGE.*"
        )
        await role.denied(
            role.js.add_consumer(TOPO.events_stream, ConsumerConfig(durable_name="evil")),
            "Publish",
            f"{api}.CONSUMER.DURABLE.CREATE.{TOPO.events_stream}.evil",
        )
    # Not even its own durable may the runner redefine (e.g. a longer ack_wait).
    runner = roles["runner"]
    await runner.denied(
        runner.js.add_consumer(
            TOPO.work_stream, ConsumerConfig(durable_name=TOPO.runner_durable, ack_wait=1)
        ),
        "Publish",
        f"{api}.CONSUMER.DURABLE.CREATE.{TOPO.work_stream}.{TOPO.runner_durable}",
    )
    assert (await admin.js.stream_info(TOPO.work_stream)).config.name == TOPO.work_stream
    assert await _stream_messages(admin, TOPO.events_stream) >= events_before  # not purged
    # Negative controls: the admin may do each of these on its installation...
    await admin.js.purge_stream(TOPO.logs_stream)
    probe = await admin.js.add_consumer(
        TOPO.events_stream, ConsumerConfig(durable_name="trialbus-probe")
    )
    assert await admin.js.delete_consumer(TOPO.events_stream, probe.name)
    # ...and on nothing else: another installation's names are out of its reach.
    await admin.denied(
        admin.js.add_stream(StreamConfig(name="OTHER_WORK", subjects=["other.work.>"])),
        "Publish",
        f"{api}.STREAM.CREATE.OTHER_WORK",
    )


async def test_runner_coordination_keys(roles: dict[str, Role]) -> None:
    runner, submitter = roles["runner"], roles["submitter"]
    exp = _exp()
    coord = await NatsCoordinator.open(runner.js, TOPO, lease_ttl_s=ACK_WAIT_S)
    lease = await coord.acquire(exp, 2, "runner-1")
    assert lease is not None
    await coord.renew(lease)
    await coord.release(lease)
    assert await coord.next_attempt(f"{exp}:t:0") == 1
    assert await coord.next_attempt(f"{exp}:t:0") == 2
    # A hand-back (preemption, stop notice) takes the start back in the same key: no
    # new right (docs/scheduling.md); the submitter may not (below).
    assert await coord.take_back_attempt(f"{exp}:t:0") == 1
    assert (await coord.begin_attempt(f"{exp}:t:0")).attempt == 2
    assert not await coord.is_cancelled(exp, fresh=True)
    # A runner cannot cancel anyone's work; the submitter can, and the runner sees it.
    cancel_key = f"$KV.{TOPO.control_bucket}.cancel.{exp}"
    await runner.denied(coord.cancel(exp), "Publish", cancel_key)
    sub_coord = await NatsCoordinator.open(submitter.js, TOPO, lease_ttl_s=ACK_WAIT_S)
    await sub_coord.cancel(exp)
    assert await coord.is_cancelled(exp, fresh=True)
    # Pause: the submitter may set, lift and read it back, and no other control key
    # through that right. A runner may do neither (a team at its spend cap holds its
    # trials back without the flag: docs/scheduling.md).
    pause_key = f"$KV.{TOPO.control_bucket}.pause.{exp}"
    await runner.denied(coord.pause(exp), "Publish", pause_key)
    await runner.denied(coord.resume(exp), "Publish", pause_key)
    await sub_coord.pause(exp)
    assert await coord.is_paused(exp, fresh=True)
    assert await sub_coord.is_paused(exp, fresh=True)
    await sub_coord.resume(exp)
    assert not await coord.is_paused(exp, fresh=True)
    # One trial's pause lives under pause.> too (pause.<exp>.trials): the submitter
    # sets and lifts it by compare-and-set, the runner reads it and cannot write it.
    await runner.denied(coord.pause_trial(exp, "t__1"), "Publish", f"{pause_key}.trials")
    await sub_coord.pause_trial(exp, "t__1")
    assert await coord.is_paused(exp, trial_id="t__1", fresh=True)
    assert not await coord.is_paused(exp, trial_id="t__2", fresh=True)
    assert await sub_coord.resume_trial(exp, "t__1")
    assert not await coord.is_paused(exp, trial_id="t__1", fresh=True)
    # It reads the cancel flag back by its key (a retry in a cancelled experiment is
    # refused), and nothing else of the bucket through that right (runs.* below).
    await sub_coord.cancel(exp)
    assert await sub_coord.is_cancelled(exp, fresh=True)
    await sub_coord.uncancel(exp)
    assert not await sub_coord.is_cancelled(exp, fresh=True)
    # The submitter, in turn, holds no leases and counts no attempts.
    await submitter.denied(
        sub_coord.acquire(exp, 1, "x"), "Publish", f"$KV.{TOPO.leases_bucket}.{exp}.0"
    )
    await submitter.denied(
        sub_coord.next_attempt(f"{exp}:t:1"), "Publish", f"$KV.{TOPO.control_bucket}.runs.*"
    )
    # Nor may it take a start back: it cannot even read the counter.
    await submitter.denied(
        sub_coord.take_back_attempt(f"{exp}:t:0"),
        "Publish",
        f"$JS.API.DIRECT.GET.KV_{TOPO.control_bucket}.$KV.{TOPO.control_bucket}.runs.*",
    )
    # Giving a slot back purges its key from the leases stream: the runner's one stream
    # purge right, which reaches no other stream (denied above for the events stream).
    await submitter.denied(
        sub_coord.release(Lease(f"{exp}.0", 1)),
        "Publish",
        f"$JS.API.STREAM.PURGE.KV_{TOPO.leases_bucket}",
    )


async def test_the_submitter_reads_the_queue_from_counts_alone(roles: dict[str, Role]) -> None:
    """``trialbus queue`` (follow.read_queue) runs as the submitter with the rights it
    had: stream info with a subject filter on the work stream and the leases bucket,
    the pause flags, the registry. It needs no consumer info and reads no lease."""
    submitter, runner = roles["submitter"], roles["runner"]
    exp = _exp()
    # A pool no durable serves (no runner here takes it, and it stays in the stream).
    await submitter.js.publish(f"{TOPO.prefix}.work.nowhere.{exp}", b"{}")
    await submitter.js.publish(f"{TOPO.prefix}.work.nowhere.{exp}", b"{}")
    settings = CommonSettings(prefix=TOPO.prefix)
    side = NatsSide(submitter.nc, settings, JetStreamBus(submitter.js, TOPO))
    view = await read_queue(side, InMemoryLedger())
    (row,) = [e for e in view.experiments if e.experiment_id == exp]
    assert (row.pool, row.queued, row.reason) == ("nowhere", 2, "no_runner")
    # A team's spend tally, written by the runner role, read back by the submitter's:
    # at the cap its experiment waits for it (control above: without quotas, no_runner).
    team = f"t{uuid.uuid4().hex[:8]}"
    ledger = InMemoryLedger()
    await ledger.upsert_experiment(ExperimentInfo(exp, "e", 2, {"submitted_by": {"team": team}}))
    coord = await NatsCoordinator.open(runner.js, TOPO, lease_ttl_s=ACK_WAIT_S)
    await coord.add_tally("spend", team, 1.0)
    quotas = Quotas(teams={team: TeamQuota(max_spend_usd_per_day=1)})
    view = await read_queue(side, ledger, quotas)
    (row,) = [e for e in view.experiments if e.experiment_id == exp]
    assert row.reason == "team_spend_cap" and f"team {team!r}" in row.detail
    # What it does not need stays denied: consumer info on a runner durable, a lease's
    # value, writing a lease; the runner (control) may do the first two.
    durable_info = f"$JS.API.CONSUMER.INFO.{TOPO.work_stream}.{TOPO.runner_durable}"
    await submitter.denied(
        submitter.js.consumer_info(TOPO.work_stream, TOPO.runner_durable), "Publish", durable_info
    )
    assert (await runner.js.consumer_info(TOPO.work_stream, TOPO.runner_durable)).name
    lease_read = f"$JS.API.DIRECT.GET.KV_{TOPO.leases_bucket}.*"
    leases = await submitter.js.key_value(TOPO.leases_bucket)
    await submitter.denied(leases.get(f"{exp}.0"), "Publish", lease_read)
    await submitter.denied(
        leases.put(f"{exp}.0", b"x"), "Publish", f"$KV.{TOPO.leases_bucket}.{exp}.0"
    )


async def test_agent_stops_budgets_and_spend(roles: dict[str, Role]) -> None:
    runner, submitter = roles["runner"], roles["submitter"]
    exp = _exp()
    coord = await NatsCoordinator.open(runner.js, TOPO, lease_ttl_s=ACK_WAIT_S)
    sub_coord = await NatsCoordinator.open(submitter.js, TOPO, lease_ttl_s=ACK_WAIT_S)
    # A runner stops an agent and adds to the spend; a submission lifts the stop and
    # sets the budget, which the runner reads.
    assert await coord.stop_agent(exp, "agent1", b"why") == b"why"
    assert (await coord.add_spend(exp, Spend(tokens=5, attempts=1))).tokens == 5
    await sub_coord.set_budget(exp, b'{"max_tokens": 9}')
    assert await coord.budget(exp, fresh=True) == b'{"max_tokens": 9}'
    await sub_coord.clear_agent_stops(exp, ["agent1"])
    assert await coord.agent_stop(exp, "agent1", fresh=True) is None
    # Negative controls: a runner sets no budget; a submitter writes no spend.
    key = f"$KV.{TOPO.control_bucket}"
    await runner.denied(coord.set_budget(exp, b"{}"), "Publish", f"{key}.budget.{exp}")
    await submitter.denied(
        sub_coord.add_spend(exp, Spend(tokens=1)),
        "Publish",
        f"$JS.API.DIRECT.GET.KV_{TOPO.control_bucket}.{key}.spend.{exp}",
    )


async def test_team_quota_keys(roles: dict[str, Role]) -> None:
    runner, submitter = roles["runner"], roles["submitter"]
    team = f"t.{uuid.uuid4().hex[:8]}@x"  # '.' and '@' are encoded in the keys
    coord = await NatsCoordinator.open(runner.js, TOPO, lease_ttl_s=ACK_WAIT_S)
    sub_coord = await NatsCoordinator.open(submitter.js, TOPO, lease_ttl_s=ACK_WAIT_S)
    # The submitter counts trials per day and reads the spend runners tally; a runner
    # takes team slots beside the experiments'.
    assert await sub_coord.add_tally("trials", team, 3, limit=5) == (True, 0.0)
    assert await sub_coord.add_tally("trials", team, 3, limit=5) == (False, 3.0)
    assert await coord.add_tally("spend", team, 1.5) == (True, 0.0)
    assert await sub_coord.tally("spend", team, fresh=True) == 1.5
    lease = await coord.acquire_team(team, 1, "runner-1")
    assert lease is not None and lease.key.startswith("_team.")
    assert await coord.acquire_team(team, 1, "runner-2") is None
    await coord.release(lease)
    # Negative controls: a runner counts no submissions; a submitter tallies no spend
    # and holds no team slot.
    key = f"$KV.{TOPO.control_bucket}.quota"
    await runner.denied(coord.add_tally("trials", team, 1), "Publish", f"{key}.trials.*")
    await submitter.denied(sub_coord.add_tally("spend", team, 1), "Publish", f"{key}.spend.*")
    await submitter.denied(
        sub_coord.acquire_team(team, 1, "x"), "Publish", f"$KV.{TOPO.leases_bucket}._team.*"
    )


async def test_team_limits_key(roles: dict[str, Role]) -> None:
    runner, submitter = roles["runner"], roles["submitter"]
    coord = await NatsCoordinator.open(runner.js, TOPO, lease_ttl_s=ACK_WAIT_S)
    sub_coord = await NatsCoordinator.open(submitter.js, TOPO, lease_ttl_s=ACK_WAIT_S)
    # The submitter publishes the quotas file's limits; runners (and the submitter
    # itself) read them back.
    limits = Quotas(teams={"red": TeamQuota(max_concurrent_trials=1)})
    await sub_coord.set_team_limits(limits)
    seen = await coord.team_limits(fresh=True)
    assert seen is not None and seen.for_team("red") == TeamQuota(max_concurrent_trials=1)
    assert await sub_coord.team_limits(fresh=True) == seen
    # Negative control: a runner cannot lift (or change) its team's quota.
    lifted = Quotas(teams={"red": TeamQuota(max_concurrent_trials=1000)})
    await runner.denied(
        coord.set_team_limits(lifted), "Publish", f"$KV.{TOPO.control_bucket}.quota.limits"
    )
    after = await sub_coord.team_limits(fresh=True)
    assert after is not None and after.for_team("red") == TeamQuota(max_concurrent_trials=1)


async def test_fair_share_keys(roles: dict[str, Role]) -> None:
    runner, submitter = roles["runner"], roles["submitter"]
    exp = f"exp-{uuid.uuid4().hex[:12]}"
    coord = await NatsCoordinator.open(runner.js, TOPO, lease_ttl_s=ACK_WAIT_S)
    sub_coord = await NatsCoordinator.open(submitter.js, TOPO, lease_ttl_s=ACK_WAIT_S)
    # The submitter stores an experiment's team and share; runners and the queue read
    # it; a runner marks its running trial in the leases bucket.
    await sub_coord.set_share(exp, TeamShare("red", 3.0))
    assert await coord.share_of(exp, fresh=True) == TeamShare("red", 3.0)
    assert await sub_coord.share_of(exp, fresh=True) == TeamShare("red", 3.0)
    mark = await coord.mark_running(f"_share.default.normal.red.{exp}", "runner-1")
    await coord.release(mark)
    # Negative controls: a runner cannot change a team's share; a submitter marks
    # nothing running.
    await runner.denied(
        coord.set_share(exp, TeamShare("red", 100.0)),
        "Publish",
        f"$KV.{TOPO.control_bucket}.share.{exp}",
    )
    await submitter.denied(
        sub_coord.mark_running(f"_share.default.normal.red.{exp}", "x"),
        "Publish",
        f"$KV.{TOPO.leases_bucket}._share.*",
    )
    assert await coord.share_of(exp, fresh=True) == TeamShare("red", 3.0)


# -- objects: task archives and results ---------------------------------------------------
async def test_task_archives_and_results(roles: dict[str, Role]) -> None:
    submitter, runner, importer = roles["submitter"], roles["runner"], roles["importer"]
    name = f"sha256-{uuid.uuid4().hex}"
    tasks = await submitter.js.object_store(TOPO.tasks_bucket)
    await tasks.put(name, b"task archive")
    got = await (await runner.js.object_store(TOPO.tasks_bucket)).get(name)
    assert got.data == b"task archive"
    # A runner cannot replace a task; nor can the importer write a result.
    runner_tasks = await runner.js.object_store(TOPO.tasks_bucket)
    await runner.denied(runner_tasks.put(name, b"evil"), "Publish", f"$O.{TOPO.tasks_bucket}.C.*")
    assert (await runner_tasks.get(name)).data == b"task archive"
    await (await runner.js.object_store(TOPO.results_bucket)).put(f"run-{name}", b"result")
    results = await importer.js.object_store(TOPO.results_bucket)
    assert (await results.get(f"run-{name}")).data == b"result"
    await importer.denied(
        results.put(f"run-{name}", b"forged"), "Publish", f"$O.{TOPO.results_bucket}.C.*"
    )
    # The services read through NatsObjectStore (chunks by direct gets), as themselves.
    stored = await (await NatsObjectStore.open(runner.js, TOPO.results_bucket)).put(
        f"run2-{name}", b"result two"
    )
    for reader, bucket in ((importer, TOPO.results_bucket), (runner, TOPO.tasks_bucket)):
        store = await NatsObjectStore.open(reader.js, bucket)
        if bucket == TOPO.results_bucket:
            assert await store.get(stored) == b"result two"
        else:
            ref = await (await NatsObjectStore.open(submitter.js, bucket)).put(f"{name}-2", b"t")
            assert await store.get(ref) == b"t"
        await reader.nc.flush()
        assert reader.errors.empty(), reader.errors.get_nowait()
    # A missing right is named, not retried as a timeout forever: the adapter sees the
    # server's refusal and raises ObjectAccessDenied (a runner's trial then fails with
    # that message). Control: the same put as a role with the right stored above.
    refused_js = importer.nc.jetstream(timeout=REFUSED_PUT_TIMEOUT_S)
    importer_results = await NatsObjectStore.open(refused_js, TOPO.results_bucket)
    with pytest.raises(ObjectAccessDenied, match=f"right on bucket {TOPO.results_bucket}"):
        await importer_results.put(f"forged-{name}", b"forged")
    while not importer.errors.empty():  # the refusal, seen by the error callback too
        importer.errors.get_nowait()
    # The submitter (the dashboard's downloads) reads a stored result, and cannot
    # write one (control: the runner's put above had the right).
    submitter_results = await NatsObjectStore.open(submitter.js, TOPO.results_bucket)
    assert await submitter_results.get(stored) == b"result two"
    # It reads back a task it stored (a task given by checksum at submit, a retry).
    submitter_tasks = await NatsObjectStore.open(submitter.js, TOPO.tasks_bucket)
    task_ref = await submitter_tasks.put(f"{name}-3", b"its task")
    assert await submitter_tasks.get(task_ref) == b"its task"
    refused_js = submitter.nc.jetstream(timeout=REFUSED_PUT_TIMEOUT_S)
    submitter_refused = await NatsObjectStore.open(refused_js, TOPO.results_bucket)
    with pytest.raises(ObjectAccessDenied, match=f"right on bucket {TOPO.results_bucket}"):
        await submitter_refused.put(f"forged-{name}", b"forged")
    while not submitter.errors.empty():
        submitter.errors.get_nowait()
    # A subscriber reads neither.
    subscriber = roles["subscriber"]
    await subscriber.denied(
        subscriber.js.object_store(TOPO.tasks_bucket),
        "Publish",
        f"$JS.API.STREAM.INFO.OBJ_{TOPO.tasks_bucket}",
    )


# -- importer and watcher -------------------------------------------------------------
async def test_importer_and_watcher_consume_through_their_own_durable(
    roles: dict[str, Role],
) -> None:
    importer, watcher = roles["importer"], roles["watcher"]
    exp = _exp()
    await roles["runner"].js.publish(TOPO.event_subject("trial_completed", exp), b"{}")
    for role, durable in ((importer, TOPO.importer_durable), (watcher, TOPO.watcher_durable)):
        psub = await role.js.pull_subscribe_bind(durable, stream=TOPO.events_stream)
        msgs = await psub.fetch(batch=1, timeout=5)
        await msgs[0].ack_sync()
    # Each may not use the other's durable.
    for role, other in ((importer, TOPO.watcher_durable), (watcher, TOPO.importer_durable)):
        psub = await role.js.pull_subscribe_bind(other, stream=TOPO.events_stream)
        await role.denied(
            psub.fetch(batch=1, timeout=2),
            "Publish",
            f"$JS.API.CONSUMER.MSG.NEXT.{TOPO.events_stream}.{other}",
        )
    # The importer announces imports; it cannot forge a run's outcome or an experiment.
    assert (await importer.js.publish(TOPO.event_subject("result_imported", exp), b"{}")).seq
    for kind in ("trial_completed", "experiment_completed"):
        subject = TOPO.event_subject(kind, exp)
        await importer.denied(importer.js.publish(subject, b"{}"), "Publish", subject)
        assert (await watcher.js.publish(subject, b"{}")).seq  # the watcher may
    subject = TOPO.event_subject("result_imported", exp)
    await watcher.denied(watcher.js.publish(subject, b"{}"), "Publish", subject)
    await watcher.denied(
        watcher.js.publish(TOPO.work_subject(exp), b"{}"), "Publish", TOPO.work_subject(exp)
    )


# -- subscriber -----------------------------------------------------------------------
async def test_subscriber_reads_events_and_logs_and_nothing_else(
    roles: dict[str, Role],
) -> None:
    subscriber, watcher = roles["subscriber"], roles["watcher"]
    exp = _exp()
    feed = await subscriber.js.subscribe(
        TOPO.event_filter("*", exp), ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )
    subject = TOPO.event_subject("experiment_completed", exp)
    await watcher.js.publish(subject, b'{"n": 1}')
    assert (await feed.next_msg(timeout=30)).subject == subject
    logs = await subscriber.js.subscribe(
        TOPO.log_subject(exp, ">"), ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )
    await roles["runner"].nc.publish(TOPO.log_subject(exp, "t1"), b"line")
    assert (await logs.next_msg(timeout=30)).data == b"line"
    # Publishing anything is refused.
    for target in (subject, TOPO.log_subject(exp, "t1"), TOPO.work_subject(exp)):
        await subscriber.denied(subscriber.js.publish(target, b"{}"), "Publish", target)
    # A durable, by either API subject: the named one is not granted, and the
    # ephemeral one refuses a durable name (a JetStream API error, not a timeout).
    await subscriber.denied(
        subscriber.js.add_consumer(TOPO.events_stream, ConsumerConfig(durable_name="ci")),
        "Publish",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{TOPO.events_stream}.ci",
    )
    request = {"stream_name": TOPO.events_stream, "config": {"durable_name": "ci"}}
    reply = await subscriber.nc.request(
        f"$JS.API.CONSUMER.CREATE.{TOPO.events_stream}", json.dumps(request).encode(), 2
    )
    assert json.loads(reply.data)["error"]["err_code"] == 10020, reply.data
    # Reading other streams or buckets, or core subscriptions past the consumers.
    await subscriber.denied(
        subscriber.js.subscribe(TOPO.work_subject(exp), ordered_consumer=True),
        "Publish",
        f"$JS.API.CONSUMER.CREATE.{TOPO.work_stream}",
    )
    await subscriber.denied(
        subscriber.js.key_value(TOPO.control_bucket),
        "Publish",
        f"$JS.API.STREAM.INFO.KV_{TOPO.control_bucket}",
    )
    await subscriber.denied(
        subscriber.nc.subscribe(TOPO.events_wildcard), "Subscription", TOPO.events_wildcard
    )


async def test_no_role_reads_another_roles_replies(roles: dict[str, Role]) -> None:
    runner = roles["runner"]
    # Pulled work and KV answers arrive on inboxes: only the role's own is open to it.
    for subject in ("_INBOX.>", f"_INBOX.{TOPO.prefix}.submitter.>", "_INBOX.x"):
        await runner.denied(runner.nc.subscribe(subject), "Subscription", subject)
    # Negative control: its own inbox is open (every request's reply lands there), and a
    # subscription there draws no refusal before a later round trip completes.
    await runner.nc.subscribe(f"_INBOX.{TOPO.prefix}.runner.probe")
    assert (await runner.js.stream_info(TOPO.work_stream)).config.name == TOPO.work_stream
    await runner.nc.flush()
    assert runner.errors.empty(), runner.errors.get_nowait()


async def test_pushing_a_consumer_into_the_work_subject_injects_nothing(
    roles: dict[str, Role],
) -> None:
    """Ephemeral consumers choose their deliver subject; JetStream does not store those
    deliveries in another stream, so reading rights do not become publishing rights."""
    subscriber, admin = roles["subscriber"], roles["admin"]
    exp = _exp()
    before = await _stream_messages(admin, TOPO.work_stream)
    spy = await admin.nc.subscribe(f"{TOPO.prefix}.spy.{exp}")
    for target in (TOPO.work_subject(exp), f"{TOPO.prefix}.spy.{exp}"):
        request = {
            "stream_name": TOPO.events_stream,
            "config": {"deliver_subject": target, "ack_policy": "none"},
        }
        reply = await subscriber.nc.request(
            f"$JS.API.CONSUMER.CREATE.{TOPO.events_stream}", json.dumps(request).encode(), 2
        )
        assert "error" not in json.loads(reply.data), reply.data
    await roles["watcher"].js.publish(TOPO.event_subject("experiment_completed", exp), b"{}")
    # The control consumer delivers (so the other one would have, had it been stored)...
    await spy.next_msg(timeout=30)
    # ...and the work stream has not grown.
    assert await _stream_messages(admin, TOPO.work_stream) == before


async def test_the_denial_check_fails_when_the_server_allows(roles: dict[str, Role]) -> None:
    """Negative control of ``Role.denied`` itself: an allowed publish is no denial."""
    runner = roles["runner"]
    subject = TOPO.event_subject("trial_started", _exp())
    with pytest.raises(pytest.fail.Exception, match="no refusal"):
        await runner.denied(runner.js.publish(subject, b"{}"), "Publish", subject, wait_s=1.0)


async def test_faststream_subscriber_binds_as_importer(
    bus: RoleBus, roles: dict[str, Role]
) -> None:
    """How the importer and watcher apps must subscribe: FastStream's pull subscriber
    brings its own inbox prefix (``_INBOX.``), which the role may not use, unless given
    the role's."""
    cred = load_credentials(bus.files.credentials["importer"])
    exp = _exp()
    subject = TOPO.event_subject("trial_completed", exp)
    # FastStream's default first (the refusal), then the role's own (the control).
    for inbox in (INBOX_PREFIX, cred.subscription_inbox_prefix):
        errors: asyncio.Queue[str] = asyncio.Queue()
        seen = asyncio.Event()

        async def on_error(exc: Exception, errors: asyncio.Queue[str] = errors) -> None:
            await errors.put(str(exc))

        broker = NatsBroker([bus.url], logger=None, error_cb=on_error, **cred.broker_options())

        broker.subscriber(
            TOPO.event_filter(),
            stream=JStream(TOPO.events_stream, declare=False),
            durable=TOPO.importer_durable,
            pull_sub=PullSub(batch_size=50, timeout=0.2, batch=True),
            ack_policy=AckPolicy.MANUAL,
            inbox_prefix=inbox,
        )(_acking_handler(subject, seen))
        try:
            await broker.start()
            if inbox == INBOX_PREFIX:
                err = await asyncio.wait_for(errors.get(), DENIAL_WAIT_S)
                assert 'permissions violation for subscription to "_inbox.' in err.lower()
                continue
            await roles["runner"].js.publish(subject, b"{}")
            await asyncio.wait_for(seen.wait(), 60)
            reported = [errors.get_nowait() for _ in range(errors.qsize())]
            assert not [e for e in reported if "permissions violation" in e.lower()], reported
        finally:
            await broker.stop()


def _acking_handler(subject: str, seen: asyncio.Event) -> Any:
    """A batch handler that acks everything and sets ``seen`` on ``subject``."""

    async def on_events(msg: NatsMessage) -> None:
        for raw in msg.raw_message:  # type: ignore[attr-defined]  # a batch
            await raw.ack()
            if raw.subject == subject:
                seen.set()

    return on_events
