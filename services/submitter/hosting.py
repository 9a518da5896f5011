"""A local manifest's tasks that the local environment cannot host, refused at submit.

``check_local_hosting`` judges the task folders the submitter has (``prepare``);
services/submitter/stored_tasks.py judges tasks given by checksum from their archives.
Both refuse with ``local_refusal``: one error naming every such task, its file and
what to change (the reasons: services/localenv/task_fit.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from services.common.errors import ManifestError
from services.localenv.task_fit import unhostable
from services.submitter.resolve import ResolvedTask

LOCAL_REFUSALS_SHOWN = 10
"""Tasks named in a refusal for the local environment, at most (then a count)."""


def check_local_hosting(
    tasks: Sequence[ResolvedTask], environment_kwargs: Mapping[str, Any]
) -> None:
    """Raise ManifestError naming every task (whose folder is here) that the local
    environment would refuse on every attempt (services/localenv/task_fit.py): better
    one refusal now than each of its trials failing on the runners. Tasks given by
    checksum are judged from their archives (services/submitter/stored_tasks.py)."""
    refused = [
        (task, reasons)
        for task in tasks
        if task.folder is not None and (reasons := unhostable(task.folder, environment_kwargs))
    ]
    if refused:
        raise local_refusal(refused, len(tasks))


def local_refusal(
    refused: Sequence[tuple[ResolvedTask, Sequence[str]]], n_tasks: int
) -> ManifestError:
    """The refusal of a local manifest whose ``refused`` tasks (with their reasons)
    the local environment cannot run."""
    lines = [
        f"  task {task.ref.name!r} ({task.folder or f'stored {task.ref.checksum[:12]}...'}): "
        + "; ".join(reasons)
        for task, reasons in refused[:LOCAL_REFUSALS_SHOWN]
    ]
    if len(refused) > LOCAL_REFUSALS_SHOWN:
        lines.append(f"  ... and {len(refused) - LOCAL_REFUSALS_SHOWN} more tasks")
    names = json.dumps(sorted({task.ref.name for task, _ in refused}))
    lines.append(f"  (of a dataset entry, leave them out with exclude_task_names: {names})")
    return ManifestError(
        f"compute.environment: local cannot run {len(refused)} of the manifest's "
        f"{n_tasks} tasks; leave them out, or run them with an environment that can:\n"
        + "\n".join(lines)
    )
