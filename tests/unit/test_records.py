"""build_record / build_failed_record on real Harbor trial folders and corrupted copies.

Every result.json here was written by Harbor during this test session (see
tests/harbor_fixtures.py); malformed variants are copies of those, corrupted on purpose.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from schemas.events import TaskRef
from schemas.manifest import LOCAL_ENVIRONMENT_IMPORT_PATH, AgentSpec
from schemas.objects import ObjectRef
from services.common.archive import pack_trial
from services.common.unpack import unpack_trial
from services.importer.reads import MAX_FILE_BYTES
from services.importer.records import RecordContext, build_failed_record, build_record
from services.importer.scoring import main_reward_key
from tests.harbor_fixtures import JOB_ID, HarborTrials
from tests.support.event_builders import trial_failed

CTX = RecordContext(experiment_id="exp-1", trial_id="trial-1", source="import")

Mutation = Callable[[dict[str, Any]], None]


def _result(trial_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((trial_dir / "result.json").read_text())
    return data


def corrupted(harbor_trials: HarborTrials, tmp_path: Path, name: str, mutate: Mutation) -> Path:
    """A copy of a real trial folder whose result.json went through ``mutate``."""
    trial = harbor_trials.copy(name, tmp_path)
    data = _result(trial)
    mutate(data)
    # json.dumps writes NaN / Infinity literals for non-finite floats, as a buggy
    # writer would; Python's json reads them back.
    (trial / "result.json").write_text(json.dumps(data, indent=2))
    return trial


def with_result_text(harbor_trials: HarborTrials, tmp_path: Path, content: bytes) -> Path:
    trial = harbor_trials.copy("oracle", tmp_path)
    (trial / "result.json").write_bytes(content)
    return trial


# -- real Harbor results ---------------------------------------------------------------


def test_oracle_trial_is_complete_and_scored(harbor_trials: HarborTrials) -> None:
    trial = harbor_trials["oracle"]
    written = _result(trial)

    record = build_record(trial, CTX)

    assert record.status == "complete" and record.errors == []
    ev = record.evaluation
    assert (ev.rewards, ev.main_reward_key, ev.main_reward) == ({"reward": 1.0}, "reward", 1.0)
    assert ev.reward_valid and ev.failure_class == "none" and ev.exception_type is None
    p = record.provenance
    assert (p.task_name, p.agent_name, p.agent_version) == ("hello-file", "oracle", "1.0.0")
    assert p.task_path == written["config"]["task"]["path"]
    assert p.task_checksum == written["task_checksum"]
    assert p.harbor_trial_uuid == written["id"]
    assert p.job_id == JOB_ID
    assert p.environment == LOCAL_ENVIRONMENT_IMPORT_PATH
    assert p.source == "import" and p.model is None
    t = record.timing
    assert t.started_at is not None and t.started_at.tzinfo is not None
    assert t.total_s is not None and t.total_s > 0
    for phase in (t.environment_setup_s, t.agent_setup_s, t.agent_execution_s, t.verifier_s):
        assert phase is not None and 0 <= phase <= t.total_s
    assert record.artifacts.result_path == str(trial / "result.json")
    assert record.artifacts.verifier_dir == str(trial / "verifier")
    assert record.artifacts.agent_dir == str(trial / "agent")
    assert record.artifacts.job_dir == str(harbor_trials.job_dir)


def test_zero_reward_is_a_valid_score(harbor_trials: HarborTrials) -> None:
    ev = build_record(harbor_trials["nop"], CTX).evaluation
    assert ev.main_reward == 0.0 and ev.reward_valid


def test_multi_key_reward_json(harbor_trials: HarborTrials) -> None:
    record = build_record(harbor_trials["multi"], CTX)
    ev = record.evaluation
    assert record.status == "complete"
    assert ev.rewards == {"reward": 1.0, "file_a": 1.0, "file_b": 1.0, "file_c": 1.0}
    assert all(type(v) is float for v in ev.rewards.values())  # Harbor stored ints
    assert (ev.main_reward_key, ev.main_reward, ev.reward_valid) == ("reward", 1.0, True)


def test_verifier_without_reward_is_unscored_not_zero(harbor_trials: HarborTrials) -> None:
    record = build_record(harbor_trials["broken"], CTX)
    ev = record.evaluation
    # Harbor's result was read in full: complete, but the verifier failed.
    assert record.status == "complete" and record.errors == []
    assert ev.failure_class == "verifier" and ev.exception_type == "RewardFileNotFoundError"
    assert ev.rewards == {} and ev.main_reward is None and not ev.reward_valid


def test_agent_timeout_is_scored_with_the_verifier_reward(harbor_trials: HarborTrials) -> None:
    ev = build_record(harbor_trials["timeout"], CTX).evaluation
    assert ev.failure_class == "agent" and ev.exception_type == "AgentTimeoutError"
    assert ev.exception_message and "timed out" in ev.exception_message
    assert ev.main_reward == 0.0 and ev.reward_valid


def test_agent_failure_without_reward_is_unscored_and_noted(
    harbor_trials: HarborTrials, tmp_path: Path
) -> None:
    trial = corrupted(harbor_trials, tmp_path, "timeout", lambda d: d.update(verifier_result=None))
    record = build_record(trial, CTX)
    assert record.evaluation.failure_class == "agent" and not record.evaluation.reward_valid
    assert record.status == "partial"
    assert record.errors == [
        "result.json: the agent failed (AgentTimeoutError) and the verifier gave no usable "
        "reward; the trial is unscored"
    ]


def test_context_fields_reach_the_record(harbor_trials: HarborTrials) -> None:
    ctx = RecordContext(
        experiment_id="exp-9",
        trial_id="t-9",
        repetition=3,
        agent_label="Oracle v1",
        environment="docker",
        harbor_version="0.25.0",
        runner_host="runner-7",
        source="runner",
        job_dir=Path("/jobs/exp-9"),
        task_path="/tasks/hello-file",
        attempts=2,
    )
    record = build_record(harbor_trials["oracle"], ctx)
    assert (record.experiment_id, record.trial_id, record.repetition, record.attempts) == (
        "exp-9",
        "t-9",
        3,
        2,
    )
    p = record.provenance
    assert (p.agent_label, p.environment, p.harbor_version, p.runner_host, p.source) == (
        "Oracle v1",
        "docker",
        "0.25.0",
        "runner-7",
        "runner",
    )
    assert p.task_path == "/tasks/hello-file"
    assert record.artifacts.job_dir == "/jobs/exp-9"


def test_same_folder_builds_the_same_record(harbor_trials: HarborTrials) -> None:
    assert build_record(harbor_trials["multi"], CTX) == build_record(harbor_trials["multi"], CTX)


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ([], None),
        (["accuracy"], "accuracy"),
        (["reward"], "reward"),
        (["b", "reward", "a"], "reward"),
        (["zeta", "alpha", "mid"], "alpha"),
    ],
)
def test_main_reward_key(keys: list[str], expected: str | None) -> None:
    assert main_reward_key(keys) == expected


# -- result.json missing or unreadable ----------------------------------------------------


def test_missing_result_is_partial_infrastructure_with_config_provenance(
    harbor_trials: HarborTrials, tmp_path: Path
) -> None:
    trial = harbor_trials.copy("multi", tmp_path)
    (trial / "result.json").unlink()

    record = build_record(trial, CTX)

    assert record.status == "partial"
    assert record.errors[0].startswith("result.json: missing (Harbor did not finish")
    assert record.errors[1] == (
        "verifier/reward.json: rewards read from the verifier's file are not scored"
    )
    ev = record.evaluation
    assert ev.failure_class == "infrastructure" and not ev.reward_valid
    # Kept for information: the verifier's file is still there.
    assert ev.rewards == {"reward": 1.0, "file_a": 1.0, "file_b": 1.0, "file_c": 1.0}
    # Provenance from the trial's config.json, which Harbor writes first.
    assert (record.provenance.task_name, record.provenance.agent_name) == ("multi-metric", "oracle")
    assert record.provenance.job_id == JOB_ID
    assert record.artifacts.result_path is None


def test_missing_result_and_no_other_files(tmp_path: Path) -> None:
    trial = tmp_path / "bare"
    trial.mkdir()
    (trial / "trial.log").write_text("started\n")

    record = build_record(trial, CTX)

    assert record.status == "partial" and len(record.errors) == 1
    assert (record.provenance.task_name, record.provenance.agent_name) == ("unknown", "unknown")
    assert record.evaluation.rewards == {}


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (
            b'{\n  "id": "x",\n  "task_name" "hello"\n}',
            "invalid JSON at line 3 column 15: Expecting ':' delimiter",
        ),
        (b"", "invalid JSON at line 1 column 1: Expecting value"),
        (b"[1, 2]", "expected a JSON object, found an array"),
        (b'"text"', "expected a JSON object, found a string"),
        (b"null", "expected a JSON object, found null"),
        (b'{"id": "\xff"}', "not UTF-8 text (invalid byte at offset 8)"),
        (b"[" * 200_000 + b"]" * 200_000, "invalid JSON: nested too deeply"),
    ],
    ids=["invalid", "empty", "array", "string", "null", "not-utf8", "too-deep"],
)
def test_unparseable_result_is_one_clear_diagnostic(
    harbor_trials: HarborTrials, tmp_path: Path, content: bytes, problem: str
) -> None:
    record = build_record(with_result_text(harbor_trials, tmp_path, content), CTX)
    assert record.status == "partial"
    assert record.errors[0] == f"result.json: {problem}"
    assert record.evaluation.failure_class == "infrastructure"
    assert not record.evaluation.reward_valid
    assert record.provenance.task_name == "hello-file"  # from config.json


def test_truncated_real_result(harbor_trials: HarborTrials, tmp_path: Path) -> None:
    text = (harbor_trials["oracle"] / "result.json").read_bytes()
    record = build_record(with_result_text(harbor_trials, tmp_path, text[: len(text) // 2]), CTX)
    assert record.errors[0].startswith("result.json: invalid JSON at line ")


def test_oversized_result_is_refused_unread(harbor_trials: HarborTrials, tmp_path: Path) -> None:
    trial = harbor_trials.copy("oracle", tmp_path)
    with (trial / "result.json").open("r+b") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)  # sparse: no 16 MiB actually written

    record = build_record(trial, CTX)

    assert record.errors[0] == (
        f"result.json: {MAX_FILE_BYTES + 1} bytes exceeds the 16 MiB limit; not read"
    )
    assert record.status == "partial"


def test_unreadable_result(harbor_trials: HarborTrials, tmp_path: Path) -> None:
    trial = harbor_trials.copy("oracle", tmp_path)
    (trial / "result.json").unlink()
    (trial / "result.json").mkdir()  # reading a directory fails even as root

    record = build_record(trial, CTX)

    assert record.errors[0] == f"result.json: unreadable: {os.strerror(21)}"
    assert record.artifacts.result_path is None


def test_a_trial_path_the_os_cannot_name_is_a_diagnostic(tmp_path: Path) -> None:
    # A TrialCompleted may carry any string as trial_dir, NUL bytes included.
    record = build_record(tmp_path / "bad\x00name", CTX)

    assert record.errors[0] == "result.json: unreadable: invalid path (embedded null byte)"
    assert all(e.endswith(": unreadable: invalid path (embedded null byte)") for e in record.errors)
    assert record.status == "partial" and not record.evaluation.reward_valid


def test_broken_config_json_is_reported_when_it_is_needed(
    harbor_trials: HarborTrials, tmp_path: Path
) -> None:
    trial = harbor_trials.copy("oracle", tmp_path)
    (trial / "result.json").unlink()
    (trial / "config.json").write_text("{")

    record = build_record(trial, CTX)

    assert "config.json: invalid JSON at line 1 column 2: " in record.errors[1]
    assert record.provenance.task_name == "unknown"


# -- result.json that parses but is malformed -----------------------------------------------


def _set_rewards(rewards: dict[str, Any]) -> Mutation:
    return lambda d: d.update(verifier_result={"rewards": rewards})


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (float("nan"), "nan is not a finite number"),
        (float("inf"), "inf is not a finite number"),
        (True, "True is not a number"),
        ("1.0", "'1.0' is not a number"),
        (None, "None is not a number"),
        (10**400, f"1{'0' * 56}... is not a finite number"),
    ],
    ids=["nan", "inf", "bool", "string", "null", "overflow"],
)
def test_bad_reward_values_are_dropped_and_unscored(
    harbor_trials: HarborTrials, tmp_path: Path, value: Any, problem: str
) -> None:
    mutate = _set_rewards({"reward": value})
    record = build_record(corrupted(harbor_trials, tmp_path, "oracle", mutate), CTX)
    assert record.errors == [f"result.json: verifier_result.rewards['reward']: {problem}; dropped"]
    assert record.status == "partial"
    ev = record.evaluation
    assert ev.rewards == {} and ev.main_reward_key == "reward" and ev.main_reward is None
    assert not ev.reward_valid


def test_a_bad_main_reward_does_not_promote_another_key(
    harbor_trials: HarborTrials, tmp_path: Path
) -> None:
    rewards = {"reward": float("nan"), "file_a": 1, "file_b": 0}
    record = build_record(corrupted(harbor_trials, tmp_path, "multi", _set_rewards(rewards)), CTX)
    ev = record.evaluation
    assert ev.rewards == {"file_a": 1.0, "file_b": 0.0}
    assert (ev.main_reward_key, ev.main_reward, ev.reward_valid) == ("reward", None, False)


def test_unstorable_reward_key_is_dropped(harbor_trials: HarborTrials, tmp_path: Path) -> None:
    rewards = {"reward": 1, "$where": 1, "a.b": 0.5}
    record = build_record(corrupted(harbor_trials, tmp_path, "multi", _set_rewards(rewards)), CTX)
    assert record.evaluation.rewards == {"reward": 1.0, "a.b": 0.5}
    assert record.errors == [
        "result.json: verifier_result.rewards['$where']: key cannot be stored in the ledger; "
        "dropped"
    ]


def test_rewards_not_an_object(harbor_trials: HarborTrials, tmp_path: Path) -> None:
    trial = corrupted(harbor_trials, tmp_path, "oracle", _set_rewards([1.0]))  # type: ignore[arg-type]
    record = build_record(trial, CTX)
    assert record.errors[0] == (
        "result.json: verifier_result.rewards: Input should be an object (got [1.0])"
    )
    assert record.errors[1] == (
        "verifier/reward.txt: rewards read from the verifier's file are not scored"
    )
    assert record.evaluation.rewards == {"reward": 1.0}
    assert not record.evaluation.reward_valid


def test_wrong_types_are_named_and_the_rest_is_kept(
    harbor_trials: HarborTrials, tmp_path: Path
) -> None:
    def mutate(d: dict[str, Any]) -> None:
        d["agent_result"]["n_input_tokens"] = "12"
        d["agent_result"]["n_output_tokens"] = 7
        d["verifier"]["started_at"] = "yesterday"

    record = build_record(corrupted(harbor_trials, tmp_path, "oracle", mutate), CTX)

    assert record.status == "partial"
    assert record.errors[0] == (
        "result.json: agent_result.n_input_tokens: Input should be a valid integer (got '12')"
    )
    assert record.errors[1].startswith("result.json: verifier.started_at: Input should be a valid")
    # Only the bad values were dropped: the reward still counts, other fields survive.
    assert record.evaluation.reward_valid and record.evaluation.main_reward == 1.0
    assert record.usage.n_output_tokens == 7 and record.usage.n_input_tokens is None
    assert record.timing.verifier_s is None and record.timing.agent_execution_s is not None


def test_missing_required_fields_fall_back(harbor_trials: HarborTrials, tmp_path: Path) -> None:
    def mutate(d: dict[str, Any]) -> None:
        del d["task_name"]
        del d["agent_info"]["name"]

    record = build_record(corrupted(harbor_trials, tmp_path, "oracle", mutate), CTX)

    assert record.errors == [
        "result.json: task_name: Field required",
        "result.json: agent_info.name: Field required",
    ]
    assert record.provenance.task_name == "hello-file"  # from config.task.path
    assert record.provenance.agent_name == "oracle"  # from config.agent.name
    assert record.evaluation.reward_valid


def test_malformed_exception_info_is_never_scored(
    harbor_trials: HarborTrials, tmp_path: Path
) -> None:
    def mutate(d: dict[str, Any]) -> None:
        d["exception_info"] = {"exception_message": "boom"}

    record = build_record(corrupted(harbor_trials, tmp_path, "oracle", mutate), CTX)

    assert record.errors == ["result.json: exception_info.exception_type: Field required"]
    # An unknown failure must not be scored as if the trial had none.
    assert record.evaluation.failure_class == "infrastructure"
    assert not record.evaluation.reward_valid


def test_invalid_usage_values(harbor_trials: HarborTrials, tmp_path: Path) -> None:
    def mutate(d: dict[str, Any]) -> None:
        d["agent_result"].update(n_input_tokens=-5, n_output_tokens=10, cost_usd=float("nan"))

    record = build_record(corrupted(harbor_trials, tmp_path, "oracle", mutate), CTX)

    assert record.errors == [
        "result.json: agent_result.n_input_tokens: -5 is not valid; dropped",
        "result.json: agent_result.cost_usd: nan is not valid; dropped",
    ]
    assert (record.usage.n_input_tokens, record.usage.n_output_tokens) == (None, 10)


def test_tokens_and_cost_are_read(harbor_trials: HarborTrials, tmp_path: Path) -> None:
    def mutate(d: dict[str, Any]) -> None:
        d["agent_result"].update(
            n_input_tokens=1200, n_cache_tokens=200, n_output_tokens=300, cost_usd=0.0125
        )
        d["config"]["agent"]["model_name"] = "anthropic/claude-x"

    record = build_record(corrupted(harbor_trials, tmp_path, "oracle", mutate), CTX)

    assert record.status == "complete"
    u = record.usage
    assert (u.n_input_tokens, u.n_cache_tokens, u.n_output_tokens, u.cost_usd) == (
        1200,
        200,
        300,
        0.0125,
    )
    assert record.provenance.model == "anthropic/claude-x"


def test_multi_step_usage_is_summed(harbor_trials: HarborTrials, tmp_path: Path) -> None:
    def mutate(d: dict[str, Any]) -> None:
        d["agent_result"] = None
        d["step_results"] = [
            {"step_name": "one", "agent_result": {"n_input_tokens": 10, "cost_usd": 0.5}},
            {
                "step_name": "two",
                "agent_result": {"n_input_tokens": 5, "cost_usd": 0.25},
                "exception_info": {
                    "exception_type": "AgentTimeoutError",
                    "exception_message": "step two timed out",
                },
            },
        ]

    record = build_record(corrupted(harbor_trials, tmp_path, "oracle", mutate), CTX)

    assert (record.usage.n_input_tokens, record.usage.cost_usd) == (15, 0.75)
    assert record.evaluation.exception_type == "AgentTimeoutError"
    assert record.evaluation.failure_class == "agent"


def test_unknown_fields_are_tolerated(harbor_trials: HarborTrials, tmp_path: Path) -> None:
    def mutate(d: dict[str, Any]) -> None:
        d["schema_version"] = "2.0"
        d["future_field"] = {"anything": [1, 2, 3]}
        d["agent_info"]["new_info"] = "x"
        d["verifier_result"]["details"] = {"tests": 3}

    trial = corrupted(harbor_trials, tmp_path, "oracle", mutate)
    record = build_record(trial, CTX)
    original = build_record(harbor_trials["oracle"], CTX)

    assert record.status == "complete" and record.errors == []
    assert record.evaluation == original.evaluation
    assert record.provenance == original.provenance


def test_offset_less_timestamps_are_taken_as_utc(
    harbor_trials: HarborTrials, tmp_path: Path
) -> None:
    def mutate(d: dict[str, Any]) -> None:
        d["started_at"] = d["started_at"].removesuffix("Z")

    record = build_record(corrupted(harbor_trials, tmp_path, "oracle", mutate), CTX)
    original = build_record(harbor_trials["oracle"], CTX)
    assert record.status == "complete"
    assert record.timing.started_at == original.timing.started_at


# -- build_failed_record ---------------------------------------------------------------------


STORED = ObjectRef(bucket="RESULTS", name="exp-1/t/1.tar.gz", size=10, sha256="cd" * 32)


def test_failed_record_from_trial_failed_event() -> None:
    event = trial_failed(
        "hello-file__abc",
        failure_class="infrastructure",
        error_type="LocalEnvironmentError",
        message="bwrap: setting up uid map: Permission denied\nsecond line of detail",
        attempt=3,
        result=STORED,
        task=TaskRef(name="hello-file", checksum="ab" * 32),
        agent=AgentSpec(name="oracle", label="Oracle"),
        repetition=1,
        runner_host="runner-2",
    )

    record = build_failed_record(event)

    assert record.status == "partial" and record.attempts == 3 and record.repetition == 1
    assert record.errors == [
        "result.json: none; the trial failed before Harbor wrote one (infrastructure: "
        "LocalEnvironmentError: bwrap: setting up uid map: Permission denied)"
    ]
    ev = record.evaluation
    assert (ev.failure_class, ev.exception_type, ev.reward_valid) == (
        "infrastructure",
        "LocalEnvironmentError",
        False,
    )
    assert ev.exception_message == event.message
    p = record.provenance
    assert (p.task_name, p.task_path, p.task_checksum) == ("hello-file", None, "ab" * 32)
    assert p.task_archive == "ab" * 32
    assert (p.agent_name, p.agent_label, p.runner_host) == ("oracle", "Oracle", "runner-2")
    # No path on the wire: the record points at the stored folder.
    assert (record.artifacts.archive, record.artifacts.trial_dir) == (STORED, None)


def test_failed_record_with_little_information() -> None:
    event = trial_failed(failure_class="cancelled", error_type="CancelledError", message="")
    record = build_failed_record(event)
    assert record.errors == [
        "result.json: none; the trial failed before Harbor wrote one (cancelled: CancelledError)"
    ]
    assert record.provenance.task_name == "unknown"
    assert record.artifacts.trial_dir is None


def test_files_the_runner_left_out_are_reported_without_unscoring_the_trial(
    harbor_trials: HarborTrials, tmp_path: Path
) -> None:
    trial = harbor_trials.copy("oracle", tmp_path)
    (trial / "agent" / "huge.bin").write_bytes(b"x" * 4096)
    # The runner's archive, capped so the agent's big file stays out, then unpacked.
    cap = sum(p.stat().st_size for p in trial.rglob("*") if p.is_file()) - 4096
    unpacked = unpack_trial(pack_trial(trial, cap_bytes=cap).data, tmp_path / "unpacked")
    record = build_record(unpacked, RecordContext(experiment_id="exp", trial_id="t"))
    [note] = [e for e in record.errors if "left out by the runner" in e]
    assert "agent/huge.bin (over the per-trial cap" in note
    assert record.status == "complete" and record.evaluation.reward_valid
    # Negative control: with room for everything, nothing is reported.
    whole = unpack_trial(pack_trial(trial).data, tmp_path / "whole")
    assert build_record(whole, RecordContext(experiment_id="exp", trial_id="t")).errors == []
