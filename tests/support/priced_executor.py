"""An instant executor whose trials report a cost (e2e support for spend quotas).

benchmarks.instant_executor writes a result.json without an ``agent_result``, so its
trials cost nothing and no spend quota ever binds. This one adds Harbor's agent usage
to that file: ``TRIALBUS_TEST_COST_USD`` dollars and a few tokens per attempt, exactly
where the runner reads a real Harbor trial's (services/runner/guards.py
``attempt_spend``). A runner loads it with
``TRIALBUS_EXECUTOR=tests.support.priced_executor:from_settings``.
"""

from __future__ import annotations

import json

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from benchmarks.instant_executor import InstantExecutor, InstantSettings
from schemas.events import TrialRequested
from services.common.ports import ExecutionOutcome, LogSink
from services.common.settings import RunnerSettings
from services.runner.app import trial_folders_root

EXECUTOR_SPEC = "tests.support.priced_executor:from_settings"


class PriceSettings(BaseSettings):
    """``TRIALBUS_TEST_COST_USD``: what each attempt reports it cost."""

    model_config = SettingsConfigDict(env_prefix="TRIALBUS_TEST_", extra="ignore", frozen=True)

    cost_usd: float = Field(default=0.0, ge=0)


class PricedExecutor:
    """The instant executor, its result.json carrying an agent cost."""

    name = "priced"
    version = "0"

    def __init__(self, inner: InstantExecutor, cost_usd: float) -> None:
        self._inner = inner
        self._cost_usd = cost_usd

    async def run(
        self, request: TrialRequested, attempt: int, on_log: LogSink | None
    ) -> ExecutionOutcome:
        """Run the attempt instantly, then price it in its result.json."""
        outcome = await self._inner.run(request, attempt, on_log)
        if outcome.trial_dir is not None:
            path = outcome.trial_dir / "result.json"
            result = json.loads(path.read_text())
            result["agent_result"] = {
                "n_input_tokens": 100,
                "n_output_tokens": 10,
                "cost_usd": self._cost_usd,
            }
            path.write_text(json.dumps(result))
        return outcome


def from_settings(settings: RunnerSettings) -> PricedExecutor:
    """Executor factory named by the runner's ``executor`` setting (``EXECUTOR_SPEC``)."""
    own = InstantSettings()
    inner = InstantExecutor(trial_folders_root(settings), delay_s=own.delay_s)
    return PricedExecutor(inner, PriceSettings().cost_usd)
