"""Limits read per delivery: runners judge a teamed trial by the limits the submitter
last published (``quota.limits``), falling back to the message's copy
(docs/scheduling.md, "Limits read per delivery")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from schemas.events import TeamRef
from services.common.adapters.memory import InMemoryCoordinator
from services.common.errors import ACK
from services.common.quotas import (
    Quotas,
    TeamQuota,
    current_team,
    decode_limits,
    encode_limits,
    parse_quotas,
)
from services.runner.admission import PAUSE_WAIT_S, SLOT_WAIT_S
from tests.unit.runner_support import ScriptedExecutor, held_completion
from tests.unit.test_quotas import teamed
from tests.unit.test_runner_guards import outcome
from tests.unit.test_runner_handlers import World

FILE = b"""
teams:
  red: {max_concurrent_trials: 1, max_trials_per_day: 100, share: 3}
  blue: {max_spend_usd_per_day: 2.5}
default: {max_concurrent_trials: 4}
"""


def test_the_limits_are_published_and_round_trip() -> None:
    quotas = parse_quotas("q.yaml", FILE)
    data = encode_limits(quotas)
    # The share too: runners judge fair share by the share published (current_share);
    # and the daily trials, which a CLI without the file is held to (held_to).
    assert b'"max_trials_per_day":100' in data and b'"share":3.0' in data
    back = decode_limits(data)
    assert back is not None
    assert back == quotas
    assert back.for_team("red") == TeamQuota(
        max_concurrent_trials=1, max_trials_per_day=100, share=3.0
    )
    assert back.for_team("blue") == TeamQuota(max_spend_usd_per_day=2.5)
    assert back.for_team("green") == TeamQuota(max_concurrent_trials=4)  # the default
    assert encode_limits(back) == data  # the same limits give the same bytes
    # Nothing published, or garbage: None (runners keep the message's copy).
    for raw in (None, b"", b"not json", b'{"teams": {"red": {"max_concurrent_trials": 0}}}'):
        assert decode_limits(raw) is None, raw


def test_a_team_gets_its_entry_the_default_or_no_limit() -> None:
    stamped = TeamRef(name="red", max_concurrent_trials=8, max_spend_usd_per_day=50.0)
    now = current_team(stamped, parse_quotas("q", FILE))
    assert (now.max_concurrent_trials, now.max_spend_usd_per_day) == (1, None)
    green = TeamRef(name="green", max_concurrent_trials=8)
    assert current_team(green, parse_quotas("q", FILE)).max_concurrent_trials == 4
    # Removed from the file, no default: no limit any more.
    gone = current_team(stamped, Quotas(teams={}))
    assert (gone.name, gone.max_concurrent_trials, gone.max_spend_usd_per_day) == (
        "red",
        None,
        None,
    )
    # Unchanged limits: the message's own TeamRef (no copy per delivery).
    same = TeamRef(name="red", max_concurrent_trials=1)
    assert current_team(same, parse_quotas("q", FILE)) is same


@pytest.mark.parametrize("published", [True, False], ids=["lowered", "control-not-published"])
async def test_a_lowered_concurrency_quota_reaches_queued_work(
    tmp_path: Path, published: bool
) -> None:
    # Both messages were stamped at submit with the team's old quota of 2 at once.
    world = World(held_completion(tmp_path))
    if published:
        await world.coord.set_team_limits(Quotas(teams={"red": TeamQuota(max_concurrent_trials=1)}))
    first, second = teamed(1, limit=2), teamed(2, limit=2)
    second_task = None
    running = await world.start(first)
    assert len(world.coord.holders("_team.red")) == 1
    if published:
        # Bounded: were the old quota applied, the second would start and block.
        verdict = await asyncio.wait_for(world.handle(second), 10)
        assert verdict.action == "nak" and verdict.reason == "handback"
        assert SLOT_WAIT_S[0] <= verdict.delay_s <= SLOT_WAIT_S[1]
        assert [c[0] for c in world.executor.calls] == ["hello__0001"]
    else:
        # Negative control: without a publication the message's 2 stand.
        world.executor.running.clear()
        second_task = await world.start(second)
        assert len(world.executor.calls) == 2
    world.executor.release.set()
    assert await running == ACK
    if second_task is not None:
        assert await second_task == ACK


async def test_a_raised_spend_cap_lets_held_work_start_without_resubmission(
    tmp_path: Path,
) -> None:
    usage: dict[str, float | int | None] = {"n_input_tokens": 10, "cost_usd": 0.6}
    world = World(ScriptedExecutor(lambda r, a: outcome(tmp_path, r, usage=usage)))
    assert await world.handle(teamed(0, limit=None, cap=0.5)) == ACK  # 0.6 of 0.5
    held = await world.handle(teamed(1, limit=None, cap=0.5))
    assert held.reason == "handback" and PAUSE_WAIT_S[0] <= held.delay_s
    # The operator raises red's cap in the file and publishes it: the same message runs.
    await world.coord.set_team_limits(Quotas(teams={"red": TeamQuota(max_spend_usd_per_day=5)}))
    assert await world.handle(teamed(1, limit=None, cap=0.5)) == ACK
    assert await world.coord.tally("spend", "red") == pytest.approx(1.2)
    # Lowered below the spend again: held back again (control of the same message).
    await world.coord.set_team_limits(Quotas(teams={"red": TeamQuota(max_spend_usd_per_day=1)}))
    again = await world.handle(teamed(2, limit=None, cap=5.0))
    assert again.reason == "handback"


class BrokenLimits(InMemoryCoordinator):
    """A coordinator whose limits cannot be read (the KV read fails)."""

    async def team_limits(self, *, fresh: bool = False) -> Quotas | None:
        raise ConnectionError("no KV")


async def test_unreadable_limits_fall_back_to_the_message(tmp_path: Path) -> None:
    world = World(held_completion(tmp_path), coord=BrokenLimits(lease_ttl_s=60.0))
    running = await world.start(teamed(1, limit=1))
    verdict = await world.handle(teamed(2, limit=1))  # the message's 1 still binds
    assert verdict.reason == "handback"
    world.executor.release.set()
    assert await running == ACK
    # A trial without a team reads no limits at all (the broken read is not reached).
    plain = teamed(3).model_copy(update={"team": None})
    assert await world.handle(plain) == ACK
