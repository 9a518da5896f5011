"""An experiment's trials as a JUnit XML report, the test-report format CI systems
read (GitLab's ``artifacts:reports:junit``, Jenkins, GitHub test-report actions).

One ``<testsuite>`` per agent (as the leaderboard names it, ``agent@model``), one
``<testcase>`` per recorded trial, named ``<task> #<repetition>``, by the scoring rules
of docs/scoring.md:

- passed: a scored trial whose reward is a pass;
- ``<failure>``: a scored trial whose reward is not (the agent did not solve the task);
- ``<error>``: an unscored trial (an infrastructure, agent or verifier failure, or no
  usable reward): its cause and exception;
- ``<skipped>``: a cancelled trial.

Each case carries its trial id, reward and attempts as properties, so a red build
names the ids ``trialbus logs`` and ``trialbus retry`` take. Trials without a record
(still running when ``submit --wait`` timed out), and those a filter left out, are
not cases; the ``trials`` and ``recorded`` properties of ``<testsuites>`` say how many
trials the experiment has and how many of them have a record.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

from services.common.ports import Ledger
from services.reports import scoring
from services.reports.report_cache import ReportCache
from services.reports.trials import TrialFilter, experiment_trials, select

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""Characters XML 1.0 cannot hold, escaped or not (ElementTree writes them as they are)."""


def _text(value: object) -> str:
    """``value`` as XML can hold it: what it cannot (a control character in an
    exception type read from a result file) as U+FFFD, so a CI's parser never fails."""
    return _NOT_XML.sub("\ufffd", str(value))


def _element(parent: ET.Element, tag: str, **attrs: object) -> ET.Element:
    return ET.SubElement(parent, tag, {k: _text(v) for k, v in attrs.items()})


def _outcome(line: dict[str, Any]) -> tuple[str | None, str, str]:
    """(element, type, message) of a trial: element None when it passed."""
    if line["unscored_cause"] == "cancelled":
        return "skipped", "cancelled", "cancelled"
    if line["passed"] is None:
        why = line["exception_type"] or line["unscored_cause"]
        return "error", why, f"unscored ({line['unscored_cause']}): {why}"
    if not line["passed"]:
        message = (
            f"reward {line['reward']:g} is below the pass threshold {scoring.PASS_THRESHOLD:g}"
        )
        return "failure", "reward", message
    return None, "", ""


def _counts(lines: Sequence[dict[str, Any]]) -> dict[str, object]:
    kinds = [_outcome(line)[0] for line in lines]
    return {
        "tests": len(lines),
        "failures": kinds.count("failure"),
        "errors": kinds.count("error"),
        "skipped": kinds.count("skipped"),
        "time": f"{sum(line['seconds'] or 0.0 for line in lines):.3f}",
    }


def junit_xml(
    experiment_id: str, lines: Sequence[dict[str, Any]], n_trials: int, recorded: int
) -> bytes:
    """The report of ``lines`` (``services.reports.trials``'s, as JSON) of an experiment
    of ``n_trials`` trials, ``recorded`` of which have a record, as UTF-8 XML."""
    root = ET.Element("testsuites")
    for key, value in {"name": f"trialbus {experiment_id}", **_counts(lines)}.items():
        root.set(key, _text(value))
    props = _element(root, "properties")
    facts = {"experiment_id": experiment_id, "trials": n_trials, "recorded": recorded}
    for name, value in facts.items():
        _element(props, "property", name=name, value=value)
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_agent.setdefault(line["agent"], []).append(line)
    for agent, cases in by_agent.items():
        suite = _element(root, "testsuite", name=agent, **_counts(cases))
        for line in cases:
            rep = "-" if line["repetition"] is None else line["repetition"]
            case = _element(
                suite,
                "testcase",
                classname=agent,
                name=f"{line['task']} #{rep}",
                time=f"{line['seconds'] or 0.0:.3f}",
            )
            case_props = _element(case, "properties")
            for name in ("trial_id", "reward", "attempts", "runner_host"):
                if line[name] is not None:
                    _element(case_props, "property", name=name, value=line[name])
            element, kind, message = _outcome(line)
            if element == "skipped":
                _element(case, element, message=message)
            elif element is not None:
                _element(case, element, message=message, type=kind)
    ET.indent(root)
    xml: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return xml + b"\n"


async def experiment_junit(
    ledger: Ledger, experiment_id: str | None, where: TrialFilter, cache: ReportCache | None = None
) -> tuple[str, bytes]:
    """(experiment id, the JUnit report of its recorded trials that ``where`` keeps);
    None picks the latest experiment. Raises ExperimentNotFound as
    ``queries.load_experiment``."""
    exp_id, lines = await experiment_trials(ledger, experiment_id, cache=cache)
    info = await ledger.get_experiment(exp_id)
    chosen = select(lines, where)
    n_trials = info.n_trials if info else len(lines)
    return exp_id, junit_xml(exp_id, chosen, n_trials, len(lines))
