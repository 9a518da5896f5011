"""The event contract: encode_event / parse_event, and each event's dedup id."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from schemas.events import (
    EVENT_TYPES,
    MAX_EVENT_BYTES,
    SCHEMA_VERSION,
    Envelope,
    EventDecodeError,
    ExperimentCompleted,
    ExperimentSubmitted,
    RunEvent,
    TrialCompleted,
    TrialFailed,
    TrialLog,
    TrialStarted,
    encode_event,
    parse_event,
)
from schemas.trial_events import MAX_MESSAGE_CHARS
from tests.support.event_builders import trial_failed
from tests.support.sample_events import RESULT, WHEN, instances

COMMON: dict[str, Any] = {
    "experiment_id": "exp-1",
    "correlation_id": "corr-1",
    "occurred_at": WHEN,
}


def one_of_each() -> list[Envelope]:
    """Every event type, optional fields set and not, first runs and resumed ones."""
    return list(instances().values())


def as_dict(event: Envelope) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(encode_event(event))
    return data


def decode_error(data: bytes | str) -> str:
    with pytest.raises(EventDecodeError) as exc:
        parse_event(data)
    return str(exc.value)


@pytest.fixture
def started() -> dict[str, Any]:
    """A valid encoded TrialStarted, as a dict to corrupt."""
    return as_dict(TrialStarted(**COMMON, trial_id="t1", runner_id="r", host="h", attempt=1))


# -- round trip ----------------------------------------------------------------------


def test_one_of_each_covers_every_event_type() -> None:
    assert {e.type for e in one_of_each()} == set(EVENT_TYPES)  # type: ignore[attr-defined]


@pytest.mark.parametrize("event", one_of_each(), ids=lambda e: e.type)
def test_round_trip_is_lossless(event: Envelope) -> None:
    decoded = parse_event(encode_event(event))
    assert type(decoded) is type(event)
    assert decoded == event
    assert decoded.occurred_at == WHEN
    assert encode_event(decoded) == encode_event(event)


@pytest.mark.parametrize("event", one_of_each(), ids=lambda e: e.type)
def test_str_input_decodes_like_bytes(event: Envelope) -> None:
    assert parse_event(encode_event(event).decode()) == event


def test_defaults_fill_the_envelope() -> None:
    a = ExperimentCompleted(experiment_id="e", n_trials=0, n_scored=0, n_partial=0)
    b = ExperimentCompleted(experiment_id="e", n_trials=0, n_scored=0, n_partial=0)
    assert a.event_id != b.event_id
    assert a.schema_version == SCHEMA_VERSION
    assert a.occurred_at.utcoffset() == timedelta(0)


def test_non_utc_offsets_are_kept_as_the_same_instant(started: dict[str, Any]) -> None:
    started["occurred_at"] = "2025-03-01T14:30:15.123456+02:00"
    assert parse_event(json.dumps(started)).occurred_at == WHEN


def test_unknown_extra_fields_are_tolerated(started: dict[str, Any]) -> None:
    started["added_in_a_later_minor_version"] = {"x": 1}
    event = parse_event(json.dumps(started))
    assert isinstance(event, TrialStarted)
    assert not hasattr(event, "added_in_a_later_minor_version")


# -- refusals ------------------------------------------------------------------------------


def test_unknown_type_is_refused(started: dict[str, Any]) -> None:
    started["type"] = "trial_exploded"
    assert decode_error(json.dumps(started)) == (
        f"invalid event at <root>: unknown event type (known: {', '.join(EVENT_TYPES)})"
    )


def test_missing_type_is_refused(started: dict[str, Any]) -> None:
    del started["type"]
    assert decode_error(json.dumps(started)) == "invalid event at <root>: missing 'type' field"


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (SCHEMA_VERSION + 1, f"Input should be less than or equal to {SCHEMA_VERSION}"),
        (0, "Input should be greater than or equal to 1"),
    ],
)
def test_unsupported_schema_version_is_refused(
    started: dict[str, Any], version: int, message: str
) -> None:
    started["schema_version"] = version
    assert decode_error(json.dumps(started)) == (
        f"invalid event at trial_started.schema_version: {message}"
    )


@pytest.mark.parametrize("naive", ["2025-03-01T12:30:15", "2025-03-01T12:30:15.5"])
def test_naive_timestamp_is_refused(started: dict[str, Any], naive: str) -> None:
    started["occurred_at"] = naive
    assert decode_error(json.dumps(started)) == (
        "invalid event at trial_started.occurred_at: Input should have timezone info"
    )


def test_missing_required_field_is_named(started: dict[str, Any]) -> None:
    del started["runner_id"]
    assert decode_error(json.dumps(started)) == (
        "invalid event at trial_started.runner_id: Field required"
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("{not json", "invalid event at <root>: Invalid JSON: key must be a string"),
        ("", "invalid event at <root>: Invalid JSON: EOF while parsing a value"),
        ("[1, 2]", "invalid event at <root>: Input should be an object"),
    ],
)
def test_malformed_json_is_refused(raw: str, expected: str) -> None:
    assert decode_error(raw).startswith(expected)


def test_oversized_payload_is_refused_before_parsing() -> None:
    # Not even JSON: the size check must come first.
    raw = b"x" * (MAX_EVENT_BYTES + 1)
    assert decode_error(raw) == (
        f"event of {MAX_EVENT_BYTES + 1} bytes exceeds the {MAX_EVENT_BYTES}-byte limit"
    )


def test_size_limit_counts_bytes_not_characters() -> None:
    # Under the limit in characters, over it in UTF-8 bytes.
    event = TrialLog(**COMMON, trial_id="t1", phase="agent", stream="stdout", text="é" * 300_000)
    raw = encode_event(event)
    assert len(raw.decode()) < MAX_EVENT_BYTES < len(raw)
    assert decode_error(raw.decode()) == (
        f"event of {len(raw)} bytes exceeds the {MAX_EVENT_BYTES}-byte limit"
    )


def test_payload_at_the_limit_is_accepted(started: dict[str, Any]) -> None:
    raw = json.dumps(started).encode()
    started["host"] = "h" * (MAX_EVENT_BYTES - len(raw) + 1)
    exact = json.dumps(started).encode()
    assert len(exact) == MAX_EVENT_BYTES
    assert isinstance(parse_event(exact), TrialStarted)


# -- dedup ids ---------------------------------------------------------------------------


def test_trial_requested_dedups_on_trial_id() -> None:
    requested = instances()["trial_requested"]
    assert requested.dedup_id() == "hello-file__0123456789abcdef"


def test_trial_completed_dedup_id_is_stable_per_run_and_attempt() -> None:
    def completed(trial_id: str, **kw: Any) -> TrialCompleted:
        return TrialCompleted(
            experiment_id="e", trial_id=trial_id, result=RESULT, trial_name=trial_id, **kw
        )

    first = completed("t1", attempt=1)
    republished = completed("t1", attempt=1, source="external", occurred_at=WHEN)
    assert first.event_id != republished.event_id
    # The same attempt published twice (a publish retry) dedupes ...
    assert first.dedup_id() == republished.dedup_id() == "t1:completed:1"
    # ... a redelivered attempt and a resumed re-run are new events.
    assert completed("t1", attempt=2).dedup_id() == "t1:completed:2"
    resumed = completed("t1", attempt=1, run_id="t1:resume:abc")
    assert resumed.dedup_id() == "t1:resume:abc:completed:1"
    assert completed("t2").dedup_id() != first.dedup_id()


def test_trial_started_dedup_id_differs_per_attempt() -> None:
    ids = {
        TrialStarted(experiment_id="e", trial_id="t", runner_id="r", host="h", attempt=n).dedup_id()
        for n in (1, 2, 2)
    }
    assert ids == {"t:started:1", "t:started:2"}


def test_trial_failed_dedup_id_separates_retry_from_final() -> None:
    assert trial_failed("t", attempt=3, final=False).dedup_id() == "t:failed:3:0"
    assert trial_failed("t", attempt=3, final=True).dedup_id() == "t:failed:3:1"


def test_each_submission_and_import_is_its_own_message() -> None:
    # Resubmitting and re-importing are legitimate repeats: keyed by event_id.
    subs = [
        ExperimentSubmitted(experiment_id="e", name="n", n_trials=1, n_published=1, manifest={})
        for _ in range(2)
    ]
    assert subs[0].dedup_id() != subs[1].dedup_id()
    assert subs[0].dedup_id() == f"e:submitted:{subs[0].event_id}"


# -- run events ------------------------------------------------------------------------


def test_every_run_event_shares_the_run_base() -> None:
    # The events that dedupe per run (work message) are exactly these four.
    run_events = {type(e).__name__ for e in one_of_each() if isinstance(e, RunEvent)}
    assert run_events == {"TrialRequested", "TrialStarted", "TrialCompleted", "TrialFailed"}


@pytest.mark.parametrize(
    "event",
    [e for e in one_of_each() if isinstance(e, RunEvent) and not e.run_id],
    ids=lambda e: e.type,
)
def test_run_dedup_ids_start_with_the_run_key(event: RunEvent) -> None:
    assert event.run_key == event.trial_id  # first run: run_id left empty
    resumed = event.model_copy(update={"run_id": f"{event.trial_id}:resume:7"})
    assert resumed.run_key == f"{event.trial_id}:resume:7"
    assert resumed.dedup_id().startswith(resumed.run_key)
    assert resumed.dedup_id() != event.dedup_id()


def test_run_id_is_serialized_last_and_can_be_left_out() -> None:
    started = TrialStarted(**COMMON, trial_id="t1", runner_id="r", host="h", attempt=1)
    assert list(started.model_dump())[-1] == "run_id"
    assert "run_id" not in started.model_dump(exclude={"run_id"})


# -- nothing in an event names a host path ----------------------------------------------


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        ("trial_requested", "experiment_id", "../etc"),
        ("trial_requested", "experiment_id", "exp.1"),  # a subject token: no dots
        ("trial_requested", "experiment_id", "exp/1"),
        ("trial_requested", "trial_id", "../../root"),
        ("trial_requested", "trial_id", ".hidden"),
        ("trial_requested", "trial_id", "a b"),
        ("trial_requested", "trial_id", "t>"),
        ("trial_requested", "run_id", "t1:resume/../x"),
        ("trial_completed", "trial_name", "../t1"),
        ("trial_completed", "trial_name", "/abs"),
    ],
)
def test_ids_that_could_name_a_path_or_a_subject_are_refused(
    name: str, field: str, value: str
) -> None:
    event = json.loads(encode_event(instances()[name]))
    event[field] = value
    with pytest.raises(EventDecodeError, match=field):
        parse_event(json.dumps(event).encode())


@pytest.mark.parametrize(
    ("field", "value"),
    [("name", "../../etc"), ("name", "a/b"), ("checksum", "not-hex"), ("path", "/tasks/x")],
)
def test_a_task_is_named_by_checksum_never_by_path(field: str, value: str) -> None:
    event = json.loads(encode_event(instances()["trial_requested"]))
    event["task"][field] = value
    with pytest.raises(EventDecodeError, match=f"task.{field}"):
        parse_event(json.dumps(event).encode())


def test_the_id_checks_pass_the_ids_trialbus_makes() -> None:
    # Negative control of the two tests above: unchanged events parse.
    for name in ("trial_requested", "trial_completed"):
        assert parse_event(encode_event(instances()[name])) == instances()[name]


def test_event_messages_are_bounded() -> None:
    event = json.loads(encode_event(instances()["trial_failed"]))
    event["message"] = "x" * (MAX_MESSAGE_CHARS + 1)
    with pytest.raises(EventDecodeError, match="message"):
        parse_event(json.dumps(event).encode())
    event["message"] = "x" * MAX_MESSAGE_CHARS
    assert isinstance(parse_event(json.dumps(event).encode()), TrialFailed)
