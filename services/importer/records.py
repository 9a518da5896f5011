"""Assemble the TrialRecord of one Harbor trial folder (pure logic: reads only its files).

Nothing here raises on bad input files. Every problem (missing, oversized, unreadable,
invalid JSON, wrong types, non-finite rewards, ...) becomes one line in the record's
``errors`` naming the file and what is wrong, and the record is ``partial``. A record
is ``complete`` only when Harbor's result.json was read in full without diagnostics.

The importer's four concerns, one module each:

    reads     bounded, never-raising file reads (no links, size limit, FIFOs, UTF-8, JSON)
    salvage   a malformed result.json is validated field by field, keeping what is valid
    scoring   the scoring rule: whether the reward counts, and which is the main one
    records   (this module) provenance, timing, usage and the record's size bound
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import ValidationError

from schemas.events import TrialFailed
from schemas.harbor_result import HarborAgentResult, HarborTiming, HarborTrialResult
from schemas.manifest import MAX_INT64
from schemas.objects import ObjectRef
from schemas.record import (
    Artifacts,
    Evaluation,
    PhaseTiming,
    Provenance,
    RecordStatus,
    TrialRecord,
    Usage,
)
from services.importer.reads import get_path, left_out_diagnostic, nonempty_str
from services.importer.salvage import TrialRead, dotted, read_trial
from services.importer.scoring import cut_message, evaluate
from services.importer.trial_files import TrialFiles, trial_files

MAX_RECORD_BYTES: Final = 1024 * 1024
"""A record whose JSON is larger is shortened: the ledger refuses documents over
16 MiB, and a refused write would be retried forever."""
_MAX_DIAGNOSTICS: Final = 100
_MAX_REWARDS: Final = 1000
_MAX_TEXT: Final = 4096

RecordSource = Literal["runner", "external", "import"]
_UNKNOWN: Final = "unknown"
_HARBOR_DEFAULT_AGENT: Final = "oracle"


@dataclass(frozen=True, slots=True)
class RecordContext:
    """What trialbus knows about a trial beyond Harbor's files."""

    experiment_id: str
    trial_id: str
    repetition: int | None = None
    agent_label: str | None = None
    environment: str | None = None
    harbor_version: str | None = None
    runner_host: str | None = None
    source: RecordSource = "runner"
    job_dir: Path | None = None
    task_path: str | None = None
    task_archive: str | None = None
    """The checksum naming the task's archive that ran (a runner's TrialCompleted.task)."""
    attempts: int = 1
    archive: ObjectRef | None = None
    """The stored archive the folder was unpacked from, when it was."""


def _utc(value: datetime | None) -> datetime | None:
    # Harbor writes trial timestamps with "Z"; an offset-less one (older releases,
    # Harbor's job-level files) is taken as UTC rather than rejected.
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def _seconds(timing: HarborTiming | None) -> float | None:
    if timing is None:
        return None
    # Both through _utc: an offset-less and an aware timestamp cannot be subtracted.
    started, finished = _utc(timing.started_at), _utc(timing.finished_at)
    return (finished - started).total_seconds() if started and finished else None


def _usage(result: HarborTrialResult, errors: list[str]) -> Usage:
    """Tokens and cost; multi-step trials report them per step, so sum the steps."""
    contexts: list[HarborAgentResult] = []
    if result.agent_result is not None:
        contexts.append(result.agent_result)
    else:
        for i, step in enumerate(result.step_results or []):
            raw = step.get("agent_result")
            if raw is None:
                continue
            try:
                contexts.append(HarborAgentResult.model_validate(raw, strict=True))
            except ValidationError as exc:
                first = exc.errors()[0]
                where = dotted(("step_results", i, "agent_result", *first["loc"]))
                errors.append(f"result.json: {where}: {first['msg']}; step usage ignored")
    totals: dict[str, Any] = {}
    for ctx in contexts:
        for name in ("n_input_tokens", "n_cache_tokens", "n_output_tokens", "cost_usd"):
            value = getattr(ctx, name)
            if value is None:
                continue
            if (
                (name == "cost_usd" and not math.isfinite(value))
                or value < 0
                or value > MAX_INT64  # the ledger stores 64-bit integers only
            ):
                errors.append(f"result.json: agent_result.{name}: {value!r} is not valid; dropped")
                continue
            totals[name] = totals.get(name, 0) + value
    return Usage(**totals)


def _model(config: Mapping[str, Any] | None, result: HarborTrialResult | None) -> str | None:
    name = nonempty_str(get_path(config, "agent", "model_name"))
    if name:
        return name
    info = result.agent_info.model_info if result and result.agent_info else None
    if info is None:
        return None
    return f"{info.provider}/{info.name}" if info.provider else info.name


def _provenance(read: TrialRead, context: RecordContext) -> Provenance:
    result, config = read.result, read.config
    task_path = (
        context.task_path
        or nonempty_str(get_path(config, "task", "path"))
        or (nonempty_str(get_path(result.task_id, "path")) if result else None)
    )
    task_name = (
        (nonempty_str(result.task_name) if result else None)
        or nonempty_str(get_path(config, "task", "name"))
        or (Path(task_path).name if task_path else None)
        or _UNKNOWN
    )
    agent_info = result.agent_info if result else None
    agent_name = (
        (agent_info.name if agent_info else None)
        or nonempty_str(get_path(config, "agent", "name"))
        or nonempty_str(get_path(config, "agent", "import_path"))
        # Harbor writes config.json with exclude_defaults, and its default agent
        # (no name, no import path) is the oracle: an absent agent means "oracle".
        or (_HARBOR_DEFAULT_AGENT if config is not None else _UNKNOWN)
    )
    return Provenance(
        task_name=task_name,
        task_path=task_path,
        task_checksum=result.task_checksum if result else None,
        task_archive=context.task_archive,
        agent_name=agent_name,
        agent_label=context.agent_label,
        agent_version=agent_info.version if agent_info else None,
        model=_model(config, result),
        environment=context.environment
        or nonempty_str(get_path(config, "environment", "import_path"))
        or nonempty_str(get_path(config, "environment", "type")),
        harbor_version=context.harbor_version,
        runner_host=context.runner_host,
        source=context.source,
        harbor_trial_uuid=result.id if result else None,
        job_id=(result.job_id if result else None) or nonempty_str(get_path(config, "job_id")),
    )


def _timing(result: HarborTrialResult | None) -> PhaseTiming:
    if result is None:
        return PhaseTiming()
    started, finished = _utc(result.started_at), _utc(result.finished_at)
    return PhaseTiming(
        started_at=started,
        finished_at=finished,
        total_s=(finished - started).total_seconds() if started and finished else None,
        environment_setup_s=_seconds(result.environment_setup),
        agent_setup_s=_seconds(result.agent_setup),
        agent_execution_s=_seconds(result.agent_execution),
        verifier_s=_seconds(result.verifier),
        phase_offsets_s=_offsets(started, result),
    )


def _offsets(started: datetime | None, result: HarborTrialResult) -> dict[str, float]:
    """Each phase's start, in seconds after the trial's (the dashboard's timeline)."""
    if started is None:
        return {}
    phases = {
        "environment_setup": result.environment_setup,
        "agent_setup": result.agent_setup,
        "agent_execution": result.agent_execution,
        "verifier": result.verifier,
    }
    out = {}
    for name, timing in phases.items():
        at = _utc(timing.started_at) if timing is not None else None
        if at is not None:
            out[name] = round((at - started).total_seconds(), 3)
    return out


def build_record(trial: Path | TrialFiles, context: RecordContext) -> TrialRecord:
    """Build the ledger record of one Harbor trial folder. Never raises on bad files.

    ``trial``: the folder on disk, or the files of an archive just unpacked
    (services.importer.trial_files: one record path for both). Reads ``result.json``
    (validated against ``HarborTrialResult``), and, only when it is missing or
    unusable, ``config.json`` for provenance and ``verifier/reward.json`` /
    ``verifier/reward.txt`` for informational rewards. See services.importer.scoring
    for the scoring rule and ``main_reward_key`` for the choice of the main reward.
    """
    errors: list[str] = []
    files = trial_files(trial)
    trial_dir = files.path.absolute()
    read = read_trial(files, errors)
    evaluation = evaluate(read, files, errors)
    usage = _usage(read.result, errors) if read.result else Usage()
    # Decided before the packing diagnostic: the runner stores result.json and the
    # verifier's output first, so files it left out never make the score partial.
    status: RecordStatus = "complete" if read.result is not None and not errors else "partial"
    left_out = left_out_diagnostic(files)
    if left_out is not None:
        errors.append(left_out)
    record = TrialRecord(
        trial_id=context.trial_id,
        experiment_id=context.experiment_id,
        repetition=context.repetition,
        status=status,
        provenance=_provenance(read, context),
        timing=_timing(read.result),
        evaluation=evaluation,
        usage=usage,
        artifacts=Artifacts(
            archive=context.archive,
            trial_dir=str(trial_dir),
            job_dir=str(context.job_dir.absolute() if context.job_dir else trial_dir.parent),
            result_path=str(trial_dir / "result.json") if files.is_file("result.json") else None,
            verifier_dir=str(trial_dir / "verifier") if files.is_dir("verifier") else None,
            agent_dir=str(trial_dir / "agent") if files.is_dir("agent") else None,
        ),
        errors=errors,
        attempts=context.attempts,
    )
    return _bounded(record)


def _cut_text(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= _MAX_TEXT else value[:_MAX_TEXT] + " [truncated]"
    if isinstance(value, dict):
        return {_cut_text(k): _cut_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut_text(v) for v in value]
    return value


def _bounded(record: TrialRecord) -> TrialRecord:
    """The record, shortened when too large to store (the trial folder keeps it all)."""
    if len(record.model_dump_json()) <= MAX_RECORD_BYTES:
        return record
    data = record.model_dump(mode="json")
    ids = {"trial_id": data.pop("trial_id"), "experiment_id": data.pop("experiment_id")}
    data = _cut_text(data)
    rewards: dict[str, float] = data["evaluation"]["rewards"]
    main = data["evaluation"]["main_reward_key"]
    kept = dict(list(rewards.items())[:_MAX_REWARDS])
    if main in rewards:
        kept[main] = rewards[main]
    data["evaluation"]["rewards"] = kept
    errors: list[str] = data["errors"]
    data["errors"] = [
        *errors[:_MAX_DIAGNOSTICS],
        f"record: shortened to fit the ledger ({len(errors)} diagnostics, {len(rewards)} "
        f"rewards, texts over {_MAX_TEXT} characters cut); the trial folder has the rest",
    ]
    data["status"] = "partial"
    return TrialRecord.model_validate({**data, **ids})


def build_failed_record(event: TrialFailed, context: RecordContext | None = None) -> TrialRecord:
    """Partial record of a trial that never produced a result.json (from TrialFailed).

    ``context`` (optional) adds what the event does not carry (agent label,
    environment, Harbor version, source); the event's own fields take precedence.
    """
    lines = event.message.strip().splitlines()
    first_line = f": {cut_message(lines[0])}" if lines else ""
    cause = f"{event.failure_class}: {event.error_type}{first_line}"
    diagnostic = f"result.json: none; the trial failed before Harbor wrote one ({cause})"
    job_dir = context.job_dir if context and context.job_dir else None
    return TrialRecord(
        trial_id=event.trial_id,
        experiment_id=event.experiment_id,
        repetition=event.repetition
        if event.repetition is not None
        else (context.repetition if context else None),
        status="partial",
        provenance=Provenance(
            task_name=event.task.name if event.task else _UNKNOWN,
            task_path=context.task_path if context else None,
            task_checksum=event.task.checksum if event.task else None,
            task_archive=event.task.checksum
            if event.task
            else (context.task_archive if context else None),
            agent_name=event.agent.agent_ref if event.agent else _UNKNOWN,
            agent_label=(context.agent_label if context else None)
            or (event.agent.display if event.agent else None),
            model=event.agent.model if event.agent else None,
            environment=context.environment if context else None,
            harbor_version=context.harbor_version if context else None,
            runner_host=event.runner_host or (context.runner_host if context else None),
            source=context.source if context else "runner",
        ),
        evaluation=Evaluation(
            reward_valid=False,
            failure_class=event.failure_class,
            exception_type=event.error_type,
            exception_message=cut_message(event.message),
        ),
        artifacts=Artifacts(
            archive=event.result,
            job_dir=str(job_dir.absolute()) if job_dir else None,
        ),
        errors=[diagnostic],
        attempts=event.attempt,
    )
