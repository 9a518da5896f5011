"""Shared fixtures: one real nats-server and one real ledger per test session.

Tests isolate themselves inside the shared servers by name, not by server: each test
gets its own topology prefix (so its own streams, subjects and durables) and its own
database name. Starting servers per test would cost ~1.5 s each for the ledger.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.embedded import (
    BinaryNotFoundError,
    LedgerServer,
    NatsServer,
    find_binary,
)
from schemas.subjects import Topology


def _require_binary(name: str, package: str) -> None:
    # Skip only when the executable is truly absent; any other startup failure is a
    # real error and must fail the tests loudly.
    try:
        find_binary(name, package)
    except BinaryNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A nats-server with JetStream (file storage in a session temp dir)."""
    _require_binary(NatsServer.binary_name, NatsServer.package)
    data_dir: Path = tmp_path_factory.mktemp("nats")
    with NatsServer(data_dir) as server:
        yield server


@pytest.fixture(scope="session")
def ledger_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerServer]:
    """A SecantusDB MongoDB-wire server (storage in a session temp dir)."""
    _require_binary(LedgerServer.binary_name, LedgerServer.package)
    data_dir: Path = tmp_path_factory.mktemp("ledger")
    with LedgerServer(data_dir) as server:
        yield server


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
def ledger_db() -> str:
    """A database name unique to this test."""
    return "tb_" + secrets.token_hex(6)
