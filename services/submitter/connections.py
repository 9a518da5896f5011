"""Opening the submitter's connections: the ONE place the CLI and the HTTP app do it.

``open_ledger`` gives the Ledger; ``open_nats`` gives a ``NatsSide`` (the EventBus,
the Coordinator, and feeds of an experiment's events), with the streams declared.
Each is an async context manager that closes what it opened. Handlers receive the
ports, never these classes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from nats.aio.client import Client as NatsClient
from nats.errors import AuthorizationError, NoServersError
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from infra.nats_auth import CredentialsError
from services.common.adapters.jetstream import JetStreamBus, connect, ensure_streams
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.adapters.nats_objects import open_bucket
from services.common.adapters.nats_registry import NatsRunnerRegistry
from services.common.errors import LedgerUnavailable, TransientError, UserInputError
from services.common.ports import Coordinator, EventBus, Ledger, ObjectStore, RunnerRegistry
from services.common.quotas import Quotas
from services.common.settings import CommonSettings

if TYPE_CHECKING:
    from services.submitter.handlers import SubmitterPorts

CLI_CONNECT_TIMEOUT_S = 10.0
"""A command gives up on NATS after this long (exit 3); a service waits for it."""

PROBE_CONNECT_TIMEOUT_S = 3.0
"""``trialbus import`` tries NATS this long, then imports into the ledger alone."""

REFUSED_WINDOW_S = 2.0
"""A command gives up at once when every NATS server refused connections for this long:
nothing listens there (no stack started). A server restarting is back well within it
(``trialbus up`` restarts its nats-server in about a second)."""

LEASE_TTL_S = 60.0
"""TTL of the leases bucket if the submitter is the first to create it (the runners'
default ack_wait); the submitter itself takes no lease."""


@dataclass(slots=True)
class _SubscriptionFeed:
    """EventFeed over a JetStream ordered consumer (services.submitter.waiting.EventFeed)."""

    sub: JetStreamContext.PushSubscription

    async def next_payload(self, timeout_s: float) -> bytes | None:
        """The next message's bytes, or None after ``timeout_s``."""
        try:
            msg = await self.sub.next_msg(timeout=timeout_s)
        except TimeoutError:
            return None
        return msg.data


@dataclass(slots=True)
class NatsSide:
    """What an open NATS connection offers the submitter."""

    nc: NatsClient
    settings: CommonSettings
    bus: EventBus
    _coordinator: Coordinator | None = field(default=None)
    _tasks: ObjectStore | None = field(default=None)
    _results: ObjectStore | None = field(default=None)
    _runners: NatsRunnerRegistry | None = field(default=None)

    async def coordinator(self) -> Coordinator:
        """The Coordinator (KV buckets opened, created when missing, on first use)."""
        if self._coordinator is None:
            self._coordinator = await NatsCoordinator.open(
                self.nc.jetstream(),
                self.settings.topology,
                lease_ttl_s=LEASE_TTL_S,
                replicas=self.settings.stream_replicas,
            )
        return self._coordinator

    async def runners(self) -> RunnerRegistry | None:
        """The runner registry, or None when the settings say not to check runners."""
        if not getattr(self.settings, "check_runners", False):
            return None
        return await self.registry()

    async def registry(self) -> NatsRunnerRegistry:
        """The runner registry whatever the settings (the fleet views read it; opened,
        created when missing, on first use)."""
        if self._runners is None:
            self._runners = await NatsRunnerRegistry.open(
                self.nc.jetstream(),
                self.settings.topology,
                replicas=self.settings.stream_replicas,
            )
        return self._runners

    async def tasks(self) -> ObjectStore:
        """The tasks bucket (created when missing and the credentials allow it)."""
        if self._tasks is None:
            self._tasks = await open_bucket(self.nc.jetstream(), self.settings, "tasks")
        return self._tasks

    async def ports_for[P: SubmitterPorts](
        self, ledger: Ledger, quotas: Quotas | None, build: Callable[..., P]
    ) -> P:
        """The submitter's ports over this connection and ``ledger``, made by ``build``
        (``SubmitterPorts``, or a ``functools.partial`` of a subclass given its own
        fields): bus, coordinator, tasks bucket, runner registry (None when the settings
        say not to check runners) and ``quotas``."""
        coordinator, tasks, runners = (
            await self.coordinator(),
            await self.tasks(),
            await self.runners(),
        )
        return build(self.bus, ledger, coordinator, tasks, runners, quotas)

    async def results(self) -> ObjectStore:
        """The results bucket (stored trial folders), read by the dashboard's downloads."""
        if self._results is None:
            self._results = await open_bucket(self.nc.jetstream(), self.settings, "results")
        return self._results

    @contextlib.asynccontextmanager
    async def events_of(self, experiment_id: str) -> AsyncIterator[_SubscriptionFeed]:
        """A feed of the experiment's events published from now on."""
        sub = await self.nc.jetstream().subscribe(
            self.settings.topology.event_filter("*", experiment_id),
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.NEW,
        )
        try:
            yield _SubscriptionFeed(sub)
        finally:
            with contextlib.suppress(Exception):  # closing: nothing left to lose
                await sub.unsubscribe()


@contextlib.asynccontextmanager
async def open_ledger(settings: CommonSettings) -> AsyncIterator[Ledger]:
    """The ledger (it connects lazily: an outage surfaces as LedgerUnavailable on use)."""
    ledger = MongoLedger(settings.ledger_url, settings.ledger_db)
    try:
        yield ledger
    except LedgerUnavailable as exc:
        raise LedgerUnavailable(
            f"{exc}; start the embedded stack with `trialbus up` (or `make up`), or set LEDGER_URL"
        ) from exc
    finally:
        await ledger.close()


@contextlib.asynccontextmanager
async def open_nats(
    settings: CommonSettings, name: str, *, timeout_s: float | None = CLI_CONNECT_TIMEOUT_S
) -> AsyncIterator[NatsSide]:
    """Connect to NATS and declare the streams; ``timeout_s`` None waits forever.

    Raises TransientError naming the URL and the fix when NATS cannot be reached.
    """
    if timeout_s is not None and await refused_throughout(
        settings.nats_servers, min(REFUSED_WINDOW_S, timeout_s)
    ):
        # nats-py would retry the refused connection until the timeout: 10 s of every
        # command run before `trialbus up`, for the same answer.
        raise TransientError(
            f"cannot reach NATS at {settings.nats_url} (connection refused: nothing listens "
            "there): start the embedded stack with `trialbus up` (or `make up`), or set "
            "NATS_URL"
        )
    refused: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        # nats-py retries a refused login forever; remember it to say so, not "unreachable".
        if isinstance(exc, AuthorizationError) or "authorization" in str(exc).lower():
            refused.append(exc)

    try:
        nc = await asyncio.wait_for(
            connect(
                settings.nats_servers,
                name,
                credentials=settings.nats_credentials,
                error_cb=on_error,
            ),
            timeout=timeout_s,
        )
    except CredentialsError as exc:  # missing, malformed, another role's, or not 0600
        raise UserInputError(str(exc)) from None
    except (NoServersError, OSError, TimeoutError) as exc:
        if refused:
            raise TransientError(
                f"NATS at {settings.nats_url} refused the login "
                + (
                    f"with the credentials {settings.nats_credentials}: they are not this "
                    "server's (restart `trialbus up`, or set TRIALBUS_NATS_CREDENTIALS)"
                    if settings.nats_credentials
                    else "without credentials: set TRIALBUS_NATS_CREDENTIALS to a role's "
                    "credentials file (`trialbus up` writes them to <data>/nats-auth)"
                )
            ) from exc
        raise TransientError(
            f"cannot reach NATS at {settings.nats_url}: start the embedded stack with "
            "`trialbus up` (or `make up`), or set NATS_URL"
        ) from exc
    try:
        js = nc.jetstream()
        await ensure_streams(js, settings.topology, settings.stream_replicas)
        yield NatsSide(nc, settings, JetStreamBus(js, settings.topology))
    finally:
        # Every publish here was acknowledged by JetStream already, so closing loses
        # nothing; drain() would wait on an ordered consumer's teardown instead.
        await nc.close()


@contextlib.asynccontextmanager
async def try_open_nats(
    settings: CommonSettings, name: str, *, timeout_s: float = PROBE_CONNECT_TIMEOUT_S
) -> AsyncIterator[NatsSide | None]:
    """``open_nats``, or None when NATS cannot be reached (for work that can do without)."""
    async with contextlib.AsyncExitStack() as stack:
        if await _all_refused(settings.nats_servers):
            # Nothing listens: nats-py would retry the refused connection until the
            # timeout (3 s of every `trialbus import` without a stack).
            yield None
            return
        try:
            side: NatsSide | None = await stack.enter_async_context(
                open_nats(settings, name, timeout_s=timeout_s)
            )
        except TransientError:
            side = None
        yield side


async def refused_throughout(servers: list[str], window_s: float) -> bool:
    """True when every server refused every connection tried over ``window_s``; False
    at the first answer of any other kind (then nats-py connects, or says why not)."""
    deadline = asyncio.get_running_loop().time() + window_s
    while await _all_refused(servers):
        if asyncio.get_running_loop().time() >= deadline:
            return True
        await asyncio.sleep(0.25)
    return False


async def _all_refused(servers: list[str]) -> bool:
    """True when every server refuses a TCP connection outright (nothing listens there).

    Anything else (a connection, a timeout, an unknown host) is left to nats-py.
    """
    for url in servers:
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(parts.hostname or "127.0.0.1", parts.port or 4222), 1.0
            )
        except ConnectionRefusedError:
            continue
        except (OSError, TimeoutError, ValueError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return False
    return bool(servers)
