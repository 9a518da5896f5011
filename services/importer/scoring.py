"""The scoring rule: whether a trial's reward counts, and which reward is the main one.

A trial is scored (``reward_valid``) only on Harbor's word, i.e. when result.json
carries a finite main reward and every exception Harbor recorded (the trial's and its
steps') is of class "none" or "agent": exactly Harbor's own
``TrialResult.reward_valid`` (agents that time out or refuse are measured,
infrastructure and verifier failures are not), made stricter only by requiring the
main reward to be a finite number. When a later step's exception is what makes the
reward invalid, the failure class is that exception's, so the cause shown for an
unscored trial is the one that unscored it. Reward files read straight from
``verifier/`` when result.json is unusable are kept for information and never scored.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any, Final

from schemas.harbor_result import HarborTrialResult
from schemas.record import Evaluation, FailureClass
from services.common.failures import NEVER_SCORED, classify
from services.importer.reads import get_path, nonempty_str, parse_object, read_text, short
from services.importer.salvage import TrialRead
from services.importer.trial_files import TrialFiles

MAX_MESSAGE_CHARS: Final = 2000
"""Exception messages are cut to this length; the trial folder keeps the full text."""

_SCORED: Final = frozenset({"none", "agent"})


def main_reward_key(keys: Collection[str]) -> str | None:
    """The key of the main reward, chosen as Harbor does.

    - no keys: None;
    - a single key: that key (reward.txt always yields the single key "reward");
    - several keys: "reward" if present (Harbor's CLI, uploader and viewer all treat
      it as primary), else the first key in sorted order (the order Harbor's viewer
      lists them in).
    """
    if not keys:
        return None
    if len(keys) == 1:
        return next(iter(keys))
    if "reward" in keys:
        return "reward"
    return sorted(keys)[0]


def cut_message(message: str | None) -> str | None:
    """An exception message cut to MAX_MESSAGE_CHARS (marked when cut)."""
    if message is None or len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[:MAX_MESSAGE_CHARS] + " [truncated]"


def _clean_rewards(raw: Mapping[str, Any], label: str, errors: list[str]) -> dict[str, float]:
    """Keep finite numbers only; each dropped value gets a diagnostic."""
    clean: dict[str, float] = {}
    for key, value in raw.items():
        where = f"{label}[{key!r}]"
        if key.startswith("$") or "\x00" in key:
            # MongoDB refuses "$"-prefixed and NUL field names in updates.
            errors.append(f"{where}: key cannot be stored in the ledger; dropped")
        elif isinstance(value, bool) or not isinstance(value, int | float):
            errors.append(f"{where}: {short(value)} is not a number; dropped")
        else:
            try:
                number = float(value)
            except OverflowError:
                number = math.inf
            if math.isfinite(number):
                clean[key] = number
            else:
                errors.append(f"{where}: {short(value)} is not a finite number; dropped")
    return clean


def _artifact_rewards(trial: TrialFiles, errors: list[str]) -> tuple[dict[str, float], str]:
    """Rewards straight from the verifier's files (reward.json wins, as in Harbor)."""
    label = "verifier/reward.json"
    # lexists: a reward.json that is a link (even a dangling one) is reported, not
    # passed over for reward.txt.
    if trial.lexists(label):
        text = read_text(trial, label, errors)
        data = parse_object(text, label, errors) if text is not None else None
        return (_clean_rewards(data, label, errors) if data is not None else {}), label
    label = "verifier/reward.txt"
    text = read_text(trial, label, errors)
    if text is None:
        return {}, label
    try:
        value = float(text)
    except ValueError:
        errors.append(f"{label}: {short(text.strip())} is not a number")
        return {}, label
    return _clean_rewards({"reward": value}, label, errors), label


def _first_exception(result: HarborTrialResult) -> tuple[str | None, str | None]:
    # Harbor keeps the trial's first exception; multi-step trials record it on a step.
    if result.exception_info is not None:
        info = result.exception_info
        return info.exception_type, info.exception_message
    for step in result.step_results or []:
        etype = nonempty_str(get_path(step, "exception_info", "exception_type"))
        if etype:
            message = get_path(step, "exception_info", "exception_message")
            return etype, message if isinstance(message, str) else None
    return None, None


def _later_exception_types(result: HarborTrialResult) -> list[str]:
    """Exception types recorded on steps after the first exception (Harbor's order)."""
    types = [
        etype
        for step in result.step_results or []
        if (etype := nonempty_str(get_path(step, "exception_info", "exception_type")))
    ]
    return types if result.exception_info is not None else types[1:]


def evaluate(read: TrialRead, trial: TrialFiles, errors: list[str]) -> Evaluation:
    """The trial's Evaluation under the rule in this module's docstring."""
    result = read.result
    raw = result.verifier_result.rewards if result and result.verifier_result else None
    if raw is not None:
        # Harbor's verdict. The main key is chosen among all keys Harbor recorded, so
        # a broken "reward" leaves no main reward instead of promoting another key.
        rewards = _clean_rewards(raw, "result.json: verifier_result.rewards", errors)
        key = main_reward_key(list(raw))
    elif result is None or "verifier_result" in read.damaged:
        rewards, label = _artifact_rewards(trial, errors)
        key = main_reward_key(list(rewards))
        if rewards:
            errors.append(f"{label}: rewards read from the verifier's file are not scored")
    else:
        rewards, key = {}, None
    main_reward = rewards.get(key) if key is not None else None

    exception_type, exception_message = _first_exception(result) if result else (None, None)
    failure: FailureClass = classify(exception_type) if result else "infrastructure"
    if exception_type is None and read.damaged & {"exception_info", "step_results"}:
        # The record of what went wrong is itself broken: an unknown failure is never
        # scored as if there were none.
        failure = "infrastructure"
    if result is not None and failure in _SCORED:
        # Harbor's TrialResult.reward_valid asks every recorded exception, not only the
        # first: a later step's infrastructure failure makes the reward not count.
        later = next(
            (c for t in _later_exception_types(result) if (c := classify(t)) not in _SCORED),
            None,
        )
        failure = later or failure
    if failure == "agent" and main_reward is None:
        errors.append(
            f"result.json: the agent failed ({exception_type}) and the verifier gave no "
            "usable reward; the trial is unscored"
        )
    return Evaluation(
        rewards=rewards,
        main_reward_key=key,
        main_reward=main_reward,
        reward_valid=raw is not None
        and main_reward is not None
        and failure in _SCORED
        and exception_type not in NEVER_SCORED,
        failure_class=failure,
        exception_type=exception_type,
        exception_message=cut_message(exception_message),
    )
