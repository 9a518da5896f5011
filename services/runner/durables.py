"""The runners' durable pull consumers: one per (pool, priority class), made or checked.

Used by the admin's provisioning (infra.nats_provision) and by a runner started
without per-role users (it may then create its own). Filters never overlap, as a
work-queue stream requires: the default class's durable keeps the pool's name from
before classes existed and takes the unclassed subjects ``work.<pool>.*`` (queued
work from before classes included) plus ``work.<pool>.<default>.*``; every other
class's durable takes ``work.<pool>.<class>.*``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import NotFoundError

from schemas.subjects import DEFAULT_POOL, Topology
from services.common.logging import get_logger
from services.common.priority import DEFAULT_PRIORITY_CLASSES, PriorityClasses

log = get_logger(__name__)

MAX_WAITING = 16_384
"""Pull requests one class durable holds at once: every idle runner of the pool keeps
one open per class. nats-server's default (512) refuses the rest (409), and nats-py's
fetch then waits out its window with no request at the server: past 512 idle runners
in a pool, the others could take no work, each refusal a reply to send and read
(benchmarks/bench_fleet.py). Fixed when a durable is created: nats-server refuses to
change it later."""


def runner_durable_config(
    topology: Topology,
    ack_wait_s: float,
    pool: str = DEFAULT_POOL,
    classes: PriorityClasses = DEFAULT_PRIORITY_CLASSES,
    priority_class: str | None = None,
) -> ConsumerConfig:
    """The durable pull consumer shared by the runners of ``pool`` for ``priority_class``
    (None: the default class of ``classes``)."""
    name = classes.resolve(priority_class)
    durable = topology.runner_durable_for(pool, classes.durable_class(name))
    filters = topology.work_class_filters(pool, name, default=name == classes.default)
    return ConsumerConfig(
        name=durable,
        durable_name=durable,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        filter_subjects=list(filters),
        ack_wait=ack_wait_s,
        max_deliver=-1,  # attempts are counted (KV) and bounded by the runner
        max_ack_pending=100_000,
        max_waiting=MAX_WAITING,
    )


def consumer_filters(info: ConsumerInfo) -> list[str]:
    """A durable's filters, sorted, whichever of its two fields holds them."""
    config = info.config
    if config.filter_subjects:
        return sorted(config.filter_subjects)
    return [config.filter_subject] if config.filter_subject else []


async def ensure_runner_durables(
    js: JetStreamContext,
    topology: Topology,
    ack_wait_s: float,
    pools: Sequence[str],
    classes: PriorityClasses,
    *,
    refilter: bool = True,
) -> None:
    """Create each (pool, class) durable that is missing; re-filter one whose filters
    differ (``refilter``: the admin may, a runner under per-role users may not).

    The default class's durable comes first: one left from before classes (filter
    ``work.<pool>.>``, or ``work.>`` from before pools) overlaps every class durable,
    which the stream would refuse, so it is narrowed before they are made.
    """
    ordered = (classes.default, *(c for c in classes.names if c != classes.default))
    for pool in dict.fromkeys(pools):
        for name in ordered:
            config = runner_durable_config(topology, ack_wait_s, pool, classes, name)
            assert config.durable_name is not None and config.filter_subjects is not None
            try:
                info = await js.consumer_info(topology.work_stream, config.durable_name)
            except NotFoundError:
                await js.add_consumer(topology.work_stream, config)
                log.info("consumer created", durable=config.durable_name, pool=pool, cls=name)
                continue
            held = info.config.max_waiting or 0
            if held < MAX_WAITING:
                log.warning(
                    "runner durable holds fewer waiting pulls than trialbus asks",
                    durable=config.durable_name,
                    max_waiting=held,
                    wanted=MAX_WAITING,
                    effect=f"past {held} idle runners in the pool, the rest are refused work",
                    fix="delete the durable while no trial of the pool is queued or "
                    "running; the next `trialbus provision` or runner start makes it anew",
                )
            if refilter and consumer_filters(info) != sorted(config.filter_subjects):
                # An update keeps the durable's delivery state (queued work stays); its
                # waiting-pull limit cannot change, so the update keeps the one it has.
                await js.add_consumer(
                    topology.work_stream, dataclasses.replace(config, max_waiting=held or None)
                )
                log.warning(
                    "runner durable re-filtered",
                    durable=config.durable_name,
                    was=consumer_filters(info),
                    now=config.filter_subjects,
                )
