"""The Ledger contract (tests/integration/test_ledger_contract.py) against MongoDB itself.

Every test of the contract is collected here again (copied into this module's
namespace, which is what pytest collects), so a test added to the contract runs on
production's database too without being written twice. The adapter under test is
MongoLedger on the replica set of tests/parity/conftest.py: ``ledger_factory`` below
replaces the contract's memory/mongo pair, and the contract's MongoLedger-only tests
reach the same server through ``ledger_url``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from services.common.adapters.mongo_ledger import MongoLedger
from services.common.ports import Ledger
from tests.integration import test_ledger_contract as contract
from tests.integration.test_ledger_contract import ledger

__all__ = ["ledger", "ledger_factory"]

pytestmark = [pytest.mark.docker, pytest.mark.integration, pytest.mark.timeout(600)]

globals().update({name: f for name, f in vars(contract).items() if name.startswith("test_")})


@pytest.fixture
def ledger_factory(ledger_url: str, ledger_db: str) -> Callable[[], Ledger]:
    """MongoLedger on the container's replica set; all made in one test share a database."""
    return lambda: MongoLedger(ledger_url, ledger_db)
