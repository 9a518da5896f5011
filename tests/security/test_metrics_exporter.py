"""The Prometheus exporters answer on loopback only, unless the operator says otherwise
(anyone on the network → importer, watcher, runner).

The exporters have no authentication. Before, they bound every interface: anyone who
could reach the port read what runs, how much and how it fails. Now they bind
``TRIALBUS_METRICS_ADDR`` (default 127.0.0.1).

- The importer as its own process (tests/support/importer_process.py) with only
  ``TRIALBUS_METRICS_PORT`` set: ``/metrics`` answers on 127.0.0.1 and is refused on
  every non-loopback address of this machine (found from its interfaces; the test
  fails, never skips, when it finds none).
- The runner's exporter (services.common.runner_metrics.exporter, what the runner
  process runs) with the settings' default address: the same. Control: bound to
  ``0.0.0.0`` / ``::`` as an operator may choose, the same non-loopback addresses do
  answer, so a refusal above is the binding's, not the network's.
"""

from __future__ import annotations

import socket

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter

from infra.managed_process import free_port
from infra.service_process import ServiceProcess
from services.common.runner_metrics import exporter
from services.common.settings import CommonSettings
from tests.support import importer_process
from tests.support.addresses import non_loopback_addresses

pytestmark = pytest.mark.integration

importer = importer_process.importer


def _url(addr: str, port: int) -> str:
    host = f"[{addr}]" if ":" in addr else addr
    return f"http://{host}:{port}/metrics"


def answers(addr: str, port: int) -> bool:
    """Whether ``/metrics`` answers 200 on ``addr``:``port``; False when refused."""
    try:
        return httpx.get(_url(addr, port), timeout=5).status_code == 200
    except httpx.ConnectError:
        return False


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_port()


@pytest.fixture
def importer_env(metrics_port: int) -> dict[str, str]:
    return {"TRIALBUS_METRICS_PORT": str(metrics_port)}  # no address: the default


def test_the_importer_process_exports_on_loopback_only(
    importer: ServiceProcess, metrics_port: int
) -> None:
    outside = non_loopback_addresses()
    assert answers("127.0.0.1", metrics_port), importer.log_path.read_text()[-2000:]
    reached = [a for a in outside if answers(a, metrics_port)]
    assert reached == [], f"the importer's exporter answers on {reached}"


def test_the_runner_exporter_binds_the_default_address_and_only_it() -> None:
    outside = non_loopback_addresses()
    registry = CollectorRegistry()
    Counter("trialbus_probe", "A metric to read.", registry=registry).inc()
    default = str(CommonSettings().metrics_addr)
    assert default == "127.0.0.1"
    with exporter(registry, 0, default) as port:
        assert port is not None
        assert answers("127.0.0.1", port)
        assert [a for a in outside if answers(a, port)] == []
    with exporter(registry, 0) as port:  # the function's own default
        assert port is not None
        assert answers("127.0.0.1", port)
        assert [a for a in outside if answers(a, port)] == []
    # Control: the operator's choice of every interface is honoured, and the
    # probe reaches those addresses when something listens there.
    for family, wildcard in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        wanted = [a for a in outside if (":" in a) == (family == socket.AF_INET6)]
        if not wanted:
            continue
        addr = str(CommonSettings(metrics_addr=wildcard).metrics_addr)
        with exporter(registry, 0, addr) as port:
            assert port is not None
            assert all(answers(a, port) for a in wanted), (wildcard, wanted)
