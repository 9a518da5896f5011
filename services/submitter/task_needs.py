"""What a task asks of the runner that takes its trials, read from its folder at submit.

Two things, each carried by every trial of the task so that a runner lacking it hands
the trial to a peer that has it (services/runner/fit.py) and the submitter refuses a
manifest no live runner can run (services/submitter/handlers.py ``check_runners``):

- the runner variables its task.toml requires (``${NAME}`` without a default:
  ``TrialRequested.task_variables``);
- for the local environment, the capabilities beyond ``local`` it requires
  (``TrialRequested.task_requires``: ``local.allowlist`` for a network allowlist,
  services/localenv/task_fit.py ``local_requirements``).

A task folder is read in ``submit.prepare``; a task given by checksum, and the task of
a retried trial, from its archive (services/submitter/stored_tasks.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from schemas.manifest import LOCAL_ENVIRONMENT_IMPORT_PATH, ComputeSpec
from services.common.task_variables import required_task_secrets
from services.localenv.task_fit import local_requirements


@dataclass(frozen=True, slots=True)
class TaskNeeds:
    """What one task asks of a runner (nothing, by default)."""

    variables: tuple[str, ...] = ()
    """NAMES of the runner variables its task.toml requires."""
    requires: tuple[str, ...] = ()
    """Capabilities a runner must offer for it beyond its compute's."""

    def trial_fields(self) -> dict[str, list[str] | None]:
        """The TrialRequested fields that carry them (None: the field is left out)."""
        return {
            "task_variables": list(self.variables) or None,
            "task_requires": list(self.requires) or None,
        }


def task_needs(task_dir: Path, compute: ComputeSpec) -> TaskNeeds:
    """What the task in ``task_dir`` asks of a runner of ``compute``. Blocking (reads
    task.toml)."""
    variables = tuple(dict.fromkeys(name for _, name in required_task_secrets(task_dir)))
    local = compute.environment_import_path == LOCAL_ENVIRONMENT_IMPORT_PATH
    return TaskNeeds(variables, tuple(local_requirements(task_dir)) if local else ())
