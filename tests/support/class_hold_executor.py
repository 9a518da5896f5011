"""An instant executor that holds the trials of some priority classes (e2e support).

Preemption and stop notices need long trials and short ones side by side: trials of a
class named in ``TRIALBUS_TEST_HOLD_CLASSES`` (comma separated) wait until the file
``TRIALBUS_INSTANT_HOLD_UNTIL`` exists, with no known time limit; every other trial
takes ``TRIALBUS_INSTANT_DELAY_S`` and says so (``time_limit_s``), so a stop notice
can tell it may finish. A runner loads it with
``TRIALBUS_EXECUTOR=tests.support.class_hold_executor:from_settings``.
"""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

from benchmarks.instant_executor import InstantExecutor, InstantSettings
from schemas.events import TrialRequested
from services.common.ports import ExecutionOutcome, LogSink
from services.common.priority import PriorityClasses
from services.common.settings import RunnerSettings
from services.runner.app import trial_folders_root

EXECUTOR_SPEC = "tests.support.class_hold_executor:from_settings"


class HoldSettings(BaseSettings):
    """``TRIALBUS_TEST_HOLD_CLASSES``: the classes whose trials are held (comma separated)."""

    model_config = SettingsConfigDict(env_prefix="TRIALBUS_TEST_", extra="ignore", frozen=True)

    hold_classes: str = ""


class ClassHoldExecutor:
    """Held classes wait for the hold file; the others complete after the delay."""

    name = "class-hold"
    version = "0"

    def __init__(
        self,
        quick: InstantExecutor,
        held: InstantExecutor,
        hold_classes: frozenset[str],
        classes: PriorityClasses,
        delay_s: float,
    ) -> None:
        self._quick, self._held = quick, held
        self._hold_classes = hold_classes
        self._classes = classes
        self._delay_s = delay_s

    def _is_held(self, request: TrialRequested) -> bool:
        return self._classes.resolve(request.compute.priority_class) in self._hold_classes

    async def run(
        self, request: TrialRequested, attempt: int, on_log: LogSink | None
    ) -> ExecutionOutcome:
        """Run the attempt: held until the file exists, or after the delay."""
        executor = self._held if self._is_held(request) else self._quick
        return await executor.run(request, attempt, on_log)

    def time_limit_s(self, request: TrialRequested) -> float | None:
        """The delay for a quick trial (a generous second more); unknown when held."""
        return None if self._is_held(request) else self._delay_s + 1.0


def from_settings(settings: RunnerSettings) -> ClassHoldExecutor:
    """Executor factory named by the runner's ``executor`` setting (``EXECUTOR_SPEC``)."""
    own = InstantSettings()
    root = trial_folders_root(settings)
    hold = frozenset(c for c in HoldSettings().hold_classes.split(",") if c)
    quick = InstantExecutor(root, delay_s=own.delay_s)
    held = InstantExecutor(root, hold_until=own.hold_until)
    return ClassHoldExecutor(quick, held, hold, settings.classes, own.delay_s)
