"""``StartedTrials``: an experiment's started trials for a live view, the history read
once (then every ``HISTORY_REFRESH_S``) and the live feed's starts taken in between."""

from __future__ import annotations

from schemas.events import ResultImported, TrialStarted
from services.submitter.live_feeds import HISTORY_REFRESH_S, StartedTrials
from tests.support.starts import started as start

IMPORTED = ResultImported(
    experiment_id="exp-1",
    correlation_id="c",
    trial_id="a",
    status="complete",
    scored=True,
    changed=True,
)


class History:
    """The events stream's history of TrialStarted, counting its reads."""

    def __init__(self, *events: TrialStarted) -> None:
        self.events = list(events)
        self.reads = 0

    async def started_trials(self, experiment_id: str) -> dict[str, TrialStarted]:
        self.reads += 1
        return {e.trial_id: e for e in self.events if e.experiment_id == experiment_id}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_the_history_is_read_once_and_the_feed_keeps_it_current() -> None:
    history = History(start("a", 0), start("b", 1))
    clock = Clock()
    started = StartedTrials(history, "exp-1", clock=clock)
    started.seen(start("c", 2))  # arrived while the page opened: before the first read
    assert set(await started.current()) == {"a", "b", "c"}
    for at in range(3, 13):
        started.seen(start(f"t{at}", at))
        started.seen(start("x", at, experiment="exp-2"))  # another experiment's: left
        started.seen(IMPORTED)  # not a start: left
        assert len(await started.current()) == 3 + at - 2
    assert history.reads == 1  # ten redraws, one read of the history
    # Control: without the feed, the view would not see the new starts.
    assert len(await StartedTrials(History(start("a", 0)), "exp-1").current()) == 1


async def test_the_latest_start_of_a_trial_is_kept_whichever_came_first() -> None:
    retried = start("a", 10, attempt=2)
    history = History(retried)
    started = StartedTrials(history, "exp-1", clock=Clock())
    started.seen(start("a", 0, attempt=1))  # an older start, seen late
    assert (await started.current())["a"].attempt == 2
    started.seen(start("a", 20, attempt=3))
    assert (await started.current())["a"].attempt == 3


async def test_the_history_is_read_again_after_the_refresh_time() -> None:
    history = History(start("a", 0))
    clock = Clock()
    started = StartedTrials(history, "exp-1", clock=clock)
    await started.current()
    history.events.append(start("missed", 1))  # published, but the feed missed it
    clock.now += HISTORY_REFRESH_S - 1
    assert set(await started.current()) == {"a"}
    clock.now += 1
    assert set(await started.current()) == {"a", "missed"}
    assert history.reads == 2
