"""NATS JetStream adapter: stream declaration, connecting, and the EventBus port.

The EventBus port (services.common.ports) is what logic sees; nats-py lives only in
the adapters. Streams are declared by ONE owner, ``ensure_streams``, which
creates missing streams and never rewrites an existing one (a service restart must
not silently change retention or replicas of a live stream).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import (
    BadRequestError,
    BucketNotFoundError,
    NoStreamResponseError,
    NotFoundError,
    ServiceUnavailableError,
)
from nats.js.kv import KeyValue

from schemas.events import Envelope, TrialLog, TrialRequested, encode_event
from schemas.subjects import Topology
from services.common.adapters.js_pipeline import publish_round
from services.common.errors import InternalError, Settle, TransientError
from services.common.logging import get_logger

log = get_logger(__name__)

ErrorCallback = Callable[[Exception], Awaitable[None]]
"""nats-py's ``error_cb``: called with each connection error."""

# Work dedup window: a CI retry of the same submission within a day publishes
# nothing new. Resubmissions after that are still safe: the submitter skips trials
# the ledger already scored.
WORK_DUPLICATE_WINDOW_S = 24 * 3600
EVENTS_MAX_AGE_S = 14 * 24 * 3600
LOGS_MAX_AGE_S = 2 * 24 * 3600
MAX_PAYLOAD = 1024 * 1024


def stream_configs(topology: Topology, replicas: int = 1) -> list[StreamConfig]:
    """The three streams trialbus uses, with their retention policies."""

    def stream(name: str, wildcard: str, retention: RetentionPolicy, **limits: Any) -> StreamConfig:
        # What every stream shares: file storage, the replicas, the payload limit.
        return StreamConfig(
            name=name,
            subjects=[wildcard],
            retention=retention,
            storage=StorageType.FILE,
            num_replicas=replicas,
            max_msg_size=MAX_PAYLOAD,
            **limits,
        )

    return [
        stream(
            topology.work_stream,
            topology.work_wildcard,
            RetentionPolicy.WORK_QUEUE,
            duplicate_window=WORK_DUPLICATE_WINDOW_S,
        ),
        stream(
            topology.events_stream,
            topology.events_wildcard,
            RetentionPolicy.LIMITS,
            max_age=EVENTS_MAX_AGE_S,
            duplicate_window=600,
        ),
        stream(
            topology.logs_stream,
            topology.logs_wildcard,
            RetentionPolicy.LIMITS,
            max_age=LOGS_MAX_AGE_S,
            max_bytes=1024 * 1024 * 1024,
            discard=DiscardPolicy.OLD,
            duplicate_window=60,
        ),
    ]


def kv_config(bucket: str, *, ttl_s: float | None, replicas: int) -> KeyValueConfig:
    """How the admin (and a service on an open stack) creates a trialbus KV bucket:
    one value per key, on file, ``replicas`` copies, entries expiring after ``ttl_s``
    (None: never)."""
    # direct: reads are $JS.API.DIRECT.GET.KV_<b>.$KV.<b>.<key>, so a role's read
    # right could be narrowed to some keys.
    return KeyValueConfig(
        bucket=bucket,
        history=1,
        ttl=ttl_s,
        storage=StorageType.FILE,
        replicas=replicas,
        direct=True,
    )


STREAM_NAME_IN_USE = 10058
"""JetStream's error code for a create naming a stream that exists with another
configuration: what a create answers when another process created it first."""


def created_meanwhile(exc: BadRequestError) -> bool:
    """Whether a refused create means another process created the stream (or the
    bucket's stream) between our look and our create: two services starting at once
    on a fresh server both find it missing, and the slower create is refused."""
    return exc.err_code == STREAM_NAME_IN_USE


UNANSWERED = (
    NatsTimeoutError,
    TimeoutError,
    NoRespondersError,
    NoStreamResponseError,
    ServiceUnavailableError,
)
"""What a JetStream request raises when no stream leader answered it (yet): a node
down, a leader being elected; worth another try, unlike a refusal."""

LEADER_WAIT_S = 30.0
"""How long :func:`await_leader` waits for a replicated stream to elect its leader."""


async def await_leader(js: JetStreamContext, stream: str, timeout_s: float = LEADER_WAIT_S) -> None:
    """Return once ``stream`` has a leader (at once on a single server).

    A replicated stream is created before its nodes have elected a leader; until
    then a publish to it, a KV put included, fails with "no responders". Whoever
    creates a stream (or finds one another process just created) waits here, so its
    first write does not fail on a loaded cluster. TransientError after
    ``timeout_s``: the stream has too few of its nodes up to elect one.
    """
    deadline = asyncio.get_running_loop().time() + timeout_s
    delay = 0.05
    while True:
        try:
            cluster = (await js.stream_info(stream)).cluster
            if cluster is None or cluster.leader:
                return
            why = "no leader elected yet"
        except UNANSWERED as exc:
            why = f"stream info unanswered ({type(exc).__name__})"
        if asyncio.get_running_loop().time() >= deadline:
            raise TransientError(
                f"stream {stream} has no leader after {timeout_s:.0f} s ({why}): too few "
                "of its NATS nodes are up to elect one"
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


async def open_kv(js: JetStreamContext, config: KeyValueConfig) -> KeyValue:
    """The bucket ``config`` names, created with ``config`` when missing, once its
    stream has a leader (:func:`await_leader`).

    An existing bucket is used as it is (the first creator's settings hold), also
    when another process created it while we looked.
    """
    assert config.bucket is not None
    try:
        kv = await js.key_value(config.bucket)
    except BucketNotFoundError:
        try:
            kv = await js.create_key_value(config)
        except BadRequestError as exc:
            if not created_meanwhile(exc):
                raise
            kv = await js.key_value(config.bucket)
    await await_leader(js, f"KV_{config.bucket}")
    return kv


async def ensure_streams(js: JetStreamContext, topology: Topology, replicas: int = 1) -> None:
    """Create trialbus's streams when missing; leave existing ones untouched (also one
    another process created while we looked); return once each has a leader."""
    for config in stream_configs(topology, replicas):
        assert config.name is not None
        try:
            cluster = (await js.stream_info(config.name)).cluster
            if cluster is None or cluster.leader:
                continue  # led already: the usual start, no second look
        except NotFoundError:
            try:
                await js.add_stream(config)
            except BadRequestError as exc:
                if not created_meanwhile(exc):
                    raise
            else:
                log.info("stream created", stream=config.name, replicas=replicas)
        await await_leader(js, config.name)


async def connect(
    servers: Sequence[str],
    name: str,
    *,
    credentials: Path | None = None,
    role: str | None = None,
    error_cb: ErrorCallback | None = None,
) -> NatsClient:
    """Connect to NATS, retrying forever on reconnects (services must outlive blips).

    With ``credentials`` (a role's file, ``CommonSettings.nats_credentials``) the
    connection authenticates as that role, refusing another role's file when ``role``
    is given; without, it connects anonymously (a server without authentication).
    ``error_cb`` sees every connection error (an authorization refusal included).
    """
    options: dict[str, Any] = {
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "connect_timeout": 5,
        "allow_reconnect": True,
    }
    if error_cb is not None:
        options["error_cb"] = error_cb
    if credentials is None:
        return await nats.connect(servers=list(servers), name=name, **options)
    # Here, not at the top: infra.nats_provision imports this module.
    from infra.nats_auth import connect_as, load_credentials

    return await connect_as(servers, load_credentials(credentials, role), name=name, **options)


def subject_for(topology: Topology, event: Envelope) -> str:
    """Subject an event is published to."""
    event_type: str = getattr(event, "type")  # noqa: B009 - every concrete event has one
    if isinstance(event, TrialRequested):
        compute = event.compute
        return topology.work_subject(event.experiment_id, compute.pool, compute.priority_class)
    if isinstance(event, TrialLog):
        return topology.log_subject(event.experiment_id, event.trial_id)
    return topology.event_subject(event_type, event.experiment_id)


async def apply_settle(msg: Msg, settle: Settle) -> None:
    """Settle a consumed JetStream message as ``settle_error`` (or a handler) decided."""
    if settle.action == "ack":
        await msg.ack()
    elif settle.action == "nak":
        # A zero delay is a plain nak: redelivered at once (e.g. a draining runner).
        await msg.nak(delay=settle.delay_s or None)
    else:
        await msg.term()


@dataclass(frozen=True, eq=False)
class JetStreamBus:
    """EventBus over JetStream. Publish timeouts are retried with the same msg id."""

    js: JetStreamContext
    topology: Topology
    _: KW_ONLY
    timeout_s: float = 5.0
    """How long one publish (or one pipelined round without progress) waits."""
    attempts: int = 6
    """How many times a message is sent, with the same msg id, before TransientError."""

    async def publish(self, event: Envelope, *, msg_id: str | None = None) -> bool:
        """Publish ``event``; False when JetStream dropped it as a duplicate."""
        return await self.publish_raw(
            subject_for(self.topology, event), encode_event(event), msg_id or event.dedup_id()
        )

    async def publish_raw(self, subject: str, data: bytes, msg_id: str) -> bool:
        """Publish bytes with a dedup id, retrying timeouts (not proof of failure).

        Returns False when JetStream reports the message as a duplicate.
        """
        delay = 0.2
        for attempt in range(1, self.attempts + 1):
            try:
                ack = await self.js.publish(
                    subject, data, timeout=self.timeout_s, headers={"Nats-Msg-Id": msg_id}
                )
                return not ack.duplicate
            except UNANSWERED as exc:
                if attempt == self.attempts:
                    raise TransientError(
                        f"JetStream did not acknowledge {subject} after {attempt} attempts: "
                        f"{type(exc).__name__}"
                    ) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        raise InternalError("unreachable: the publish loop returns or raises")

    async def publish_many(self, events: Sequence[Envelope], window: int = 512) -> list[bool]:
        """Publish many events pipelined (at most ``window`` unacknowledged), each
        acknowledged."""
        return await self.publish_many_raw(
            [(subject_for(self.topology, e), encode_event(e), e.dedup_id()) for e in events],
            window,
        )

    async def publish_many_raw(
        self, items: Sequence[tuple[str, bytes, str]], window: int = 512
    ) -> list[bool]:
        """Publish many messages pipelined, each acknowledged; per message, whether it
        was new (False: dropped as a duplicate).

        Pipelined (services.common.adapters.js_pipeline): no request, timer and inbox
        wait per message, at most ``window`` unacknowledged. Messages left without an
        acknowledgement (no progress for ``timeout_s``, or no stream answered) are sent
        again with the same msg id (JetStream drops the copies), up to ``attempts``
        rounds; then TransientError. A refusal by the server (APIError) is raised.
        """
        results = [False] * len(items)
        todo = list(range(len(items)))
        delay = 0.2
        # The JetStream context keeps its connection privately; the pipeline needs it
        # for its reply subscription.
        nc: NatsClient = self.js._nc
        for attempt in range(1, self.attempts + 1):
            todo = await publish_round(
                nc, items, todo, results, window=window, timeout_s=self.timeout_s
            )
            if not todo:
                return results
            if attempt < self.attempts:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        subject = items[todo[0]][0]
        raise TransientError(
            f"JetStream did not acknowledge {len(todo)} of {len(items)} messages "
            f"(first: {subject}) after {self.attempts} attempts"
        )
