"""The trials as a JUnit XML report (services/reports/junit.py)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from services.reports.junit import junit_xml
from services.reports.trials import lines_value
from tests.support.records import report_record, single_reward

RECORDS = [
    report_record(single_reward(1.0), task="a", agent="oracle"),
    report_record(single_reward(0.5), task="b", agent="oracle"),
    report_record(single_reward(None, "infrastructure", "SandboxBuildFailedError"), task="c"),
    report_record(single_reward(None, "cancelled", "CancelledError"), task="d", agent="nop"),
]


def _cases(root: ET.Element) -> dict[str, list[str]]:
    return {
        f"{case.get('classname')}/{case.get('name')}": [
            child.tag for child in case if child.tag != "properties"
        ]
        for case in root.iter("testcase")
    }


def test_each_trial_is_a_case_judged_by_the_scoring_rules() -> None:
    root = ET.fromstring(junit_xml("exp", lines_value("exp", None, RECORDS), 4, 4))
    assert _cases(root) == {
        "oracle/a #-": [],  # reward 1: a pass
        "oracle/b #-": ["failure"],  # 0.5: scored, not a pass
        "oracle/c #-": ["error"],  # unscored
        "nop/d #-": ["skipped"],  # cancelled
    }
    assert {k: root.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
        "tests": "4",
        "failures": "1",
        "errors": "1",
        "skipped": "1",
    }
    [oracle, nop] = root.iter("testsuite")
    assert (oracle.get("name"), oracle.get("tests"), nop.get("tests")) == ("oracle", "3", "1")
    [error] = root.iter("error")
    assert error.get("type") == "SandboxBuildFailedError"
    ids = [p.get("value") for p in root.iter("property") if p.get("name") == "trial_id"]
    assert ids == [r.trial_id for r in RECORDS]


@pytest.mark.parametrize("bad", ["\x00", "\x1b[31m", "\ud800", "\ufffe"])
def test_what_xml_cannot_hold_is_replaced_and_the_report_still_parses(bad: str) -> None:
    # An exception type comes from a trial's result.json: anything may be in it.
    record = report_record(single_reward(None, "agent", f"Err{bad}or"), task=f"t{bad}")
    lines = lines_value("exp", None, [record])
    root = ET.fromstring(junit_xml("exp", lines, 1, 1))
    [error] = root.iter("error")
    assert error.get("type", "").startswith("Err\ufffd")
    # The control: written as ElementTree writes it, the same text is no XML.
    raw = ET.Element("error", type=f"Err{bad}or")
    with pytest.raises((ET.ParseError, UnicodeEncodeError)):
        ET.fromstring(ET.tostring(raw, encoding="utf-8"))
