"""Golden wire format: the exact JSON bytes and dedup id of every event type.

The bytes below (of the instances in tests/support/sample_events.py) were captured
from the event models before they were refactored
(shared RunEvent base, descriptions on every field). Other services, stored streams
and JetStream's dedup window depend on these bytes and ids, so any change to them —
including the order of keys — must be a deliberate contract change (a new
``SCHEMA_VERSION``), never a side effect of tidying the models.
"""

from __future__ import annotations

import json

import pytest

from schemas.events import EVENT_TYPES, encode_event, parse_event
from tests.support.sample_events import instances

# Schema version 2 (no host paths on the wire: TaskRef without path, TrialCompleted
# and TrialFailed point at their stored trial folder; pools in compute; a work message
# says how many trials its submission has, so runners skip a limit that cannot bind).
# Optional fields added since (a start's task and agent, a completion's task) are left
# out of the wire form when unset, so events without them keep their bytes; the
# instances that set them show where they go. Version 1 was
# captured before the models were refactored (commit bffb854).
# name -> (encode_event bytes, dedup_id()).
GOLDEN: dict[str, tuple[bytes, str]] = {
    "experiment_submitted": (
        b'{"event_id":"00000000000000000000000000000001",'
        b'"occurred_at":"2025-03-01T12:30:15.123456Z","schema_version":2,'
        b'"experiment_id":"exp-1","trial_id":null,"correlation_id":"corr-1",'
        b'"type":"experiment_submitted","name":"demo","n_trials":6,"n_published":4,'
        b'"manifest":{"name":"demo","repetitions":3}}',
        "exp-1:submitted:00000000000000000000000000000001",
    ),
    "trial_requested": (
        b'{"event_id":"00000000000000000000000000000002",'
        b'"occurred_at":"2025-03-01T12:30:15.123456Z","schema_version":2,'
        b'"experiment_id":"exp-1","trial_id":"hello-file__0123456789abcdef",'
        b'"correlation_id":"corr-1","type":"trial_requested","task":{"name":"hello-file",'
        b'"checksum":"abababababababababababababababababababababababababababababababab"},'
        b'"agent":{"name":"terminus-2","import_path":null,'
        b'"model":"anthropic/claude-sonnet-4","label":"t2","kwargs":{"temperature":0.5,'
        b'"nested":{"a":[1,2]}},"api_key_env":["ANTHROPIC_API_KEY"]},"repetition":2,'
        b'"compute":{"environment":"docker","environment_kwargs":{"cpus":2},'
        b'"n_concurrent_trials":8,"timeout_multiplier":1.0,"pool":"default",'
        b'"requires":[]},"retry":{"max_attempts":5,"backoff_seconds":2.0,'
        b'"max_backoff_seconds":60.0},"experiment_trials":12,"run_id":""}',
        "hello-file__0123456789abcdef",
    ),
    "trial_requested_resumed": (
        b'{"event_id":"00000000000000000000000000000003",'
        b'"occurred_at":"2025-03-01T12:30:15.123456Z","schema_version":2,'
        b'"experiment_id":"exp-1","trial_id":"t1","correlation_id":"corr-1",'
        b'"type":"trial_requested","task":{"name":"hello-file",'
        b'"checksum":"abababababababababababababababababababababababababababababababab"},'
        b'"agent":{"name":null,"import_path":"pkg.mod:Agent","model":null,"label":null,'
        b'"kwargs":{},"api_key_env":[]},"repetition":0,"compute":{"environment":"local",'
        b'"environment_kwargs":{},"n_concurrent_trials":4,"timeout_multiplier":1.0,'
        b'"pool":"default","requires":[]},"retry":{"max_attempts":3,'
        b'"backoff_seconds":2.0,"max_backoff_seconds":60.0},"experiment_trials":null,'
        b'"run_id":"t1:resume:2"}',
        "t1:resume:2",
    ),
    # A quota'd team's work message (docs/scheduling.md): ``team`` appears only when set,
    # so every other message keeps the bytes above.
    "trial_requested_team": (
        b'{"event_id":"0000000000000000000000000000000f",'
        b'"occurred_at":"2025-03-01T12:30:15.123456Z","schema_version":2,'
        b'"experiment_id":"exp-1","trial_id":"t1","correlation_id":"corr-1",'
        b'"type":"trial_requested","task":{"name":"hello-file",'
        b'"checksum":"abababababababababababababababababababababababababababababababab"},'
        b'"agent":{"name":"oracle","import_path":null,"model":null,"label":null,'
        b'"kwargs":{},"api_key_env":[]},"repetition":0,"compute":{"environment":"local",'
        b'"environment_kwargs":{},"n_concurrent_trials":4,"timeout_multiplier":1.0,'
        b'"pool":"default","requires":[]},"retry":{"max_attempts":3,'
        b'"backoff_seconds":2.0,"max_backoff_seconds":60.0},"experiment_trials":null,'
        b'"team":{"name":"red.team","max_concurrent_trials":4,"max_spend_usd_per_day":25.0},'
        b'"run_id":""}',
        "t1",
    ),
    "trial_started": (
        b'{"event_id":"00000000000000000000000000000004",'
        b'"occurred_at":"2025-03-01T12:30:15.123456Z","schema_version":2,'
        b'"experiment_id":"exp-1","trial_id":"t1","correlation_id":"corr-1",'
        b'"type":"trial_started","runner_id":"r-1","host":"node-a","attempt":2,'
        b'"run_id":""}',
        "t1:started:2",
    ),
    "trial_started_resumed": (
        b'{"event_id":"00000000000000000000000000000005",'
        b'"occurred_at":"2025-03-01T12:30:15.123456Z","schema_version":2,'
        b'"experiment_id":"exp-1","trial_id":"t1","correlation_id":"corr-1",'
        b'"type":"trial_started","runner_id":"r-1","host":"node-a","attempt":1,'
        b'"run_id":"t1:resume:2"}',
        "t1:resume:2:started:1",
    ),
    # Added with the fields that name a running trial's task and agent (left out when
    # unset, so the two instances above keep their bytes).
    "trial_started_named": (
        b'{"event_id":"00000000000000000000000000000010",'
        b'"occurred_at":"2025-03-01T12:30:15.123456Z","schema_version":2,'
        b'"experiment_id":"exp-1","trial_id":"t1","correlation_id":"corr-1",'
        b'"type":"trial_started","runner_id":"r-1","host":"node-a","attempt":1,'
        b'"task_name":"hello-file","agent_label":"t2","model":"anthropic/claude-sonnet-4",'
        b'"run_id":""}',
        "t1:started:1",
    ),
    "trial_log": (
        b'{"event_id":"00000000000000000000000000000006",'
        b'"occurred_at":"2025-03-01T12:30:15.123456Z","schema_version":2,'
        b'"experiment_id":"exp-1","trial_id":"t1","correlation_id":"corr-1",'
        b'"type":"trial_log","phase":"agent","stream":"stderr","text":"h\xc3\xa9llo \\"q\\"\\n"}',
        "00000000000000000000000000000006",
    ),
    "trial_completed": (
        b'{"event_id":"00000000000000000000000000000007",'
        b'"occurred_at":"2025-03-01T12:30:15.123456Z","schema_version":2,'
        b'"experiment_id":"exp-1","trial_id":"t1","correlation_id":"corr-1",'
        b'"type":"trial_completed","result":{"bucket":"TRIALBUS_RESULTS",'
        b'"name":"exp-1/t1:resume:2/3.tar.gz","size":2048,'
        b'"sha256":"cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"},'
        b'"trial_name":"t1","source":"external","runner_host":"node-a",'
        b'"harbor_version":"0.1.0","environment":"docker","agent_label":"mine",'
        b'"attempt":3,"repetition":1,"task":{"name":"hello-file",'
        b'"checksum":"abababababababababababababababababababababababababababababababab"},'
        b'"run_id":"t1:resume:2"}',
        "t1:resume:2:completed:3",
    ),
    "trial_completed_defaults": (
        b'{"event_id":"00000000000000000000000000000008",'
        b'"occurred_at":"2025-03-01T12:30:15.123456Z","schema_version":2,'
        b'"experiment_id":"exp-1","trial_id":"t1","correlation_id":"corr-1",'
        b'"type":"trial_completed","result":{"bucket":"TRIALBUS_RESULTS",'
        b'"name":"exp-1/t1:resume:2/3.tar.gz","size":2048,'
        b'"sha256":"cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"},'
        b'"trial_name":"t1","source":"runner","runner_host":null,"harbor_version":null,'
        b'"environment":null,"agent_label":null,"attempt":1,"repetition":null,'
        b'"run_id":""}',
        "t1:completed:1",
    ),
    "trial_failed": (
        b'{"event_id":"00000000000000000000000000000009",'
        b'"occurred_at":"2025-03-01T12:30:15.123456Z","schema_version":2,'
        b'"experiment_id":"exp-1","trial_id":"t1","correlation_id":"corr-1",'
        b'"type":"trial_failed","failure_class":"infrastructure",'
        b'"error_type":"SandboxBuildFailedError","message":"build failed","attempt":1,'
        b'"final":true,"result":{"bucket":"TRIALBUS_RESULTS",'
        b'"name":"exp-1/t1:resume:2/3.tar.gz","size":2048,'
        b'"sha256":"cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"},'
        b'"task":{"name":"hello-file",'
        b'"checksum":"abababababababababababababababababababababababababababababababab"},'
        b'"agent":{"name":"terminus-2","import_path":null,'
        b'"model":"anthropic/claude-sonnet-4","label":"t2","kwargs":{"temperature":0.5,'
        b'"nested":{"a":[1,2]}},"api_key_env":["ANTHROPIC_API_KEY"]},"repetition":0,'
        b'"runner_host":"node-b","run_id":"t1:resume:2"}',
        "t1:resume:2:failed:1:1",
    ),
    "trial_failed_retry": (
        b'{"event_id":"0000000000000000000000000000000a",'
        b'"occurred_at":"2025-03-01T12:30:15.123456Z","schema_version":2,'
        b'"experiment_id":"exp-1","trial_id":"t1","correlation_id":"corr-1",'
        b'"type":"trial_failed","failure_class":"agent","error_type":"X","message":"m",'
        b'"attempt":2,"final":false,"result":null,"task":null,"agent":null,'
        b'"repetition":null,"runner_host":null,"run_id":""}',
        "t1:failed:2:0",
    ),
    "result_imported": (
        b'{"event_id":"0000000000000000000000000000000b",'
        b'"occurred_at":"2025-03-01T12:30:15.123456Z","schema_version":2,'
        b'"experiment_id":"exp-1","trial_id":"t1","correlation_id":"corr-1",'
        b'"type":"result_imported","status":"complete","scored":true,"main_reward":0.75,'
        b'"changed":true}',
        "t1:imported:0000000000000000000000000000000b",
    ),
    "result_imported_partial": (
        b'{"event_id":"0000000000000000000000000000000c",'
        b'"occurred_at":"2025-03-01T12:30:15.123456Z","schema_version":2,'
        b'"experiment_id":"exp-1","trial_id":"t1","correlation_id":"corr-1",'
        b'"type":"result_imported","status":"partial","scored":false,"main_reward":null,'
        b'"changed":false}',
        "t1:imported:0000000000000000000000000000000c",
    ),
    "experiment_completed": (
        b'{"event_id":"0000000000000000000000000000000d",'
        b'"occurred_at":"2025-03-01T12:30:15.123456Z","schema_version":2,'
        b'"experiment_id":"exp-1","trial_id":null,"correlation_id":"corr-1",'
        b'"type":"experiment_completed","n_trials":6,"n_scored":5,"n_partial":1}',
        "exp-1:completed:6:5:1",
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_encoding_is_byte_identical_to_the_golden(name: str) -> None:
    assert encode_event(instances()[name]) == GOLDEN[name][0]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_dedup_id_matches_the_golden(name: str) -> None:
    assert instances()[name].dedup_id() == GOLDEN[name][1]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_bytes_round_trip_through_parse_event(name: str) -> None:
    decoded = parse_event(GOLDEN[name][0])
    assert type(decoded) is type(instances()[name])
    assert decoded == instances()[name]
    assert encode_event(decoded) == GOLDEN[name][0]


def test_golden_covers_every_event_type_and_every_instance() -> None:
    assert set(GOLDEN) == set(instances())
    assert {json.loads(raw)["type"] for raw, _ in GOLDEN.values()} == set(EVENT_TYPES)


def test_golden_comparison_sees_key_order_and_values() -> None:
    # Negative controls: the same content with keys in another order decodes to an equal
    # event but is not the golden bytes; one changed value changes the bytes.
    raw = GOLDEN["trial_started"][0]
    reordered = json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")).encode()
    assert parse_event(reordered) == instances()["trial_started"]
    assert reordered != raw
    changed = instances()["trial_started"].model_copy(update={"host": "node-b"})
    assert encode_event(changed) != raw
