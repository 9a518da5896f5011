"""The bad-input corpus (tests/bad_inputs): every case gets a clear error, or a partial
record with a diagnostic, and nothing raises anything else.

- manifests (through ``trialbus submit``'s entry point) -> ManifestError naming the
  file and the field (and, for task paths, the path);
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
from services.common.settings import SubmitterSettings
from services.importer.records import RecordContext, build_record
from services.submitter.commands import submit_and_wait
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
MAX_SECONDS = 20.0
"""No case may take longer: generous for a loaded CI machine, yet an alias bomb or a
blocking read (the bugs this corpus found) takes hours or forever."""

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


@pytest.mark.parametrize("case", cases("manifests"), ids=_ids(cases("manifests")))
async def test_bad_manifest_is_refused_naming_file_and_field(case: Case, tmp_path: Path) -> None:
    # Through `trialbus submit`'s own entry point: it validates and resolves the
    # manifest before connecting to anything, so no server is needed to be refused.
    path = manifest_file(case, tmp_path)
    settings = SubmitterSettings(tasks_root=TASKS_ROOT)
    started = time.monotonic()
    with pytest.raises(ManifestError) as exc:
        await submit_and_wait(settings, path, wait=False, timeout_s=1, progress=None)
    assert time.monotonic() - started < MAX_SECONDS, "too slow: a hostile manifest stalls"
    message = str(exc.value)
    assert message.startswith(f"{path}: "), message
    if case.spec.get("stage") == "resolve":  # it got past parsing: the stage is right
        load_manifest(path)
    for fragment in case.expect:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    for secret in case.spec.get("never", []):
        assert secret not in message  # the refusal does not echo the secret back


@pytest.mark.parametrize("case", cases("tasks"), ids=_ids(cases("tasks")))
def test_bad_task_folder_is_refused_naming_what_is_wrong(case: Case) -> None:
    manifest = ExperimentManifest.model_validate(
        {"name": "x", "tasks": [case.name], "agents": [{"name": "oracle"}]}
    )
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
    # Every diagnostic starts with the file it is about.
    assert {line.split(":", 1)[0].split("[")[0] for line in record.errors} <= _FILES, record.errors


_FILES = {"result.json", "config.json", "verifier/reward.json", "verifier/reward.txt", "record"}


@pytest.mark.parametrize("case", cases("events"), ids=_ids(cases("events")))
def test_bad_event_is_refused(case: Case) -> None:
    with pytest.raises(EventDecodeError) as exc:
        parse_event(event_bytes(case))
    message = str(exc.value)
    for fragment in case.expect:
        assert fragment in message, f"{fragment!r} not in {message!r}"
