"""Poison events and malformed result folders against a real importer process.

The importer runs as its own process (services.importer, as in production) on the
session's real nats-server and ledger, under this test's own topology prefix and
database. The test publishes, interleaved in one burst:

- good TrialCompleted events pointing at trial folders Harbor wrote this session;
- TrialCompleted events pointing at the corpus's malformed result folders
  (tests/bad_inputs/results) and at a folder that does not exist;
- every poison event of the corpus (tests/bad_inputs/events), raw, including a
  600 KiB one (under the stream's 1 MiB max_msg_size, over parse_event's 512 KiB).

Then: every trial has exactly one record (complete for the good ones, partial with
the expected diagnostics for the bad ones), each poison message was terminated once
(nothing pending, nothing unacknowledged, no batch retried), and the importer is still
running. A message over the server's 1 MiB max_payload is refused at publish time.

A second test runs the importer's app in this process (its lifespan, without signal
handlers) with an importer bug planted for one trial: that message is nak'ed and
redelivered by the real server, the rest of its batch is written at once, and on
its BUG_MAX_DELIVERIES-th delivery it becomes an acknowledged ImporterError record.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
import structlog
from faststream import TestApp
from nats.errors import MaxPayloadError
from nats.js import JetStreamContext

from infra.stack import ServiceProcess
from schemas.events import encode_event
from schemas.record import TrialRecord
from schemas.subjects import Topology
from services.common import errors
from services.common.logging import NOISY_LIBRARIES
from services.common.settings import ImporterSettings
from services.importer import event_records
from services.importer.app import create_app
from services.importer.event_records import BUG_MAX_DELIVERIES
from services.importer.records import RecordContext, build_record
from services.importer.trial_files import TrialFiles
from tests import harbor_fixtures
from tests.bad_inputs.corpus import Case, cases, event_bytes, materialize_result
from tests.harbor_fixtures import HarborTrials
from tests.support import importer_process
from tests.support.importer_process import until
from tests.support.servers import Servers
from tests.support.stored_results import completed_from

pytestmark = pytest.mark.integration

harbor_trials = harbor_fixtures.harbor_trials  # the session's real Harbor trial folders
importer = importer_process.importer  # the importer as its own process, ready

EXPERIMENT = "poison-exp"
GOOD = ("oracle", "nop", "multi", "multi_nop", "broken", "timeout")
SCORED = {"oracle", "nop", "multi", "multi_nop", "timeout"}  # broken: verifier failed
TIMEOUT_S = 60.0
BUG_DELAY_S = 1.0


@pytest.fixture
def importer_env() -> dict[str, str]:
    """Several batches, each mixing good and poison."""
    return {"TRIALBUS_BATCH_SIZE": "16"}


def _log_events(importer: ServiceProcess, name: str) -> list[dict[str, Any]]:
    found = []
    for line in importer.log_path.read_text().splitlines():
        if line.startswith("{"):
            entry: dict[str, Any] = json.loads(line)
            if entry.get("event") == name:
                found.append(entry)
    return found


async def test_poison_and_malformed_results_are_settled_and_nothing_is_lost(
    importer: ServiceProcess,
    harbor_trials: HarborTrials,
    servers: Servers,
    topology: Topology,
    tmp_path: Path,
) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    good: dict[str, str] = {}  # trial_id -> fixture name
    bad: dict[str, Case] = {}
    messages: list[tuple[str, bytes]] = []
    done_subject = topology.event_subject("trial_completed", EXPERIMENT)
    folders: list[Path] = []
    for name in GOOD:
        for copy in range(2):
            trial_id = f"good-{name}-{copy}".replace("_", "-")
            good[trial_id] = name
            folders.append(harbor_trials.copy(name, job_dir, trial_id))
    for case in cases("results"):
        trial_id = f"bad-{case.name}"
        bad[trial_id] = case
        folders.append(materialize_result(case, harbor_trials["oracle"], job_dir / trial_id))

    nc = await nats.connect(servers.nats_url)
    ledger = servers.ledger()
    try:
        js: JetStreamContext = nc.jetstream()
        for folder in folders:
            event = await completed_from(js, topology, EXPERIMENT, folder)
            messages.append((done_subject, encode_event(event)))
        # A stored folder whose bytes no longer match the event: recorded as unusable.
        damaged_event = await completed_from(js, topology, EXPERIMENT, folders[0])
        damaged = "bad-stored-folder-damaged"
        damaged_event = damaged_event.model_copy(
            update={
                "trial_id": damaged,
                "trial_name": damaged,
                "result": damaged_event.result.model_copy(update={"sha256": "0" * 64}),
            }
        )
        messages.append((done_subject, encode_event(damaged_event)))
        poison = [*cases("events")]
        for case in poison:
            # On a subject the importer's durable takes: a subject it does not take
            # never reaches it (tests/unit/test_importer_filters.py).
            messages.append((done_subject, event_bytes(case)))
        random.Random(7).shuffle(messages)
        # Over the server's max_payload (1 MiB): refused before it reaches the stream.
        with pytest.raises(MaxPayloadError):
            await js.publish(done_subject, b"x" * (1024 * 1024 + 1))
        for i, (subject, data) in enumerate(messages):
            await js.publish(subject, data, headers={"Nats-Msg-Id": f"m{i}"})

        expected = len(good) + len(bad) + 1

        async def n_imported() -> int:
            imported = await js.stream_info(
                topology.events_stream,
                subjects_filter=topology.event_filter("result_imported", EXPERIMENT),
            )
            return sum((imported.state.subjects or {}).values())

        async def all_settled() -> bool:
            if await ledger.count_records(EXPERIMENT) < expected or await n_imported() < expected:
                return False
            info = await js.consumer_info(topology.events_stream, topology.importer_durable)
            return bool(info.num_pending == 0 and info.num_ack_pending == 0)

        await until(
            "every message settled and every trial recorded", all_settled, importer, TIMEOUT_S
        )
        records = {r.trial_id: r for r in await ledger.records_for(EXPERIMENT)}
        announced = await n_imported()
        info = await js.consumer_info(topology.events_stream, topology.importer_durable)
    finally:
        await ledger.close()
        await nc.close()

    # Exactly one record per trial, one ResultImported each, nothing else.
    assert set(records) == {*good, *bad, damaged}
    assert announced == expected
    for trial_id, name in good.items():
        record = records[trial_id]
        assert record.status == "complete" and record.errors == [], record.errors
        assert record.evaluation.reward_valid is (name in SCORED)
    wrong = []
    for trial_id, case in bad.items():
        try:
            _assert_diagnosed(records[trial_id], case)
        except AssertionError as exc:
            wrong.append(str(exc))
    assert wrong == []
    assert records[damaged].status == "partial"
    assert records[damaged].evaluation.exception_type == "ObjectCorrupt"

    # Poison: each terminated once on first delivery; no batch was ever retried.
    assert info.num_pending == 0 and info.num_ack_pending == 0 and info.num_redelivered == 0
    # Each message delivered once; the ResultImported are not the importer's to read.
    assert info.delivered.consumer_seq == len(messages)
    # (A batch redelivered after a lost pull would log its poison twice: hence >=.)
    terminated = [t["error"] for t in _log_events(importer, "poison event terminated")]
    assert len(terminated) >= len(poison)
    for case in poison:
        assert any(case.expect[0] in error for error in terminated), (case.id, terminated)
    assert _log_events(importer, "import batch failed; will be redelivered") == []
    assert importer.alive


def _assert_diagnosed(record: TrialRecord, case: Case) -> None:
    assert record.status == case.spec.get("status", "partial"), (case.id, record.errors)
    for fragment in case.expect_stored:
        assert any(fragment in line for line in record.errors), (case.id, record.errors)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """The in-process app configures logging for its process: undo it for later tests."""
    root = logging.getLogger()
    handlers_before, level_before = list(root.handlers), root.level
    structlog_before = structlog.get_config()
    libraries = {name: logging.getLogger(name).level for name in NOISY_LIBRARIES}
    yield
    root.handlers[:] = handlers_before
    root.setLevel(level_before)
    structlog.configure(**structlog_before)
    for name, level in libraries.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.usefixtures("restore_logging")
async def test_an_importer_bug_is_redelivered_then_recorded_and_never_holds_its_batch(
    harbor_trials: HarborTrials,
    servers: Servers,
    topology: Topology,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    attempts: list[str] = []

    def build(trial: Path | TrialFiles, context: RecordContext) -> TrialRecord:
        attempts.append(context.trial_id)
        if context.trial_id == "bug-1":
            raise KeyError("planted importer bug")
        return build_record(trial, context)

    monkeypatch.setattr(event_records, "build_record", build)
    # The bug delay shortened (10 s in production): the same five deliveries, in ~5 s.
    monkeypatch.setattr(errors, "BUG_RETRY_DELAY_S", BUG_DELAY_S)
    settings = servers.settings(ImporterSettings)
    good_dir = harbor_trials.copy("oracle", tmp_path, "good-1")
    subject = topology.event_subject("trial_completed", EXPERIMENT)
    deadline = time.monotonic() + TIMEOUT_S + BUG_MAX_DELIVERIES * BUG_DELAY_S

    async def until_deadline(what: str, check: Callable[[], Awaitable[bool]]) -> None:
        while not await check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.1)

    ledger = servers.ledger()
    async with TestApp(create_app(settings)):
        nc = await nats.connect(servers.nats_url)
        try:
            js = nc.jetstream()
            bug_dir = harbor_trials.copy("oracle", tmp_path, "bug-1")
            for trial_dir in (bug_dir, good_dir):
                event = await completed_from(js, topology, EXPERIMENT, trial_dir)
                await js.publish(subject, encode_event(event))

            async def recorded(trial_id: str) -> bool:
                return await ledger.get_record(trial_id) is not None

            await until_deadline("the good trial's record", lambda: recorded("good-1"))
            # Written on the bug's first delivery: the bug did not hold it back.
            assert attempts.count("bug-1") == 1
            assert await ledger.get_record("bug-1") is None

            await until_deadline("the ImporterError record", lambda: recorded("bug-1"))

            async def settled() -> bool:
                info = await js.consumer_info(topology.events_stream, topology.importer_durable)
                return bool(info.num_pending == 0 and info.num_ack_pending == 0)

            await until_deadline("every message settled", settled)
        finally:
            await nc.close()
            await ledger.close()

    # At most one build per delivery: nak'ed, redelivered, then given up on at the
    # BUG_MAX_DELIVERIES-th delivery. Fewer builds than deliveries is JetStream's right: a
    # message handed to a pull request that had already expired on a loaded machine counts
    # as delivered, and comes back after ack_wait without the importer having seen it.
    assert 2 <= attempts.count("bug-1") <= BUG_MAX_DELIVERIES
    assert attempts.count("good-1") == 1
    bug = await _get(servers, "bug-1")
    assert bug.status == "partial" and not bug.evaluation.reward_valid
    assert bug.evaluation.exception_type == "ImporterError"
    assert "KeyError: 'planted importer bug'" in (bug.evaluation.exception_message or "")
    good = await _get(servers, "good-1")
    assert good.status == "complete" and good.evaluation.reward_valid


async def _get(servers: Servers, trial_id: str) -> TrialRecord:
    ledger = servers.ledger()
    try:
        record = await ledger.get_record(trial_id)
    finally:
        await ledger.close()
    assert record is not None, trial_id
    return record
