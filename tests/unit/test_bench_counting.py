"""The capacity benchmark's counts of starts and trouble are right (and can fail).

``started_more_than_once`` is what the capacity benchmark's verdict on redelivery
storms rests on: a trial settled twice in the runners' logs, or two TrialStarted
events of one trial, must count; one of each must not.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from benchmarks.bench_capacity import scan_runner_logs, started_more_than_once


def _line(trial_id: str, event: str) -> str:
    return json.dumps({"trial_id": trial_id, "attempt": 1, "event": event}) + "\n"


def test_runner_logs_count_runs_per_trial_and_trouble(tmp_path: Path) -> None:
    (tmp_path / "runner-0.log").write_text(
        _line("a", "trial settled")
        + _line("b", "trial settled")
        + _line("b", "runner error; trial will be redelivered")
    )
    (tmp_path / "runner-1.log").write_text(
        _line("b", "trial settled") + _line("c", "heartbeat failed")
    )
    (tmp_path / "importer.log").write_text(_line("a", "trial settled"))  # not a runner
    runs, errors = scan_runner_logs(tmp_path)
    assert runs == Counter({"a": 1, "b": 2})
    assert errors == {"redelivered": 1, "heartbeat_failed": 1, "fetch_failed": 0}


def test_a_trial_started_or_run_twice_is_counted_once_each_way() -> None:
    once = Counter({"a": 1, "b": 1})
    assert started_more_than_once(once, once) == 0  # negative control
    assert started_more_than_once(Counter({"a": 2, "b": 1}), once) == 1
    assert started_more_than_once(once, Counter({"a": 1, "b": 3})) == 1
