"""Harbor job folders: one per experiment, readable by ``harbor view``.

Layout written by trialbus (all other files are Harbor's own)::

    <jobs_root>/<experiment_id>/
        config.json      Harbor JobConfig (job_name = experiment id)
        trialbus.json    {"experiment_id": ..., "name": ...}: marks a trialbus job
        result.json      Harbor JobResult, written when the experiment completes
        <trial_id>/      one Harbor trial folder per trial (trial_name = trial_id)
        .attempts/       folders of earlier attempts of retried trials
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from services.common.folder_reads import MAX_FILE_BYTES, Unread, read_inside

MARKER = "trialbus.json"
"""The job-level file that marks a job folder as made by trialbus."""
MAX_MARKER_BYTES: Final = 1024 * 1024
"""A larger marker is refused unread: trialbus writes about a hundred bytes."""
_JOB_NAMESPACE = uuid.UUID("6f1c3c52-8a43-4c1e-9a57-9f1d7c6b2f10")


def job_dir_for(jobs_root: Path, experiment_id: str) -> Path:
    """The (absolute) job folder of an experiment under ``jobs_root``."""
    return (jobs_root / experiment_id).resolve()


def job_uuid(experiment_id: str) -> uuid.UUID:
    """Harbor job id of an experiment: stable, so every runner writes the same one."""
    return uuid.uuid5(_JOB_NAMESPACE, experiment_id)


def atomic_write(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def ensure_job_dir(
    job_dir: Path, *, experiment_id: str, name: str, job_config: dict[str, Any]
) -> None:
    """Create the job folder with its marker and Harbor config (idempotent)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    marker = job_dir / MARKER
    if not marker.exists():
        atomic_write(
            marker,
            json.dumps(
                {
                    "experiment_id": experiment_id,
                    "name": name,
                    "job_id": str(job_uuid(experiment_id)),
                }
            ),
        )
    config = job_dir / "config.json"
    if not config.exists():
        atomic_write(config, json.dumps(job_config, indent=2, default=str))


def read_marker(job_dir: Path) -> dict[str, Any] | None:
    """The trialbus marker of a job folder, or None for jobs made outside trialbus."""
    return read_json_object(job_dir, MARKER, MAX_MARKER_BYTES)


def read_json_object(folder: Path, name: str, limit: int) -> dict[str, Any] | None:
    """The JSON object in ``folder/name`` (read by ``read_inside``, at most ``limit``
    bytes), or None when it is missing, unreadable, not JSON or not an object."""
    got = read_inside(folder, name, limit)
    if isinstance(got, Unread):
        return None
    try:
        data = json.loads(got)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


AGENT_FIELDS: Final = ("name", "import_path", "model_name")
"""What config.json says of each agent: what ``harbor view`` lists and filters on
(kwargs and env stay in each trial's own config: they may name secrets)."""


def record_agents(job_dir: Path, results: list[Any]) -> None:
    """List every agent of the job's trials in its config.json (``agents``).

    ``harbor view`` reads a job's agents from config.json, not from result.json; a
    config without ``agents`` reads as Harbor's default, ``[oracle]``, whatever ran.
    Agents the config already lists are kept (a job Harbor ran names its own); the
    trials' others are added, in name order. A config that is missing or not a JSON
    object is left alone (not a job folder trialbus made).
    """
    got = read_inside(job_dir, "config.json", MAX_MARKER_BYTES)
    if isinstance(got, Unread):
        return
    try:
        config = json.loads(got)
    except (ValueError, RecursionError):
        return
    if not isinstance(config, dict):
        return
    listed = config.get("agents")
    agents: list[Any] = list(listed) if isinstance(listed, list) else []
    seen = {_agent_key(a) for a in agents if isinstance(a, dict)}
    found = {
        _agent_key(a): a
        for r in results
        if (a := r.config.agent.model_dump(include=set(AGENT_FIELDS)))
    }
    added = [found[k] for k in sorted(found, key=lambda k: tuple(v or "" for v in k))]
    added = [a for a in added if _agent_key(a) not in seen]
    if not added and isinstance(listed, list):
        return
    config["agents"] = agents + added
    atomic_write(job_dir / "config.json", json.dumps(config, indent=2, default=str))


def _agent_key(agent: dict[str, Any]) -> tuple[str | None, ...]:
    return tuple(agent.get(f) for f in AGENT_FIELDS)


def write_job_result(job_dir: Path, experiment_id: str, n_total_trials: int) -> dict[str, Any]:
    """Write Harbor's job-level result.json from the trial folders, with Harbor's own stats.

    Uses Harbor's JobStats, Mean metric and pass@k code so that ``harbor view`` and
    trialbus's ledger can be compared figure for figure; lists every trial's agent in
    config.json (``record_agents``), where ``harbor view`` reads a job's agents.
    """
    from harbor.metrics.mean import Mean
    from harbor.models.job.result import JobResult, JobStats
    from harbor.models.trial.result import TrialResult
    from harbor.utils.pass_at_k import compute_pass_at_k_by_evals

    results: list[TrialResult] = []
    for trial in sorted(p for p in job_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        # Relative to the job folder: a trial folder or result.json that is a link,
        # a FIFO or oversized is skipped like an invalid one (folder_reads).
        got = read_inside(job_dir, f"{trial.name}/result.json", MAX_FILE_BYTES)
        if isinstance(got, Unread):
            continue
        try:
            results.append(TrialResult.model_validate_json(got))
        except ValueError:
            continue  # the ledger records it as partial; Harbor's stats skip it
    stats = JobStats.from_trial_results(results, n_total_trials=n_total_trials)
    by_key: dict[str, list[dict[str, float | int] | None]] = {}
    for r in results:
        model = r.agent_info.model_info.name if r.agent_info.model_info else None
        key = JobStats.format_agent_evals_key(r.agent_info.name, model, r.source or "adhoc")
        by_key.setdefault(key, []).append(r.verifier_result.rewards if r.verifier_result else None)
    for key, rewards in by_key.items():
        stats.evals[key].metrics.append(Mean().compute(rewards))
    for key, pass_at_k in compute_pass_at_k_by_evals(results).items():
        if key in stats.evals:
            stats.evals[key].pass_at_k = pass_at_k
    record_agents(job_dir, results)
    started = min((r.started_at for r in results if r.started_at), default=None)
    now = datetime.now(UTC)
    job = JobResult(
        id=job_uuid(experiment_id),
        started_at=started or now,
        updated_at=now,
        finished_at=now,
        n_total_trials=n_total_trials,
        stats=stats,
    )
    text = job.model_dump_json(indent=4, exclude={"trial_results"})
    atomic_write(job_dir / "result.json", text)
    data: dict[str, Any] = json.loads(text)
    return data


MAX_CONFIG_BYTES: Final = 1024 * 1024
"""A larger config.json is not read to tell a job folder from a trial folder."""


def is_job_folder(folder: Path) -> bool:
    """Whether ``folder`` is a Harbor job folder: trialbus's marker, or a ``config.json``
    that is Harbor's JobConfig (``job_name``, ``jobs_dir``) rather than a trial's
    TrialConfig (``trial_name``, ``trials_dir``)."""
    if os.path.lexists(folder / MARKER):
        return True
    config = read_json_object(folder, "config.json", MAX_CONFIG_BYTES)
    return config is not None and "jobs_dir" in config and "trial_name" not in config
