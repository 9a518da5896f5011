"""StartStop.stopped_on_failure: a start that fails part way leaves nothing running."""

from __future__ import annotations

import subprocess
from typing import Self

import pytest

from infra.managed_process import StartStop


class _Sleeper(StartStop):
    """Starts a real child process, then fails with ``failure`` when one is given."""

    def __init__(self, failure: BaseException | None = None) -> None:
        self.failure = failure
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        with self.stopped_on_failure():
            self.proc = subprocess.Popen(["sleep", "60"])
            if self.failure is not None:
                raise self.failure
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.parametrize("failure", [RuntimeError("boom"), KeyboardInterrupt()])
def test_a_failed_start_stops_what_it_started_and_reraises(failure: BaseException) -> None:
    sleeper = _Sleeper(failure)
    with pytest.raises(type(failure)) as raised:
        sleeper.start()
    assert raised.value is failure
    assert sleeper.proc is not None
    assert sleeper.proc.poll() is not None, "the child of the failed start is still running"


def test_a_successful_start_leaves_its_process_running() -> None:
    # Negative control: stopped_on_failure must not stop anything when start succeeds.
    with _Sleeper() as sleeper:
        assert sleeper.proc is not None
        assert sleeper.proc.poll() is None
    assert sleeper.proc.poll() is not None
