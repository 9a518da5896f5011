"""Secrets reach the agent by environment variable name only, and leak nowhere.

A random secret is planted in the runners' environment (EmbeddedStack's
``runner_env``), and the manifest's agent lists only its NAME under ``api_key_env``.
One task proves the agent received the value (its solution writes the value's sha256,
its verifier rewards the expected hash); a second is the plain hello-file task. After
the experiment ran through the whole stack, the test scans

- every file under the stack's data folder (service logs, Harbor job folders:
  config.json, result.json, trial.log, agent and verifier output, sandboxes) and the
  CLI's output;
- every message published on the NATS server during the run (a core subscription to
  ``>``: work, events, logs, KV updates, API traffic), and what the streams still hold;
- every document of the test's ledger database;

for the value, and finds it zero times. Positive controls first show that each
scanner finds the value when it is planted on purpose, so the test can fail.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import shutil
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import bson
import nats
import pymongo
import pytest
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from schemas.subjects import Topology
from tests.e2e.cli import ROOT
from tests.e2e.conftest import Stacks
from tests.support.runner_policy import policy_env

pytestmark = pytest.mark.e2e

HELLO = ROOT / "examples" / "tasks" / "hello-file"
SECRET_ENV = "PLANTED_API_KEY"


# -- scanners ------------------------------------------------------------------------------


def files_containing(root: Path, needle: bytes) -> list[Path]:
    """Regular files under ``root`` whose bytes contain ``needle``."""
    found = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                found.append(path)
    return found


def _message_bytes(msg: Msg) -> bytes:
    headers = json.dumps(msg.headers or {}).encode()
    return msg.subject.encode() + b"\n" + headers + b"\n" + msg.data


@asynccontextmanager
async def captured(nats_url: str) -> AsyncIterator[list[bytes]]:
    """Every message the server routes while the block runs (subject, headers, data)."""
    seen: list[bytes] = []
    nc = await nats.connect(nats_url)

    async def keep(msg: Msg) -> None:
        seen.append(_message_bytes(msg))

    await nc.subscribe(">", cb=keep, pending_msgs_limit=1_000_000)
    try:
        yield seen
    finally:
        await nc.flush()
        await nc.drain()  # hands every queued message to ``keep``, then closes


async def stored_messages(nats_url: str, streams: list[str]) -> list[bytes]:
    """Every message still held by ``streams``."""
    out: list[bytes] = []
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        for stream in streams:
            try:
                state = (await js.stream_info(stream)).state
            except NotFoundError:
                continue
            for seq in range(max(state.first_seq, 1), state.last_seq + 1):
                try:
                    raw = await js.get_msg(stream, seq)
                except NotFoundError:
                    continue  # deleted (work-queue retention)
                headers = json.dumps(raw.headers or {}).encode()
                out.append(f"{raw.subject}\n".encode() + headers + b"\n" + (raw.data or b""))
    finally:
        await nc.close()
    return out


def ledger_documents(ledger_url: str, database: str) -> list[bytes]:
    """Every document of ``database`` but the kept report values, BSON-encoded
    (strings stay plain UTF-8)."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(ledger_url)
    try:
        db = client[database]
        names = [n for n in db.list_collection_names() if n != "derived"]
        return [bson.encode(doc) for name in names for doc in db[name].find()]
    finally:
        client.close()


def kept_values(ledger_url: str, database: str) -> list[bytes]:
    """The report values kept in ``database`` (services/reports/stored.py), unpacked:
    zlib would hide a secret from a scan of the raw documents."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(ledger_url)
    try:
        return [zlib.decompress(doc["blob"]) for doc in client[database]["derived"].find()]
    finally:
        client.close()


def occurrences(blobs: list[bytes], needle: bytes) -> int:
    return sum(blob.count(needle) for blob in blobs)


async def _experiment_recorded(
    ledger_url: str, database: str, experiment_id: str, timeout_s: float
) -> None:
    """Wait until the ledger holds the experiment's submission metadata (written by the
    importer). Its document may exist earlier, without metadata: the first record
    written creates it (the experiment list's entry)."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(ledger_url)
    try:
        deadline = asyncio.get_running_loop().time() + timeout_s
        query = {"experiment_id": experiment_id, "manifest": {"$exists": True}}
        while await asyncio.to_thread(client[database]["experiments"].find_one, query) is None:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(
                    f"the importer did not record experiment {experiment_id} in {timeout_s} s"
                )
            await asyncio.sleep(0.2)
    finally:
        client.close()


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture
def secret() -> str:
    # Shaped like a real key, unique per run; never written anywhere by this test
    # except the positive controls (in their own folder, subject and database).
    return "sk-planted-" + secrets.token_hex(20)


def _secret_task(dest: Path, secret: str) -> Path:
    """hello-file turned into a probe: reward 1 only if the agent saw ``$PLANTED_API_KEY``."""
    shutil.copytree(HELLO, dest)
    digest = hashlib.sha256(secret.encode()).hexdigest()
    solve = dest / "solution" / "solve.sh"
    solve.write_text(
        "#!/bin/bash\nset -euo pipefail\n"
        f'printf %s "${{{SECRET_ENV}:-}}" | sha256sum | cut -d" " -f1 > /app/key.sha256\n'
    )
    (dest / "tests" / "test.sh").write_text(
        "#!/bin/bash\n"
        f'if [ "$(cat /app/key.sha256 2>/dev/null)" = "{digest}" ]; then\n'
        "  echo 1 > /logs/verifier/reward.txt\nelse\n  echo 0 > /logs/verifier/reward.txt\nfi\n"
    )
    (dest / "instruction.md").write_text(
        "Write the sha256 of $PLANTED_API_KEY to /app/key.sha256.\n"
    )
    return dest


# -- the test ----------------------------------------------------------------------------------


async def test_positive_controls_find_a_planted_secret(
    tmp_path: Path, nats_url: str, ledger_url: str, ledger_db: str, secret: str
) -> None:
    needle = secret.encode()
    control = tmp_path / "control"
    (control / "deep" / "er").mkdir(parents=True)
    (control / "deep" / "er" / "trial.log").write_text(f"env: {SECRET_ENV}={secret}\n")
    assert files_containing(control, needle) == [control / "deep" / "er" / "trial.log"]

    async with captured(nats_url) as seen:
        nc = await nats.connect(nats_url)
        await nc.publish("control.security", json.dumps({"key": secret}).encode())
        await nc.flush()
        await nc.close()
    assert occurrences(seen, needle) == 1

    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(ledger_url)
    try:
        client[f"{ledger_db}_control"]["trials"].insert_one({"env": {"k": secret}})
        assert occurrences(ledger_documents(ledger_url, f"{ledger_db}_control"), needle) == 1
        packed = zlib.compress(json.dumps({"env": {"k": secret}}).encode())
        client[f"{ledger_db}_control"]["derived"].insert_one({"_id": "x", "blob": packed})
        assert occurrences(kept_values(ledger_url, f"{ledger_db}_control"), needle) == 1
    finally:
        client.drop_database(f"{ledger_db}_control")
        client.close()


async def test_secret_reaches_the_agent_and_nothing_else(
    stacks: Stacks,
    tmp_path: Path,
    nats_url: str,
    ledger_url: str,
    topology: Topology,
    ledger_db: str,
    secret: str,
) -> None:
    # The runner passes only the variable names its policy lists (its operator's choice).
    allow = policy_env(tmp_path / "policy", extra_secret_names=[SECRET_ENV])
    stack = stacks.make(concurrency=2, runner_env={SECRET_ENV: secret, **allow})
    probe = _secret_task(tmp_path / "tasks" / "secret-probe", secret)
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(
        "name: security\n"
        f"tasks: [{HELLO}, {probe}]\n"
        "agents:\n"
        f"  - name: oracle\n    api_key_env: [{SECRET_ENV}]\n"
        "compute: {environment: local}\n"
    )
    cli = stacks.cli(stack)
    env = cli.env
    env.pop(SECRET_ENV, None)  # only the runners know it

    # Blocking calls run in threads: the capture's subscription must keep reading.
    async with captured(nats_url) as seen:
        await asyncio.to_thread(stack.start)
        proc = await asyncio.create_subprocess_exec(
            *cli.argv("submit", str(manifest), "--wait", "--json"),
            env=env,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=240)
        assert proc.returncode == 0, stderr.decode()[-3000:]
        summary = json.loads(stdout)
        # `submit --wait` returns on the trials' ResultImported; the experiment's own
        # document (ExperimentSubmitted) may still be on its way (a batch naked on a
        # loaded machine is redelivered later), so wait for it before the stack stops.
        await _experiment_recorded(ledger_url, ledger_db, summary["experiment_id"], 120)
        await asyncio.to_thread(stack.stop)  # flush and close every service log
    assert summary["status"]["scored"] == 2

    # The agent really had the value: the probe's verifier rewarded its hash.
    docs = ledger_documents(ledger_url, ledger_db)
    records = [bson.decode(d) for d in docs if b"trial_id" in d and b"evaluation" in d]
    rewards = {r["provenance"]["task_name"]: r["evaluation"]["main_reward"] for r in records}
    assert rewards == {"hello-file": 1.0, "secret-probe": 1.0}

    needle = secret.encode()
    leaked_files = files_containing(stack.data_dir, needle)
    streams = [topology.work_stream, topology.events_stream, topology.logs_stream]
    stored = await stored_messages(nats_url, streams)
    # The scans saw the run: the experiment's document, its two records and the
    # ledger's note of its one-time listing backfill (ledger_meta).
    assert len(seen) > 20 and len(stored) > 5 and len(docs) == len(records) + 2 == 4
    assert len(list(stack.jobs_dir.rglob("config.json"))) == 3  # the job, its 2 trials
    assert leaked_files == []
    assert occurrences([stdout, stderr], needle) == 0
    assert occurrences(seen, needle) == 0
    assert occurrences(stored, needle) == 0
    assert occurrences(docs, needle) == 0
    # `submit --wait` printed the leaderboard, whose value is kept (unless a write was
    # in flight then): scanned unpacked.
    assert occurrences(kept_values(ledger_url, ledger_db), needle) == 0
    # The name, by contrast, is recorded: that is how the runner finds the value.
    assert occurrences(docs, SECRET_ENV.encode()) > 0
