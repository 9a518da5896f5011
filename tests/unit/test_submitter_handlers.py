"""The submitter's decisions (services.submitter.handlers) against the in-memory fakes:
submit lifts a cancellation, --wait counts only this submission's results and picks
the README's exit code, cancel reports what the ledger knew."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from rich.text import Text

from schemas.events import (
    Envelope,
    ExperimentSubmitted,
    ResultImported,
    TrialFailed,
    TrialRequested,
    encode_event,
)
from schemas.manifest import ExperimentManifest
from schemas.record import FailureClass, Provenance, TrialRecord
from schemas.runners import RunnerInfo
from services.common import errors as E
from services.common.adapters.memory import InMemoryCoordinator, InMemoryLedger, RecordingBus
from services.common.adapters.memory_objects import InMemoryObjectStore
from services.common.adapters.memory_registry import MemoryRunnerRegistry
from services.common.errors import ManifestError
from services.common.ports import ExperimentInfo
from services.common.unpack import unpack_task
from services.reports.queries import load_experiment
from services.submitter import handlers
from services.submitter.handlers import SubmitterPorts
from services.submitter.submit import PreparedExperiment, SubmitResult, longest_size, prepare
from tests.support.event_builders import result_imported, trial_failed
from tests.support.records import single_reward
from tests.support.sample_events import instances

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "examples" / "tasks"


class QueueFeed:
    """An EventFeed the test fills; it waits like a subscription when empty."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    def put(self, *events: ResultImported | TrialFailed) -> None:
        for event in events:
            self.queue.put_nowait(encode_event(event))

    async def next_payload(self, timeout_s: float) -> bytes | None:
        try:
            return await asyncio.wait_for(self.queue.get(), timeout_s)
        except TimeoutError:
            return None


class Lines:
    """A Printer that keeps what it is given, as a rich Console shows it (markup read
    unless ``markup=False``: ``[redacted:NAME]`` would vanish as a tag)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.printed = asyncio.Event()

    def print(self, *objects: object, markup: bool = True, **_kwargs: object) -> None:
        text = " ".join(str(o) for o in objects)
        self.lines.append(Text.from_markup(text).plain if markup else text)
        self.printed.set()


def _prepared(repetitions: int = 2) -> PreparedExperiment:
    manifest = ExperimentManifest.model_validate(
        {
            "name": "unit",
            "tasks": ["hello-file"],
            "agents": [{"name": "oracle"}],
            "repetitions": repetitions,
        }
    )
    return prepare(manifest, TASKS)


def _record(
    prepared: PreparedExperiment, i: int, reward: float | None, failure: FailureClass = "none"
) -> TrialRecord:
    return TrialRecord(
        trial_id=prepared.trials[i].trial_id,
        experiment_id=prepared.experiment_id,
        status="complete",
        provenance=Provenance(task_name="hello-file", agent_name="oracle"),
        evaluation=single_reward(reward, failure),
    )


def _imported(prepared: PreparedExperiment, i: int, correlation_id: str) -> ResultImported:
    return result_imported(
        prepared.trials[i].trial_id,
        experiment_id=prepared.experiment_id,
        correlation_id=correlation_id,
    )


async def _submit_and_wait(
    prepared: PreparedExperiment,
    ledger: InMemoryLedger,
    feed: QueueFeed | None,
    *,
    timeout_s: float,
    progress: Lines | None = None,
) -> handlers.SubmitOutcome:
    """``handlers.submit_and_wait`` with a recording bus and a fresh coordinator."""
    coordinator, tasks = InMemoryCoordinator(lease_ttl_s=60), InMemoryObjectStore("TASKS")
    ports = SubmitterPorts(RecordingBus(), ledger, coordinator, tasks)
    return await handlers.submit_and_wait(
        prepared, ports, feed, timeout_s=timeout_s, progress=progress
    )


async def test_submit_lifts_an_earlier_cancellation_and_publishes_every_trial(
    tmp_path: Path,
) -> None:
    prepared = _prepared()
    bus, ledger = RecordingBus(), InMemoryLedger()
    coordinator = InMemoryCoordinator(lease_ttl_s=60)
    await coordinator.cancel(prepared.experiment_id)
    assert await coordinator.is_cancelled(prepared.experiment_id)  # the control: it was set

    tasks = InMemoryObjectStore("TASKS")
    result = await handlers.submit(prepared, SubmitterPorts(bus, ledger, coordinator, tasks))

    assert not await coordinator.is_cancelled(prepared.experiment_id)
    # Every task's archive is stored, named by its checksum, before its trials go out.
    [task] = prepared.tasks
    assert task.folder is not None  # prepared from a folder on disk
    stored = await tasks.info(task.ref.checksum)
    assert stored is not None
    # It unpacks (verified against the checksum) into the task a runner would run.
    unpacked = unpack_task(await tasks.get(stored), tmp_path / "t", task.ref.checksum)
    assert (unpacked / "task.toml").read_bytes() == (task.folder / "task.toml").read_bytes()
    assert [e.experiment_id for e in bus.of_type(ExperimentSubmitted)] == [prepared.experiment_id]
    assert [t.trial_id for t in bus.of_type(TrialRequested)] == result.published_ids
    assert result.n_published == len(prepared.trials) == 2


async def test_resubmitting_skips_scored_trials() -> None:
    prepared = _prepared()
    bus, ledger = RecordingBus(), InMemoryLedger()
    await ledger.upsert_records([_record(prepared, 0, 1.0), _record(prepared, 1, None, "verifier")])

    coordinator, tasks = InMemoryCoordinator(lease_ttl_s=60), InMemoryObjectStore("TASKS")
    result = await handlers.submit(prepared, SubmitterPorts(bus, ledger, coordinator, tasks))

    assert result.n_already_scored == 1
    assert [t.trial_id for t in bus.of_type(TrialRequested)] == [prepared.trials[1].trial_id]


@pytest.mark.parametrize(
    ("counts", "code"),
    [
        ({"pending": 0, "scored": 4, "total": 4}, E.EXIT_OK),
        ({"pending": 0, "scored": 3, "total": 4}, E.EXIT_TRIALS_UNSCORED),
        ({"pending": 1, "scored": 3, "total": 4}, E.EXIT_TIMEOUT),
        ({"pending": 1, "scored": 0, "total": 4}, E.EXIT_TIMEOUT),
    ],
)
def test_exit_codes_follow_the_readme(counts: dict[str, int], code: int) -> None:
    assert handlers.exit_code_for(counts) == code


async def test_wait_counts_only_this_submissions_results() -> None:
    prepared = _prepared()
    ledger, feed, progress = InMemoryLedger(), QueueFeed(), Lines()
    # Unscored records of an earlier run: they are re-run, and the ledger already holding
    # a record proves nothing; only this submission's announcements count.
    await ledger.upsert_records([_record(prepared, i, None, "verifier") for i in range(2)])
    first = prepared.trials[0].trial_id
    feed.put(
        _imported(prepared, 0, "someone-else"),
        trial_failed(
            first,
            experiment_id=prepared.experiment_id,
            correlation_id=prepared.correlation_id,
            failure_class="infrastructure",
            error_type="EnvironmentStartTimeoutError",
            message="sandbox did not start within 60 s [redacted:API_KEY]\nTraceback ...",
            final=False,
        ),
        *(
            trial_failed(
                prepared.trials[1].trial_id,
                experiment_id=prepared.experiment_id,
                correlation_id=correlation,
                failure_class=failure_class,
                error_type=error_type,
                message="runner has no environment variable MY_KEY",
                final=True,
            )
            for correlation, failure_class, error_type in [
                (prepared.correlation_id, "infrastructure", "MissingSecretError"),
                ("someone-else", "infrastructure", "OtherSubmissionsError"),
                (prepared.correlation_id, "cancelled", "Cancelled"),
            ]
        ),
        _imported(prepared, 0, prepared.correlation_id),
        _imported(prepared, 1, prepared.correlation_id),
    )

    outcome = await _submit_and_wait(prepared, ledger, feed, timeout_s=10, progress=progress)

    assert outcome.counts["pending"] == 0
    assert outcome.exit_code == E.EXIT_TRIALS_UNSCORED  # both records are unscored
    assert outcome.summary["status"] == outcome.counts
    assert [r["n_trials"] for r in outcome.summary["leaderboard"]] == [2]
    assert (
        f"  retrying {first} after attempt 1: EnvironmentStartTimeoutError: sandbox did not "
        "start within 60 s [redacted:API_KEY]"
    ) in progress.lines
    # A trial that ends unscored says why as it happens (CI logs show the cause); not
    # another submission's, nor a cancellation's.
    second = prepared.trials[1].trial_id
    failures = [line for line in progress.lines if "ended unscored" in line]
    assert failures == [
        f"  {second} ended unscored (infrastructure) at attempt 1: MissingSecretError: "
        "runner has no environment variable MY_KEY"
    ]


async def test_wait_times_out_on_results_of_another_submission() -> None:
    """The negative control of the test above: the same records, foreign announcements."""
    prepared = _prepared()
    ledger, feed = InMemoryLedger(), QueueFeed()
    await ledger.upsert_records([_record(prepared, i, None, "verifier") for i in range(2)])
    feed.put(_imported(prepared, 0, "someone-else"), _imported(prepared, 1, "someone-else"))

    outcome = await _submit_and_wait(prepared, ledger, feed, timeout_s=0.3)

    assert outcome.counts["pending"] == 2
    assert outcome.exit_code == E.EXIT_TIMEOUT


async def test_a_timeout_before_anything_is_recorded_is_exit_4_not_unknown() -> None:
    prepared = _prepared()
    ledger = InMemoryLedger()

    outcome = await _submit_and_wait(prepared, ledger, QueueFeed(), timeout_s=0.2)

    assert (outcome.exit_code, outcome.rows) == (E.EXIT_TIMEOUT, [])
    with pytest.raises(E.ExperimentNotFound):  # what a required read would have said
        await load_experiment(ledger, prepared.experiment_id)


async def test_without_a_feed_submit_does_not_wait() -> None:
    outcome = await _submit_and_wait(_prepared(), InMemoryLedger(), None, timeout_s=0)
    assert (outcome.exit_code, outcome.rows, outcome.counts) == (E.EXIT_OK, None, {})
    assert "status" not in outcome.summary


async def test_cancel_flags_the_experiment_and_says_what_the_ledger_knew() -> None:
    prepared = _prepared()
    ledger = InMemoryLedger()
    coordinator = InMemoryCoordinator(lease_ttl_s=60)

    unknown = await handlers.cancel(ledger, coordinator, "not-submitted-yet")
    assert unknown["known"] is False and unknown["n_trials"] is None
    assert await coordinator.is_cancelled("not-submitted-yet")

    await ledger.upsert_experiment(ExperimentInfo(prepared.experiment_id, "unit", 2, {}))
    await ledger.upsert_records([_record(prepared, 0, 1.0)])
    known = await handlers.cancel(ledger, coordinator, prepared.experiment_id)
    assert (known["known"], known["n_trials"], known["already_recorded"]) == (True, 2, 1)
    assert await coordinator.is_cancelled(prepared.experiment_id)


async def test_importing_something_that_is_not_a_folder_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-job"
    with pytest.raises(E.UserInputError, match="no-such-job: not a folder"):
        await handlers.import_job(InMemoryLedger(), RecordingBus(), missing)


async def test_a_manifest_no_live_runner_can_run_is_refused_before_anything_is_published() -> None:
    prepared = _prepared()  # environment local, pool default
    bus, runners = RecordingBus(), MemoryRunnerRegistry()
    await runners.announce(
        RunnerInfo(runner_id="r-gpu", host="h", pool="gpu", capabilities=["local"], concurrency=1)
    )

    async def submit() -> SubmitResult:
        """Submit ``prepared`` to ``bus``, checked against ``runners``, on fresh ports."""
        ledger, tasks = InMemoryLedger(), InMemoryObjectStore("TASKS")
        coordinator = InMemoryCoordinator(lease_ttl_s=60)
        return await handlers.submit(
            prepared, SubmitterPorts(bus, ledger, coordinator, tasks, runners)
        )

    with pytest.raises(ManifestError, match=r"no live runner in pool 'default'.*gpu \(local\)"):
        await submit()
    assert bus.published == []
    # Negative control: once a default-pool runner that can run it is live, it goes out.
    await runners.announce(
        RunnerInfo(runner_id="r-1", host="h", capabilities=["local"], concurrency=2)
    )
    result = await submit()
    assert result.n_published == len(prepared.trials)


def test_the_longest_size_is_the_resumed_forms_encoding() -> None:
    """``longest_size`` adds the run id's growth instead of encoding a copy: it must equal
    the encoding of the resumed form, for first runs and for runs that have an id."""
    for name in ("trial_requested", "trial_requested_resumed"):
        trial = instances()[name]
        assert isinstance(trial, TrialRequested)
        for trial_id in (trial.trial_id, "a", "x" * 200 + ".b_c-d"):
            t = trial.model_copy(update={"trial_id": trial_id})
            resumed = t.model_copy(update={"run_id": f"{trial_id}:resume:{'0' * 12}"})
            assert longest_size(t) == len(encode_event(resumed)), (name, trial_id)
            # Negative control: the plain encoding alone is shorter.
            assert len(encode_event(t)) < longest_size(t)


async def test_an_interrupted_wait_says_the_experiment_goes_on_and_how_to_follow_it() -> None:
    prepared, progress = _prepared(), Lines()
    waiting = asyncio.create_task(
        _submit_and_wait(prepared, InMemoryLedger(), QueueFeed(), timeout_s=60, progress=progress)
    )
    exp = prepared.experiment_id
    async with asyncio.timeout(30):
        await progress.printed.wait()  # the first count: following
    assert progress.lines == [f"{exp} 0/2 done, 0 scored"]
    waiting.cancel()  # what asyncio.run does on Ctrl-C
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert progress.lines[-1] == (
        f"interrupted: experiment {exp} goes on running; `trialbus attach {exp}` follows it "
        f"again, `trialbus cancel {exp}` stops it"
    )


class StalledBus(RecordingBus):
    """A bus whose publishing never ends (a stalled NATS connection)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()

    async def publish_many(self, events: Sequence[Envelope]) -> list[bool]:
        self.entered.set()
        await asyncio.Event().wait()
        raise AssertionError("never reached")


async def test_an_interrupt_while_publishing_says_to_submit_again() -> None:
    prepared, progress, bus = _prepared(), Lines(), StalledBus()
    ports = SubmitterPorts(
        bus, InMemoryLedger(), InMemoryCoordinator(lease_ttl_s=60), InMemoryObjectStore("T")
    )
    waiting = asyncio.create_task(
        handlers.submit_and_wait(prepared, ports, QueueFeed(), timeout_s=60, progress=progress)
    )
    async with asyncio.timeout(30):
        await bus.entered.wait()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert progress.lines == [
        f"interrupted before every trial of {prepared.experiment_id} was published: submit "
        "the manifest again to publish the rest (a trial already queued is not queued twice)"
    ]
