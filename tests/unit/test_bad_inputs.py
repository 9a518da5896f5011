"""The bad-input corpus (tests/bad_inputs): every case gets a clear error, or a partial
record with a diagnostic, and nothing raises anything else.

- manifests -> ManifestError naming the file (or, once resolved, the task path) and
  the field;
- task folders -> ManifestError naming what is missing or wrong;
- result folders -> build_record returns a record (partial unless the index says
  otherwise) whose ``errors`` name the file and the problem, and never raises;
- events -> parse_event raises EventDecodeError.

tests/unit/test_manifest.py, test_records.py and test_events.py pin exact messages
of individual cases; this module checks the corpus as a whole, so a new bad input is
one file plus one line in cases.yaml.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from schemas.events import EventDecodeError, parse_event
from schemas.manifest import ExperimentManifest
from services.common.errors import ManifestError
from services.importer.records import RecordContext, build_record
from services.submitter.manifest_io import load_manifest
from services.submitter.resolve import resolve_tasks
from tests.bad_inputs.corpus import (
    TASKS_ROOT,
    Case,
    Kind,
    cases,
    event_bytes,
    manifest_file,
    materialize_result,
    on_disk,
)
from tests.harbor_fixtures import HarborTrials

CTX = RecordContext(experiment_id="bad-inputs", trial_id="bad-input-trial")
MAX_SECONDS = 5.0
"""No single case may take longer (hostile inputs must not stall a service)."""

MAX_RECORD_JSON_BYTES = 4 * 1024 * 1024
"""A record must stay far below MongoDB's 16 MiB document limit."""


def _ids(kind_cases: list[Case]) -> list[str]:
    return [c.name for c in kind_cases]


KINDS: tuple[Kind, ...] = ("manifests", "tasks", "results", "events")


def test_corpus_is_large_and_indexed() -> None:
    counts = {kind: len(cases(kind)) for kind in KINDS}
    assert sum(counts.values()) >= 40 and min(counts.values()) >= 10, counts
    for kind in KINDS:
        # Every file on disk is a case, and every case has its file (or a generator).
        assert on_disk(kind) == {c.name for c in cases(kind) if c.generate is None}, kind
        for case in cases(kind):
            assert case.expect or case.spec.get("status") == "complete", case.id


def _manifest_error(case: Case, tmp_path: Path) -> tuple[str, Path]:
    path = manifest_file(case, tmp_path)
    started = time.monotonic()
    with pytest.raises(ManifestError) as exc:
        manifest = load_manifest(path)
        if case.spec.get("stage") == "resolve":
            resolve_tasks(manifest, path.parent, TASKS_ROOT)
    assert time.monotonic() - started < MAX_SECONDS, "too slow: a hostile manifest stalls"
    return str(exc.value), path


@pytest.mark.parametrize("case", cases("manifests"), ids=_ids(cases("manifests")))
def test_bad_manifest_is_refused_naming_file_and_field(case: Case, tmp_path: Path) -> None:
    message, path = _manifest_error(case, tmp_path)
    if case.spec.get("stage") != "resolve":
        # Parse errors name the file; resolve errors name the task path (in `expect`).
        assert message.startswith(f"{path}: "), message
    for fragment in case.expect:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    for secret in case.spec.get("never", []):
        assert secret not in message  # the refusal does not echo the secret back


@pytest.mark.parametrize("case", cases("tasks"), ids=_ids(cases("tasks")))
def test_bad_task_folder_is_refused_naming_what_is_wrong(case: Case) -> None:
    manifest = ExperimentManifest(name="x", tasks=[case.name], agents=[{"name": "oracle"}])
    with pytest.raises(ManifestError) as exc:
        resolve_tasks(manifest, TASKS_ROOT, TASKS_ROOT)
    message = str(exc.value)
    assert message.startswith("tasks[0]: "), message
    for fragment in case.expect:
        assert fragment in message, f"{fragment!r} not in {message!r}"


@pytest.mark.parametrize("case", cases("results"), ids=_ids(cases("results")))
def test_bad_result_folder_gives_a_record_with_diagnostics(
    case: Case, harbor_trials: HarborTrials, tmp_path: Path
) -> None:
    trial = materialize_result(case, harbor_trials["oracle"], tmp_path / case.name)
    started = time.monotonic()

    record = build_record(trial, CTX)  # must never raise

    assert time.monotonic() - started < MAX_SECONDS
    assert record.status == case.spec.get("status", "partial"), record.errors
    for fragment in case.expect:
        assert any(fragment in line for line in record.errors), (fragment, record.errors)
    if record.status == "partial":
        assert record.errors, "a partial record must say why"
    else:
        assert record.errors == []
    if "scored" in case.spec:
        assert record.evaluation.reward_valid is case.spec["scored"]
    if record.evaluation.reward_valid:
        assert record.evaluation.main_reward is not None
    assert len(record.model_dump_json()) < MAX_RECORD_JSON_BYTES  # storable
    assert all(line.split(":", 1)[0] in _LABELS for line in record.errors), record.errors


_LABELS = {"result.json", "config.json", "verifier/reward.json", "verifier/reward.txt", "record"}
_LABELS |= {"verifier/reward.txt['reward']"}


@pytest.mark.parametrize("case", cases("events"), ids=_ids(cases("events")))
def test_bad_event_is_refused(case: Case) -> None:
    with pytest.raises(EventDecodeError) as exc:
        parse_event(event_bytes(case))
    message = str(exc.value)
    for fragment in case.expect:
        assert fragment in message, f"{fragment!r} not in {message!r}"
