"""Shared fixtures: one real nats-server and one real ledger per test session.

Tests isolate themselves inside the shared servers by name, not by server: each test
gets its own topology prefix (so its own streams, subjects and durables) and its own
database name. Starting servers per test would cost ~1.5 s each for the ledger.

Under ``CI=true`` a skipped test is a failed test: a missing nats-server or ledger
binary, bubblewrap, or root privilege means part of trialbus went untested, and the
summary line must say so. The one exception is a test marked ``docker`` (it needs a
Docker engine, which no machine here has; testcontainers tests skip cleanly).

The suite can run on pytest-xdist workers (``-n 2 --dist loadgroup``). Each
worker is its own session, so each starts its own servers above; tests already isolate
themselves by name, port and tmp_path, so no test depends on which worker runs it. A
module whose tests share a module- or class-scoped fixture (a whole stack, a Harbor
run) is kept on one worker, so that fixture is still built once. Tests of the multi-host
harness (tests/support/netns.py) share one worker too: its namespaces, links and markers
are machine-wide, and its stale sweep would take a crashed run that another worker's test
is about to inspect.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nats
import pytest
from nats.aio.client import Client as NatsClient

from infra.embedded import (
    BinaryNotFoundError,
    LedgerServer,
    NatsServer,
    find_binary,
)
from schemas.subjects import Topology

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from services.common.adapters.mongo_ledger import MongoLedger
    from tests.support.servers import Servers

IN_CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}
"""True when the suite runs in CI, where every prerequisite must be present."""


BYTECODE_CACHE = Path(__file__).resolve().parents[1] / ".trialbus" / "pycache"
"""Where the processes the suite starts keep compiled bytecode (the benchmarks' folder)."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "docker: needs a Docker engine (the only skip allowed under CI=true)"
    )
    share_bytecode_cache()


def share_bytecode_cache(cache: Path = BYTECODE_CACHE) -> None:
    """Let every Python process the suite starts reuse one bytecode cache.

    Where PYTHONDONTWRITEBYTECODE is set (these machines) and the venv ships no .pyc,
    each service, runner and ``trialbus`` command a test starts compiled every module it
    imports again (here a ``trialbus --help`` took 1.5 s instead of 0.6 s, a service's
    imports 3.5-5 s instead of 1.4-3 s), hundreds of times a run. With
    PYTHONPYCACHEPREFIX (as ``benchmarks.harness`` sets it) each module is compiled
    once; the source tree gets no ``__pycache__`` folders. Set here, before
    xdist starts its workers, so they and every child inherit it; a test that wants no
    bytecode written (tests/e2e/test_multi_host.py) still says so in its own env.
    """
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return  # bytecode is written where Python writes it: nothing to share
    cache.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONPYCACHEPREFIX", str(cache))
    del os.environ["PYTHONDONTWRITEBYTECODE"]


SHARED_SCOPES = frozenset({"class", "module", "package"})
"""Fixture scopes wider than a test and narrower than a session (see the module docstring)."""

NETNS_HARNESS = "tests.support.netns"
"""The multi-host harness's modules (netns and netns_host): machine-wide names."""


def _xdist_group(item: pytest.Item) -> str | None:
    """The one xdist group ``item`` must run in (see the module docstring), or None."""
    module = getattr(item, "module", None)
    if module is not None and any(
        str(getattr(value, "__module__", "") or "").startswith(NETNS_HARNESS)
        for value in vars(module).values()
    ):
        return "netns-hosts"
    defs = getattr(item, "_fixtureinfo", None)
    closure = defs.name2fixturedefs.values() if defs is not None else ()
    if any(fd[-1].scope in SHARED_SCOPES for fd in closure if fd):
        return item.nodeid.split("::")[0]
    return None


def pytest_make_parametrize_id(config: pytest.Config, val: object, argname: str) -> str | None:
    """Name an encoded event parameter by its type, not by its text.

    Its event_id and occurred_at are minted when the module is imported, so each xdist
    worker would collect a different test id and xdist refuses to run differing
    collections. Any other value keeps pytest's own id (None).
    """
    if not isinstance(val, (bytes, str)):
        return None
    try:
        data = json.loads(val)
    except ValueError:  # not JSON (UnicodeDecodeError is a ValueError too)
        return None
    if isinstance(data, dict) and "event_id" in data and "type" in data:
        return f"event:{data['type']}"
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Without this, ``--dist loadgroup`` would hand a module's tests to both workers
    # and each would build the module's fixture (for some, a whole trialbus stack).
    # One group per test: xdist would join two group names into a third group.
    for item in items:
        group = _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    # A hook rather than a rule in each file: it also catches skipif markers and
    # skips added later, so no test can drop out of a CI run silently.
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if IN_CI and report.skipped and item.get_closest_marker("docker") is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (
            f"CI=true: skipping is a failure here (only tests marked 'docker' may skip): {reason}"
        )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # ``-q`` prints only a count of skips: say why the docker tests did not run, so a
    # summary never hides that production parity went untested (reports carry their
    # markers as keywords, also from xdist workers).
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        if "docker" in getattr(report, "keywords", {}):
            longrepr = report.longrepr
            reason = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)
            reason = reason.removeprefix("Skipped: ")
            reasons[reason] = reasons.get(reason, 0) + 1
    for reason, n in reasons.items():
        terminalreporter.write_line(f"docker: {n} skipped: {reason}", yellow=True)


def skip_unless(missing: str | None) -> None:
    """Skip the test (a failure under CI=true) when ``missing`` names something absent."""
    if missing:
        if IN_CI:
            pytest.fail(f"CI=true: {missing}", pytrace=False)
        pytest.skip(missing)


# JetStream reserves every stream's max_bytes (the logs stream's 1 GiB) against the
# server's store limit, 75 % of the free disk by default: the session server holds a
# topology per test, and past about 54 of them here every new stream was refused with
# "insufficient storage resources available". Nothing is written near that much.
SESSION_NATS_CONFIG = "jetstream { max_file_store: 16T }"


def _session_server[S: (NatsServer, LedgerServer)](
    cls: type[S], tmp_path_factory: pytest.TempPathFactory, **kwargs: Any
) -> Iterator[S]:
    # Only a truly absent executable may skip; any other startup failure is a real
    # error and must fail the tests loudly.
    try:
        find_binary(cls.binary_name, cls.package)
    except BinaryNotFoundError as exc:
        skip_unless(str(exc))
    with cls(tmp_path_factory.mktemp(cls.binary_name), **kwargs) as server:
        yield server


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A nats-server with JetStream (file storage in a session temp dir)."""
    yield from _session_server(NatsServer, tmp_path_factory, config=SESSION_NATS_CONFIG)


@pytest.fixture(scope="session")
def ledger_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerServer]:
    """A SecantusDB MongoDB-wire server (storage in a session temp dir)."""
    yield from _session_server(LedgerServer, tmp_path_factory)


@pytest.fixture(scope="session")
def nats_url(nats_server: NatsServer) -> str:
    """Client URL of the session nats-server."""
    return nats_server.url


@pytest.fixture(scope="session")
def ledger_url(ledger_server: LedgerServer) -> str:
    """Connection string of the session ledger server."""
    return ledger_server.url


@pytest.fixture
def topology() -> Topology:
    """A topology with a prefix unique to this test (its own streams and durables)."""
    return Topology(prefix="t" + secrets.token_hex(5))


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NatsClient]:
    """A NATS connection of this test's own to ``nats_url``, closed at teardown."""
    client = await nats.connect(nats_url)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def ledger_db() -> str:
    """A database name unique to this test."""
    return "tb_" + secrets.token_hex(6)


@pytest.fixture
def servers(
    nats_url: str, ledger_url: str, topology: Topology, ledger_db: str, tmp_path: Path
) -> Servers:
    """This test's names in the session's servers, in one value (tests/support/servers.py)."""
    # Imported here: it pulls in the submitter app, which unit tests never need, and
    # its helpers import this module.
    from tests.support.servers import Servers

    return Servers(nats_url, ledger_url, topology, ledger_db, tmp_path)


@pytest.fixture
async def js(servers: Servers) -> AsyncIterator[JetStreamContext]:
    """JetStream on the session's nats-server with this test's streams declared
    (:meth:`Servers.connect`); the connection is closed at teardown."""
    client = await servers.connect()
    try:
        yield client.jetstream()
    finally:
        await client.close()


@pytest.fixture
async def ledger(servers: Servers) -> AsyncIterator[MongoLedger]:
    """A ledger adapter on this test's database, its indexes made as the services make
    them at start; closed at teardown."""
    led = servers.ledger()
    await led.ensure_indexes()
    try:
        yield led
    finally:
        await led.close()
