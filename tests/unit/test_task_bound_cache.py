"""The Harbor executor reads a task's time bound once per task checksum.

A task's content never changes under its checksum, so the runner parses its task.toml
(services.runner.harbor_executor.task_time_bound) once instead of on the event loop at
every trial's start.
"""

from __future__ import annotations

from pathlib import Path

from services.common.adapters.memory_objects import InMemoryObjectStore
from services.common.task_cache import TaskCache
from services.runner.harbor_executor import SETUP_ALLOWANCE_S, HarborExecutor

TOML = (
    "[agent]\ntimeout_sec = 100\n[verifier]\ntimeout_sec = 50\n"
    "[environment]\nbuild_timeout_sec = 30\n"
)
BOUND = (30 + 100 + 50) * 2.0 + SETUP_ALLOWANCE_S


def executor(tmp_path: Path) -> HarborExecutor:
    tasks = TaskCache(tmp_path / "tasks", InMemoryObjectStore("TASKS"), budget_bytes=1 << 20)
    return HarborExecutor(tmp_path / "jobs", tasks)


def test_a_tasks_bound_is_read_once_per_checksum(tmp_path: Path) -> None:
    run = executor(tmp_path)
    task_dir = tmp_path / "task"
    task_dir.mkdir()
    (task_dir / "task.toml").write_text(TOML)
    assert run._task_bound("a" * 64, task_dir, 2.0) == BOUND
    # Read once: the same checksum is not read again (the file is gone, the bound stays).
    (task_dir / "task.toml").unlink()
    assert run._task_bound("a" * 64, task_dir, 2.0) == BOUND
    # Negative controls: another checksum, or another multiplier, is read afresh.
    assert run._task_bound("b" * 64, task_dir, 2.0) is None
    assert run._task_bound("a" * 64, task_dir, 1.0) is None
