"""A lenient model of the trial ``result.json`` that Harbor writes.

It accepts what the pinned Harbor release (0.25) writes and tolerates newer fields
(``extra="allow"``): the importer must keep working when Harbor adds keys. Only the
fields trialbus reads are typed; everything else stays available in ``model_extra``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from schemas.documented import DOCUMENTED


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, **DOCUMENTED)


class HarborTiming(_Lenient):
    # No duration here: Harbor may write one timestamp with an offset and the other
    # without, so the importer turns both to UTC first (services/importer/records.py).
    started_at: datetime | None = None
    finished_at: datetime | None = None


class HarborException(_Lenient):
    exception_type: str
    exception_message: str = ""
    exception_traceback: str = ""
    occurred_at: datetime | None = None


class HarborModelInfo(_Lenient):
    name: str
    provider: str | None = None


class HarborAgentInfo(_Lenient):
    name: str
    version: str | None = None
    model_info: HarborModelInfo | None = None


class HarborAgentResult(_Lenient):
    n_input_tokens: int | None = None
    n_cache_tokens: int | None = None
    n_output_tokens: int | None = None
    cost_usd: float | None = None


class HarborVerifierResult(_Lenient):
    # Kept loose on purpose: the importer validates values (finite numbers) itself so
    # that one bad reward becomes a diagnostic, not a rejected file.
    rewards: dict[str, Any] | None = None


class HarborTrialResult(_Lenient):
    """Trial-level result.json (not the job-level one, which carries no trials)."""

    id: str | None = None
    task_name: str
    trial_name: str
    trial_uri: str | None = None
    task_id: Any = None
    source: str | None = None
    task_checksum: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    agent_info: HarborAgentInfo | None = None
    agent_result: HarborAgentResult | None = None
    verifier_result: HarborVerifierResult | None = None
    exception_info: HarborException | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    environment_setup: HarborTiming | None = None
    agent_setup: HarborTiming | None = None
    agent_execution: HarborTiming | None = None
    verifier: HarborTiming | None = None
    step_results: list[dict[str, Any]] | None = None
    schema_version: str | None = None

    @property
    def job_id(self) -> str | None:
        value = self.config.get("job_id")
        return str(value) if value else None
