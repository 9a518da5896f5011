"""This test's place in the session's servers, and what tests build on it.

Every integration test points some trialbus component (a CLI command, a submitter app,
a service's settings, a ledger adapter) at the same four things: the session's
nats-server and ledger URLs, the test's own topology prefix and its own database
(tests/conftest.py). Passed by hand, they came in two argument orders (``Cli`` takes the
prefix before the database, the submitter helpers after); :class:`Servers` holds them
once, and the ``servers`` fixture gives one to each test.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import nats
from nats.aio.client import Client as NatsClient

from infra.embedded_stack import stack_env
from schemas.subjects import Topology
from services.common.adapters.jetstream import ensure_streams
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.settings import CommonSettings, SubmitterSettings
from tests.e2e.cli import Cli
from tests.support.api_client import api_client, examples_api, submit_example, submitter_settings
from tests.support.dashboard_site import site_settings

ApiClient = AbstractAsyncContextManager[httpx.AsyncClient]
"""An in-process submitter app's client, for as long as the ``async with`` block runs."""


@dataclass(frozen=True)
class Servers:
    """The session's servers as one test sees them: URLs, its prefix, its database."""

    nats_url: str
    """The session's nats-server (shared: the test's names keep it apart)."""
    ledger_url: str
    """The session's MongoDB-wire ledger server."""
    topology: Topology
    """The test's own streams, subjects, durables and buckets (a unique prefix)."""
    ledger_db: str
    """The test's own ledger database."""
    tmp_path: Path
    """The test's own folder (tokens files, the CLI's absent stack file)."""

    @property
    def prefix(self) -> str:
        """The test's topology prefix (its streams, subjects and durables)."""
        return self.topology.prefix

    def env(self) -> dict[str, str]:
        """This process's environment without TRIALBUS_*, pointed at the test's names."""
        return stack_env(self.nats_url, self.ledger_url, self.prefix, self.ledger_db)

    def cli(self, *, prefix: str | None = None, **extra_env: str) -> Cli:
        """The ``trialbus`` command on the test's names (``prefix`` overrides its own);
        no stack file, so a developer's running ``trialbus up`` is never picked up."""
        return Cli(
            self.nats_url,
            self.ledger_url,
            prefix or self.prefix,
            self.ledger_db,
            self.tmp_path / "no-stack.json",
            extra_env=tuple(extra_env.items()),
        )

    async def connect(self) -> NatsClient:
        """A connection to the session's nats-server on which the test's streams exist
        (declared as every service declares them at its start); the caller closes it."""
        nc = await nats.connect(self.nats_url)
        await ensure_streams(nc.jetstream(), self.topology)
        return nc

    def ledger(self) -> MongoLedger:
        """A ledger adapter on the test's database (the caller closes it)."""
        return MongoLedger(self.ledger_url, self.ledger_db)

    def settings[S: CommonSettings](self, cls: type[S], **options: Any) -> S:
        """A service's settings ``cls`` on the test's names; ``options``: further fields."""
        return cls(
            nats_url=self.nats_url,
            ledger_url=self.ledger_url,
            ledger_db=self.ledger_db,
            prefix=self.prefix,
            **options,
        )

    def submitter_settings(self, **options: Any) -> SubmitterSettings:
        """:func:`tests.support.api_client.submitter_settings` on the test's names."""
        return submitter_settings(
            self.nats_url, self.ledger_url, self.ledger_db, self.prefix, **options
        )

    def site_settings(self, token: str, identity: str = "user: ada") -> SubmitterSettings:
        """:func:`tests.support.dashboard_site.site_settings` on the test's names (its
        tokens file in the test's folder)."""
        return site_settings(
            self.tmp_path,
            self.nats_url,
            self.ledger_url,
            self.ledger_db,
            self.prefix,
            token,
            identity,
        )

    def api(self, **options: Any) -> ApiClient:
        """:func:`tests.support.api_client.api_client` on the test's names."""
        return api_client(self.nats_url, self.ledger_url, self.ledger_db, self.prefix, **options)

    def examples_api(self, *, check_runners: bool) -> ApiClient:
        """:func:`tests.support.api_client.examples_api` on the test's names."""
        return examples_api(
            self.nats_url, self.ledger_url, self.ledger_db, self.prefix, check_runners=check_runners
        )

    async def submit_example(self, manifest: str) -> str:
        """:func:`tests.support.api_client.submit_example` on the test's names."""
        return await submit_example(
            self.nats_url, self.ledger_url, self.ledger_db, self.prefix, manifest
        )
