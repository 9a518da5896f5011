"""Turn a Harbor trial folder into a TrialRecord (pure logic: reads only the given files).

Nothing here raises on bad input files. Every problem (missing, oversized, unreadable,
invalid JSON, wrong types, non-finite rewards, ...) becomes one line in the record's
``errors`` naming the file and what is wrong, and the record is ``partial``. A record
is ``complete`` only when Harbor's result.json was read in full without diagnostics.

Scoring rule: a trial is scored (``reward_valid``) only on Harbor's word, i.e. when
result.json carries a finite main reward and every exception Harbor recorded (the
trial's and its steps') is of class "none" or "agent": exactly Harbor's own
``TrialResult.reward_valid`` (agents that time out or refuse are measured,
infrastructure and verifier failures are not), made stricter only by requiring the
main reward to be a finite number. When a later step's exception is what makes the
reward invalid, the failure class is that exception's, so the cause shown for an
unscored trial is the one that unscored it. Reward files read straight from
``verifier/`` when result.json is unusable are kept for information and never scored.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import ValidationError

from schemas.events import TrialFailed
from schemas.harbor_result import HarborAgentResult, HarborTiming, HarborTrialResult
from schemas.manifest import MAX_INT64
from schemas.record import (
    Artifacts,
    Evaluation,
    FailureClass,
    PhaseTiming,
    Provenance,
    TrialRecord,
    Usage,
)
from services.common.failures import classify

MAX_FILE_BYTES: Final = 16 * 1024 * 1024
"""Files larger than this are refused (with a diagnostic) instead of read."""

MAX_MESSAGE_CHARS: Final = 2000
"""Exception messages are cut to this length; the trial folder keeps the full text."""

MAX_RECORD_BYTES: Final = 1024 * 1024
"""A record whose JSON is larger is shortened: the ledger refuses documents over
16 MiB, and a refused write would be retried forever."""
_MAX_DIAGNOSTICS: Final = 100
_MAX_REWARDS: Final = 1000
_MAX_TEXT: Final = 4096

RecordSource = Literal["runner", "external", "import"]
_SCORED: Final = frozenset({"none", "agent"})
_SALVAGE_ROUNDS: Final = 8
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
    attempts: int = 1


def main_reward_key(keys: Collection[str]) -> str | None:
    """The key of the main reward, chosen as Harbor does.

    - no keys: None;
    - a single key: that key (reward.txt always yields the single key "reward");
    - several keys: "reward" if present (Harbor's CLI, uploader and viewer all treat
      it as primary), else the first key in sorted order (the order Harbor's viewer
      lists them in).
    """
    if not keys:
        return None
    if len(keys) == 1:
        return next(iter(keys))
    if "reward" in keys:
        return "reward"
    return sorted(keys)[0]


# -- reading files ------------------------------------------------------------------


def _read_text(path: Path, label: str, errors: list[str]) -> str | None:
    """The file's text, or None with a diagnostic (a missing file adds none)."""
    try:
        mode = path.stat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            # Opening a FIFO waits forever for a writer; a device never ends.
            errors.append(f"{label}: not a regular file (FIFO, device or socket); not read")
            return None
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            # Read at most one byte past the limit: the file may grow after fstat.
            raw = b"" if size > MAX_FILE_BYTES else fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        errors.append(f"{label}: unreadable: {exc.strerror or exc}")
        return None
    if size > MAX_FILE_BYTES or len(raw) > MAX_FILE_BYTES:
        errors.append(
            f"{label}: {max(size, len(raw))} bytes exceeds the "
            f"{MAX_FILE_BYTES // (1024 * 1024)} MiB limit; not read"
        )
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        errors.append(f"{label}: not UTF-8 text (invalid byte at offset {exc.start})")
        return None


def _parse_object(text: str, label: str, errors: list[str]) -> dict[str, Any] | None:
    """Parse a JSON object, or None with a diagnostic."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        errors.append(f"{label}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}")
        return None
    except RecursionError:
        errors.append(f"{label}: invalid JSON: nested too deeply")
        return None
    except ValueError as exc:  # an integer beyond Python's digit limit
        errors.append(f"{label}: invalid JSON: {str(exc).split(';')[0]}")
        return None
    if not isinstance(data, dict):
        errors.append(f"{label}: expected a JSON object, found {_json_type(data)}")
        return None
    return data


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "null" if value is None else type(value).__name__


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- validating result.json ----------------------------------------------------------


def _validate(data: dict[str, Any]) -> HarborTrialResult:
    # Strict JSON-mode validation: "12" is not a token count and true is not a
    # number, yet ISO timestamps still parse. Lax mode would coerce both silently.
    return HarborTrialResult.model_validate_json(json.dumps(data), strict=True)


_ABSENT: Final = object()


def _child(container: Any, key: int | str) -> Any:
    if isinstance(container, dict) and isinstance(key, str):
        return container.get(key, _ABSENT)
    if isinstance(container, list) and isinstance(key, int) and 0 <= key < len(container):
        return container[key]
    return _ABSENT


def _drop(data: dict[str, Any], loc: tuple[int | str, ...], missing: bool) -> bool:
    """Remove the offending value so the rest of the file can still be read.

    A missing field is fixed by dropping its parent object; a root-level required
    field (task_name, trial_name: the only ones) gets an empty placeholder, which the
    caller replaces with a fallback. Returns False when the path cannot be followed.
    """
    path = loc[:-1] if missing else loc
    if not path:
        if missing and loc and isinstance(loc[0], str):
            data[loc[0]] = ""
            return True
        return False
    parent: Any = data
    for key in path[:-1]:
        parent = _child(parent, key)
        if parent is _ABSENT:
            return False
    last = path[-1]
    if isinstance(parent, dict) and isinstance(last, str) and last in parent:
        del parent[last]
        return True
    if isinstance(parent, list):
        # Removing one list item would shift the indexes of other errors: drop the list.
        return _drop(data, path[:-1], missing=False)
    return False


def _validate_result(
    data: dict[str, Any], errors: list[str]
) -> tuple[HarborTrialResult | None, set[str]]:
    """Validate result.json, salvaging what is valid; also return the damaged top keys."""
    damaged: set[str] = set()
    reported: set[tuple[int | str, ...]] = set()
    for _ in range(_SALVAGE_ROUNDS):
        try:
            return _validate(data), damaged
        except ValidationError as exc:
            problems = exc.errors()
        for err in problems:
            loc = tuple(err["loc"])
            missing = err["type"] == "missing"
            if loc not in reported:
                reported.add(loc)
                where = _dotted(loc)
                got = "" if missing else f" (got {_short(err['input'])})"
                errors.append(f"result.json: {where}: {err['msg']}{got}")
            if loc:
                damaged.add(str(loc[0]))
            if not _drop(data, loc, missing):
                return None, damaged
    return None, damaged


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "<root>"


# -- rewards ----------------------------------------------------------------------


def _clean_rewards(raw: Mapping[str, Any], label: str, errors: list[str]) -> dict[str, float]:
    """Keep finite numbers only; each dropped value gets a diagnostic."""
    clean: dict[str, float] = {}
    for key, value in raw.items():
        where = f"{label}[{key!r}]"
        if key.startswith("$") or "\x00" in key:
            # MongoDB refuses "$"-prefixed and NUL field names in updates.
            errors.append(f"{where}: key cannot be stored in the ledger; dropped")
        elif isinstance(value, bool) or not isinstance(value, int | float):
            errors.append(f"{where}: {_short(value)} is not a number; dropped")
        else:
            try:
                number = float(value)
            except OverflowError:
                number = math.inf
            if math.isfinite(number):
                clean[key] = number
            else:
                errors.append(f"{where}: {_short(value)} is not a finite number; dropped")
    return clean


def _artifact_rewards(verifier_dir: Path, errors: list[str]) -> tuple[dict[str, float], str]:
    """Rewards straight from the verifier's files (reward.json wins, as in Harbor)."""
    json_path, txt_path = verifier_dir / "reward.json", verifier_dir / "reward.txt"
    if json_path.exists():
        label = "verifier/reward.json"
        text = _read_text(json_path, label, errors)
        data = _parse_object(text, label, errors) if text is not None else None
        return (_clean_rewards(data, label, errors) if data is not None else {}), label
    label = "verifier/reward.txt"
    text = _read_text(txt_path, label, errors)
    if text is None:
        return {}, label
    try:
        value = float(text)
    except ValueError:
        errors.append(f"{label}: {_short(text.strip())} is not a number")
        return {}, label
    return _clean_rewards({"reward": value}, label, errors), label


# -- small typed getters over Harbor's free-form config dict ------------------------


def _get(data: Mapping[str, Any] | None, *keys: str) -> Any:
    value: Any = data
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


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
                where = _dotted(("step_results", i, "agent_result", *first["loc"]))
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


def _first_exception(result: HarborTrialResult) -> tuple[str | None, str | None]:
    # Harbor keeps the trial's first exception; multi-step trials record it on a step.
    if result.exception_info is not None:
        info = result.exception_info
        return info.exception_type, info.exception_message
    for step in result.step_results or []:
        etype = _str(_get(step, "exception_info", "exception_type"))
        if etype:
            message = _get(step, "exception_info", "exception_message")
            return etype, message if isinstance(message, str) else None
    return None, None


def _later_exception_types(result: HarborTrialResult) -> list[str]:
    """Exception types recorded on steps after the first exception (Harbor's order)."""
    types = [
        etype
        for step in result.step_results or []
        if (etype := _str(_get(step, "exception_info", "exception_type")))
    ]
    return types if result.exception_info is not None else types[1:]


def _model(config: Mapping[str, Any] | None, result: HarborTrialResult | None) -> str | None:
    name = _str(_get(config, "agent", "model_name"))
    if name:
        return name
    info = result.agent_info.model_info if result and result.agent_info else None
    if info is None:
        return None
    return f"{info.provider}/{info.name}" if info.provider else info.name


def _cut(message: str | None) -> str | None:
    if message is None or len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[:MAX_MESSAGE_CHARS] + " [truncated]"


# -- public API ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Read:
    """What could be read of a trial folder."""

    result: HarborTrialResult | None
    damaged: frozenset[str]  # top-level result.json keys dropped as malformed
    config: Mapping[str, Any] | None  # Harbor's TrialConfig, from result.json or config.json


def _read_trial(trial_dir: Path, errors: list[str]) -> _Read:
    text = _read_text(trial_dir / "result.json", "result.json", errors)
    if text is None and not errors:
        errors.append(
            "result.json: missing (Harbor did not finish this trial: it is still running, "
            "was interrupted, or its runner died)"
        )
    data = _parse_object(text, "result.json", errors) if text is not None else None
    result, damaged = _validate_result(data, errors) if data is not None else (None, set())
    if result is not None:
        return _Read(result, frozenset(damaged), result.config)
    config_text = _read_text(trial_dir / "config.json", "config.json", errors)
    config = _parse_object(config_text, "config.json", errors) if config_text is not None else None
    return _Read(None, frozenset(damaged), config)


def _evaluation(read: _Read, verifier_dir: Path, errors: list[str]) -> Evaluation:
    result = read.result
    raw = result.verifier_result.rewards if result and result.verifier_result else None
    if raw is not None:
        # Harbor's verdict. The main key is chosen among all keys Harbor recorded, so
        # a broken "reward" leaves no main reward instead of promoting another key.
        rewards = _clean_rewards(raw, "result.json: verifier_result.rewards", errors)
        key = main_reward_key(list(raw))
    elif result is None or "verifier_result" in read.damaged:
        rewards, label = _artifact_rewards(verifier_dir, errors)
        key = main_reward_key(list(rewards))
        if rewards:
            errors.append(f"{label}: rewards read from the verifier's file are not scored")
    else:
        rewards, key = {}, None
    main_reward = rewards.get(key) if key is not None else None

    exception_type, exception_message = _first_exception(result) if result else (None, None)
    failure: FailureClass = classify(exception_type) if result else "infrastructure"
    if exception_type is None and read.damaged & {"exception_info", "step_results"}:
        # The record of what went wrong is itself broken: an unknown failure is never
        # scored as if there were none.
        failure = "infrastructure"
    if result is not None and failure in _SCORED:
        # Harbor's TrialResult.reward_valid asks every recorded exception, not only the
        # first: a later step's infrastructure failure makes the reward not count.
        later = next(
            (c for t in _later_exception_types(result) if (c := classify(t)) not in _SCORED),
            None,
        )
        failure = later or failure
    if failure == "agent" and main_reward is None:
        errors.append(
            f"result.json: the agent failed ({exception_type}) and the verifier gave no "
            "usable reward; the trial is unscored"
        )
    return Evaluation(
        rewards=rewards,
        main_reward_key=key,
        main_reward=main_reward,
        reward_valid=raw is not None and main_reward is not None and failure in _SCORED,
        failure_class=failure,
        exception_type=exception_type,
        exception_message=_cut(exception_message),
    )


def _provenance(read: _Read, context: RecordContext) -> Provenance:
    result, config = read.result, read.config
    task_path = (
        context.task_path
        or _str(_get(config, "task", "path"))
        or (_str(_get(result.task_id, "path")) if result else None)
    )
    task_name = (
        (_str(result.task_name) if result else None)
        or _str(_get(config, "task", "name"))
        or (Path(task_path).name if task_path else None)
        or _UNKNOWN
    )
    agent_info = result.agent_info if result else None
    agent_name = (
        (agent_info.name if agent_info else None)
        or _str(_get(config, "agent", "name"))
        or _str(_get(config, "agent", "import_path"))
        # Harbor writes config.json with exclude_defaults, and its default agent
        # (no name, no import path) is the oracle: an absent agent means "oracle".
        or (_HARBOR_DEFAULT_AGENT if config is not None else _UNKNOWN)
    )
    return Provenance(
        task_name=task_name,
        task_path=task_path,
        task_checksum=result.task_checksum if result else None,
        agent_name=agent_name,
        agent_label=context.agent_label,
        agent_version=agent_info.version if agent_info else None,
        model=_model(config, result),
        environment=context.environment
        or _str(_get(config, "environment", "import_path"))
        or _str(_get(config, "environment", "type")),
        harbor_version=context.harbor_version,
        runner_host=context.runner_host,
        source=context.source,
        harbor_trial_uuid=result.id if result else None,
        job_id=(result.job_id if result else None) or _str(_get(config, "job_id")),
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
    )


# -- public API ----------------------------------------------------------------------


def build_record(trial_dir: Path, context: RecordContext) -> TrialRecord:
    """Build the ledger record of one Harbor trial folder. Never raises on bad files.

    Reads ``result.json`` (validated against ``HarborTrialResult``), and, only when
    it is missing or unusable, ``config.json`` for provenance and
    ``verifier/reward.json`` / ``verifier/reward.txt`` for informational rewards.
    See the module docstring for the scoring rule and ``main_reward_key`` for the
    choice of the main reward.
    """
    errors: list[str] = []
    trial_dir = trial_dir.absolute()
    result_path, verifier_dir, agent_dir = (
        trial_dir / "result.json",
        trial_dir / "verifier",
        trial_dir / "agent",
    )
    read = _read_trial(trial_dir, errors)
    evaluation = _evaluation(read, verifier_dir, errors)
    usage = _usage(read.result, errors) if read.result else Usage()
    record = TrialRecord(
        trial_id=context.trial_id,
        experiment_id=context.experiment_id,
        repetition=context.repetition,
        status="complete" if read.result is not None and not errors else "partial",
        provenance=_provenance(read, context),
        timing=_timing(read.result),
        evaluation=evaluation,
        usage=usage,
        artifacts=Artifacts(
            trial_dir=str(trial_dir),
            job_dir=str(context.job_dir.absolute() if context.job_dir else trial_dir.parent),
            result_path=str(result_path) if result_path.is_file() else None,
            verifier_dir=str(verifier_dir) if verifier_dir.is_dir() else None,
            agent_dir=str(agent_dir) if agent_dir.is_dir() else None,
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
    cause = f"{event.failure_class}: {event.error_type}" + (f": {_cut(lines[0])}" if lines else "")
    diagnostic = f"result.json: none; the trial failed before Harbor wrote one ({cause})"
    trial_dir = Path(event.trial_dir).absolute() if event.trial_dir else None
    job_dir = context.job_dir if context and context.job_dir else None
    if job_dir is None and trial_dir is not None:
        job_dir = trial_dir.parent
    return TrialRecord(
        trial_id=event.trial_id,
        experiment_id=event.experiment_id,
        repetition=event.repetition
        if event.repetition is not None
        else (context.repetition if context else None),
        status="partial",
        provenance=Provenance(
            task_name=event.task.name if event.task else _UNKNOWN,
            task_path=event.task.path if event.task else (context.task_path if context else None),
            task_checksum=event.task.checksum if event.task else None,
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
            exception_message=_cut(event.message),
        ),
        artifacts=Artifacts(
            trial_dir=str(trial_dir) if trial_dir else None,
            job_dir=str(job_dir.absolute()) if job_dir else None,
        ),
        errors=[diagnostic],
        attempts=event.attempt,
    )
