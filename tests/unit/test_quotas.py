"""Team quotas (docs/scheduling.md): the quotas file, the rolling tallies' arithmetic, the
submit gate, and what a runner does with a work message's team, over the fakes.

Each invariant has its negative control: the same situation without the quota.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from schemas.events import TeamRef, TrialRequested, TrialStarted, encode_event, parse_event
from services.common.adapters.memory import InMemoryCoordinator
from services.common.errors import ACK, UserInputError
from services.common.quotas import (
    QuotaConfigError,
    QuotaExceeded,
    TeamQuota,
    decode_tally,
    encode_tally,
    hour_of,
    parse_quotas,
    spend_refusal,
    team_key,
    team_ref,
    trials_refusal,
    window_add,
    window_total,
)
from services.runner.admission import PAUSE_WAIT_S, SLOT_WAIT_S
from services.submitter.quota_gate import QuotaGate
from services.submitter.retry import retry_trial, retry_unscored
from tests.unit.runner_support import ScriptedExecutor, held_completion, make_request
from tests.unit.test_runner_guards import outcome
from tests.unit.test_runner_handlers import World, kinds
from tests.unit.test_submitter_schedule import _submitted

NOON = datetime(2026, 11, 26, 12, 30, tzinfo=UTC)


# -- the quotas file ---------------------------------------------------------------------
def test_the_file_gives_each_team_its_quota_and_others_the_default() -> None:
    quotas = parse_quotas(
        "q.yaml",
        b"teams:\n  red: {max_concurrent_trials: 2, max_trials_per_day: 10}\n"
        b"  blue.x@y: {max_spend_usd_per_day: 1.5}\n"
        b"default: {max_trials_per_day: 5}\n",
    )
    assert quotas.for_team("red") == TeamQuota(max_concurrent_trials=2, max_trials_per_day=10)
    assert quotas.for_team("blue.x@y") == TeamQuota(max_spend_usd_per_day=1.5)
    assert quotas.for_team("green") == TeamQuota(max_trials_per_day=5)
    # No team (a CLI submission without TRIALBUS_CLI_TEAM): no quota, default or not.
    assert quotas.for_team(None) is None
    # Negative control: without a default, an unlisted team has no quota.
    assert parse_quotas("q.yaml", b"teams: {red: {}}").for_team("green") is None
    assert parse_quotas("q.yaml", b"").for_team("red") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"teams: {red: {max_trials_per_dya: 3}}", "q.yaml: teams.red.max_trials_per_dya: unknown"),
        (b"teams: {red: {max_concurrent_trials: 0}}", "teams.red.max_concurrent_trials"),
        (b"teams: {red: {max_spend_usd_per_day: -1}}", "teams.red.max_spend_usd_per_day"),
        (b"teams: {red: {max_spend_usd_per_day: .inf}}", "teams.red.max_spend_usd_per_day"),
        (b"default: {max_trials_per_day: lots}", "default.max_trials_per_day"),
        (b"teams: {'bad name': {}}", "team name 'bad name'"),
        (b"teams: [red]", "q.yaml: teams"),
        (b"teams: {red: {max_trials_per_day: 3}", "q.yaml: not valid YAML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_field(text: bytes, expected: str) -> None:
    with pytest.raises(QuotaConfigError) as caught:
        parse_quotas("q.yaml", text)
    assert expected in str(caught.value), str(caught.value)
    assert isinstance(caught.value, UserInputError)  # exit 2 at start-up


def test_team_keys_are_kv_safe_and_distinct() -> None:
    names = ["red", "red.x", "red-x", "red_x", "red@x", "red+x", "r.e.d"]
    keys = [team_key(n) for n in names]
    assert len(set(keys)) == len(set(names))
    assert all(
        set(k) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-=")
        for k in keys
    )
    assert team_key("red.x") == "red=2Ex" and team_key("red") == "red"


# -- the rolling window ------------------------------------------------------------------
def test_the_window_counts_the_last_24_hours_and_forgets_older_ones() -> None:
    tally = window_add({}, NOON - timedelta(hours=23), 4)
    tally = window_add(tally, NOON, 3)
    tally = window_add(tally, NOON + timedelta(minutes=10), 1)  # same hour
    assert tally[hour_of(NOON)] == 4 and window_total(tally, NOON) == 8
    # 24 hours on, the oldest hour has left the window (and the stored object).
    later = NOON + timedelta(hours=1)
    assert window_total(tally, later) == 4
    assert len(window_add(tally, later, 0.5)) == 2
    # Giving back never goes below zero; an emptied hour is dropped.
    assert window_add(tally, NOON, -10) == {hour_of(NOON - timedelta(hours=23)): 4}


def test_a_stored_tally_round_trips_and_garbage_counts_as_empty() -> None:
    tally = {"2026-11-26T12": 3.0, "2026-11-26T11": 0.25}
    assert decode_tally(encode_tally(tally)) == tally
    assert encode_tally(tally) == b'{"2026-11-26T11":0.25,"2026-11-26T12":3.0}'
    for junk in (None, b"", b"nope", b"[1]", b'{"h": "x", "g": -1, "n": NaN}'):
        assert decode_tally(junk) == {}


def test_the_refusals_name_the_quota_its_limit_and_the_use() -> None:
    quota = TeamQuota(max_trials_per_day=10, max_spend_usd_per_day=2.0)
    assert trials_refusal("red", quota, 4, 6) is None  # exactly at the limit passes
    msg = trials_refusal("red", quota, 5, 6)
    assert msg is not None
    assert "max_trials_per_day of team 'red': 6 of 10" in msg and "has 5 to run (4 left)" in msg
    assert trials_refusal("red", TeamQuota(), 10**6, 10**9) is None  # no limit
    assert spend_refusal("red", quota, 1.99) is None
    over = spend_refusal("red", quota, 2.0)
    assert over is not None and "max_spend_usd_per_day of team 'red': $2.0000 of $2" in over


def test_only_what_runners_enforce_goes_on_the_wire() -> None:
    assert team_ref("red", TeamQuota(max_trials_per_day=3)) is None
    ref = team_ref("red", TeamQuota(max_concurrent_trials=2))
    assert ref == TeamRef(name="red", max_concurrent_trials=2)
    # The field is left out when unset: older runners parse the bytes as before.
    plain = make_request()
    assert b'"team"' not in encode_event(plain)
    teamed = plain.model_copy(update={"team": ref})
    assert parse_event(encode_event(teamed)) == teamed


# -- the submit gate ---------------------------------------------------------------------
async def test_the_gate_counts_trials_and_refuses_past_the_day() -> None:
    coord = InMemoryCoordinator(lease_ttl_s=60)
    coord.now = lambda: NOON
    gate = QuotaGate(coord, "red", TeamQuota(max_trials_per_day=10, max_concurrent_trials=2))
    assert await gate.admit(6) == TeamRef(name="red", max_concurrent_trials=2)
    with pytest.raises(QuotaExceeded) as caught:
        await gate.admit(5)
    assert "max_trials_per_day of team 'red': 6 of 10" in str(caught.value)
    assert await coord.tally("trials", "red") == 6  # a refusal counts nothing
    # Duplicates JetStream dropped are given back; then 4 more fit exactly.
    await gate.give_back(2)
    assert await gate.admit(6) is not None
    # The window moves on: a day later the team has its whole quota again.
    coord.now = lambda: NOON + timedelta(hours=24)
    assert await gate.admit(10) is not None
    # Negative control: another team's tally is untouched.
    assert await coord.tally("trials", "blue") == 0


async def test_the_gate_refuses_a_team_at_its_spend_cap() -> None:
    coord = InMemoryCoordinator(lease_ttl_s=60)
    gate = QuotaGate(coord, "red", TeamQuota(max_spend_usd_per_day=1.0))
    await gate.check_spend()
    await coord.add_tally("spend", "red", 0.99)
    await gate.check_spend()  # under the cap
    await coord.add_tally("spend", "red", 0.01)
    with pytest.raises(QuotaExceeded, match=r"\$1.0000 of \$1 spent"):
        await gate.check_spend()


# -- on the runner -----------------------------------------------------------------------
def teamed(i: int, *, limit: int | None = 1, cap: float | None = None) -> TrialRequested:
    """Trial ``i`` of exp-1 (no experiment limit binds) of team red."""
    req = make_request(f"hello__{i:04d}", limit=100, experiment_trials=10)
    team = TeamRef(name="red", max_concurrent_trials=limit, max_spend_usd_per_day=cap)
    return req.model_copy(update={"team": team})


async def test_a_team_slot_bounds_the_team_and_a_waiting_trial_is_uncounted(
    tmp_path: Path,
) -> None:
    world = World(held_completion(tmp_path))
    running = await world.start(teamed(1))
    assert len(world.coord.holders("_team.red")) == 1
    verdict = await world.handle(teamed(2))
    assert verdict.action == "nak" and verdict.reason == "handback"
    assert SLOT_WAIT_S[0] <= verdict.delay_s <= SLOT_WAIT_S[1]
    assert [c[0] for c in world.executor.calls] == ["hello__0001"]
    world.executor.release.set()
    assert await running == ACK
    assert world.coord.holders("_team.red") == []  # given back at the end
    # The handed-back trial runs next, as attempt 1.
    assert await world.handle(teamed(2)) == ACK
    assert [e.attempt for e in world.bus.of_type(TrialStarted)] == [1, 1]


async def test_without_a_team_concurrency_quota_no_team_slot_is_taken(tmp_path: Path) -> None:
    # Negative control: the same two trials, the team carrying only a spend cap, and
    # no team at all: both run at once and no team key is written.
    def plain(i: int) -> TrialRequested:
        return make_request(f"hello__{i:04d}", limit=100, experiment_trials=10)

    def capped_only(i: int) -> TrialRequested:
        return teamed(i, limit=None, cap=5.0)

    for req in (capped_only, plain):
        world = World(held_completion(tmp_path))
        first = await world.start(req(1))
        world.executor.running.clear()
        second = await world.start(req(2))
        assert len(world.executor.calls) == 2
        assert world.coord.holders("_team.red") == []
        world.executor.release.set()
        assert (await first, await second) == (ACK, ACK)


async def test_a_team_at_its_spend_cap_holds_its_trials_back(tmp_path: Path) -> None:
    usage: dict[str, float | int | None] = {"n_input_tokens": 10, "n_output_tokens": 1}
    usage["cost_usd"] = 0.4
    world = World(ScriptedExecutor(lambda r, a: outcome(tmp_path, r, usage=usage)))
    for i in range(3):  # 0.4, 0.8, 1.2: the third reaches the 1.0 cap
        assert await world.handle(teamed(i, limit=None, cap=1.0)) == ACK
    assert await world.coord.tally("spend", "red") == pytest.approx(1.2)
    assert not await world.coord.is_paused("exp-1")
    verdict = await world.handle(teamed(3, limit=None, cap=1.0))
    assert verdict.reason == "handback" and PAUSE_WAIT_S[0] <= verdict.delay_s
    # Held back, not paused: the pause flag is the submitter's alone.
    assert not await world.coord.is_paused("exp-1")
    assert len(world.executor.calls) == 3
    assert kinds(world.bus).count("trial_completed") == 3
    # Negative control: a trial of the same experiment without the team's cap (the
    # quota off) is not held by the team's spend.
    assert await world.handle(make_request("hello__0009", limit=100, experiment_trials=10)) == ACK
    assert len(world.executor.calls) == 4


# -- retry -------------------------------------------------------------------------------
async def test_a_retry_of_many_stopped_by_the_quota_says_how_many_went() -> None:
    prepared, ports, ledger, bus = await _submitted(rewards=(None, None))
    info = await ledger.get_experiment(prepared.experiment_id)
    assert info is not None
    info.manifest["submitted_by"] = {"user": "alice", "team": "red"}
    await ledger.upsert_experiment(info)
    quotas = parse_quotas("q.yaml", b"teams: {red: {max_trials_per_day: 1}}")
    held = dataclasses.replace(ports, quotas=quotas)
    bus.published.clear()
    with pytest.raises(QuotaExceeded, match=r"^1 of 2 trials were queued again, then: "):
        await retry_unscored(held, prepared.experiment_id)
    assert len(bus.of_type(TrialRequested)) == 1
    # The control: with room for both, both go.
    room = parse_quotas("q.yaml", b"teams: {red: {max_trials_per_day: 3}}")
    answer = await retry_unscored(dataclasses.replace(ports, quotas=room), info.experiment_id)
    assert len(answer["retried"]) == 2
    assert {r["correlation_id"] for r in answer["retried"]} == {answer["correlation_id"]}


async def test_a_retry_counts_against_and_carries_the_recorded_team() -> None:
    prepared, ports, ledger, bus = await _submitted()
    info = await ledger.get_experiment(prepared.experiment_id)
    assert info is not None
    info.manifest["submitted_by"] = {"user": "alice", "team": "red"}
    await ledger.upsert_experiment(info)
    coord = InMemoryCoordinator(lease_ttl_s=60)
    quotas = parse_quotas(
        "q.yaml", b"teams: {red: {max_concurrent_trials: 2, max_trials_per_day: 1}}"
    )
    exp, trial = prepared.experiment_id, prepared.trials[0].trial_id
    held = dataclasses.replace(ports, coordinator=coord, quotas=quotas)
    # The CLI's team does not replace the recorded one.
    await retry_trial(held, exp, trial, team="x")
    [run] = bus.of_type(TrialRequested)
    assert run.team == TeamRef(name="red", max_concurrent_trials=2)
    assert await coord.tally("trials", "red") == 1
    with pytest.raises(QuotaExceeded, match="max_trials_per_day of team 'red': 1 of 1"):
        await retry_trial(held, exp, trial)
    assert len(bus.of_type(TrialRequested)) == 1  # nothing published
    # Negative control: without quotas the retry carries no team and counts nothing.
    await retry_trial(ports, exp, trial)
    assert bus.of_type(TrialRequested)[-1].team is None
