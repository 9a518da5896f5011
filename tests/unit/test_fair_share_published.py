"""A changed share reaches queued work: runners judge fair share by the shares the
submitter last published with the team limits (``quota.limits``), the experiment's own
(``share.<experiment>``, stored at submit) when none is published or it cannot be read
(services/common/fair_share.py ``current_share``, services/runner/fair_share.py).
With real processes: tests/integration/test_share_published.py."""

from __future__ import annotations

from services.common.adapters.memory import InMemoryCoordinator
from services.common.fair_share import TeamShare, current_share, mark_key
from services.common.quotas import Quotas, TeamQuota, decode_limits, encode_limits, parse_quotas
from services.runner.fair_share import FairShare, HeldBack
from tests.unit.test_fair_share import CLASSES, TOPO, FakeLoad, _request

RED = TOPO.work_subject("exp-red", "default", "batch")
BLUE = TOPO.work_subject("exp-blue", "default", "batch")


def test_the_published_share_applies_else_the_stored_one() -> None:
    stored = TeamShare("red", 1.0)
    assert current_share(stored, None) is stored  # nothing published: as at submit
    published = parse_quotas("q", b"teams:\n  red: {share: 3}\n  blue: {}\ndefault: {share: 2}\n")
    assert current_share(stored, published) == TeamShare("red", 3.0)
    # Listed without a share: 1; not listed: the default's (the rule of submit).
    assert current_share(TeamShare("blue", 5.0), published) == TeamShare("blue", 1.0)
    assert current_share(TeamShare("green", 1.0), published) == TeamShare("green", 2.0)
    # Removed from a file with no default: equal shares again.
    assert current_share(TeamShare("red", 3.0), Quotas(teams={})) == TeamShare("red", 1.0)
    same = TeamShare("red", 3.0)
    assert current_share(same, published) is same  # unchanged: no copy per delivery


def test_the_share_is_published_with_the_limits() -> None:
    data = encode_limits(parse_quotas("q", b"teams:\n  red: {share: 3, max_trials_per_day: 5}\n"))
    back = decode_limits(data)
    assert back is not None
    assert back.for_team("red") == TeamQuota(share=3.0, max_trials_per_day=5)


class BrokenLimits(InMemoryCoordinator):
    """A coordinator whose published limits cannot be read."""

    async def team_limits(self, *, fresh: bool = False) -> Quotas | None:
        raise ConnectionError("control bucket unreachable")


async def _red_admitted(coord: InMemoryCoordinator) -> bool:
    """Red (stored share 1) runs 2 and blue (stored share 1) runs 1, both waiting:
    whether red's next trial may start, on a fresh runner view."""
    load = FakeLoad(coord)
    load.work = {RED: 10, BLUE: 10}
    fair = FairShare(coord, load, TOPO, "default", CLASSES, look_s=0.0, confirm_s=0.0)
    answer = await fair.admit(_request("exp-red", 9))
    assert answer is not None
    return not isinstance(answer, HeldBack)


async def _pool(coord: InMemoryCoordinator) -> InMemoryCoordinator:
    await coord.set_share("exp-red", TeamShare("red", 1.0))
    await coord.set_share("exp-blue", TeamShare("blue", 1.0))
    for team, n in (("red", 0), ("red", 1), ("blue", 0)):
        await coord.mark_running(mark_key("default", "batch", team, f"{team}-{n}"), "r2")
    return coord


async def test_a_raised_share_once_published_lets_queued_work_start() -> None:
    coord = await _pool(InMemoryCoordinator(lease_ttl_s=60))
    # As stored at submit (1:1), red at 2 is over blue at 1: held back.
    assert not await _red_admitted(coord)
    # Published with red's share raised to 3: 2/3 is under blue's 1/1, red starts.
    await coord.set_team_limits(parse_quotas("q", b"teams:\n  red: {share: 3}\n"))
    assert await _red_admitted(coord)
    # Negative control: limits published without a share for red: 1, held back again.
    await coord.set_team_limits(parse_quotas("q", b"teams:\n  red: {max_concurrent_trials: 9}\n"))
    assert not await _red_admitted(coord)


async def test_blue_waits_by_red_raised_share() -> None:
    # The rivals' shares come from the published limits too: blue at 1/1 is over red's
    # 2/3 and is held back once red's share 3 is published (control: 1:1, blue starts).
    coord = await _pool(InMemoryCoordinator(lease_ttl_s=60))
    load = FakeLoad(coord)
    load.work = {RED: 10, BLUE: 10}

    async def blue_admitted() -> bool:
        fair = FairShare(coord, load, TOPO, "default", CLASSES, look_s=0.0, confirm_s=0.0)
        return not isinstance(await fair.admit(_request("exp-blue", 9)), HeldBack)

    assert await blue_admitted()
    await coord.set_team_limits(parse_quotas("q", b"teams:\n  red: {share: 3}\n"))
    assert not await blue_admitted()


async def test_unreadable_limits_fall_back_to_the_stored_share() -> None:
    # Fail open, as every scheduling aid: the share stored at submit, never an error.
    coord = await _pool(BrokenLimits(lease_ttl_s=60))
    await coord.set_share("exp-red", TeamShare("red", 3.0))
    assert await _red_admitted(coord)
    await coord.set_share("exp-red", TeamShare("red", 1.0))  # control: stored 1, held
    assert not await _red_admitted(coord)
