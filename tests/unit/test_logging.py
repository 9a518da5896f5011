"""One structured format per process: structlog and stdlib lines alike, ids bound per event."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from schemas.events import ExperimentCompleted, TrialStarted
from services.common.logging import NOISY_LIBRARIES, bound_event, configure_logging, get_logger


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """A fresh log stream; the process's logging configuration is restored afterwards."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    saved_noisy = {name: logging.getLogger(name).level for name in NOISY_LIBRARIES}
    buf = io.StringIO()
    try:
        yield buf
    finally:
        structlog.reset_defaults()
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
        for name, level in saved_noisy.items():
            logging.getLogger(name).setLevel(level)


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line as a JSON object; a line that is not one fails the test."""
    out = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            raise AssertionError(f"not a JSON log line: {line!r}") from None
        assert isinstance(entry, dict), line
        out.append(entry)
    return out


def _started(trial: str) -> TrialStarted:
    return TrialStarted(
        experiment_id="exp-1", trial_id=trial, runner_id="r0", host="h", attempt=1, run_id=trial
    )


def test_stdlib_and_structlog_lines_are_json_with_the_bound_ids(stream: io.StringIO) -> None:
    configure_logging("INFO", json=True, stream=stream)
    event = _started("t-1")
    with bound_event(event, attempt=2):
        get_logger("services.runner.worker").info("trial_started", slot=1)
        logging.getLogger("harbor.trial").warning("container %s exited", "abc")
        logging.getLogger("faststream.access").error("handler failed")
    ours, harbor, faststream = json_lines(stream.getvalue())

    ids = {
        "experiment_id": "exp-1",
        "trial_id": "t-1",
        "event_id": event.event_id,
        "event_type": "trial_started",
        "attempt": 2,
    }
    for entry in (ours, harbor, faststream):
        assert {k: entry.get(k) for k in ids} == ids, entry
        assert entry["timestamp"].endswith("Z")
    assert (ours["event"], ours["level"], ours["slot"]) == ("trial_started", "info", 1)
    assert (harbor["event"], harbor["level"], harbor["logger"]) == (
        "container abc exited",
        "warning",
        "harbor.trial",
    )
    assert faststream["level"] == "error"


def test_json_check_rejects_the_plain_lines_of_an_unrouted_stdlib_logger(
    stream: io.StringIO,
) -> None:
    # Negative control: the default stdlib format (what Harbor's lines looked like
    # before they were routed through structlog) is caught by the check above.
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
    root.addHandler(handler)
    # A logger of its own: earlier tests may have quietened Harbor's loggers, and a
    # line that is never written would make this control pass vacuously.
    unrouted = logging.getLogger("tests.unrouted.stdlib")
    unrouted.setLevel(logging.WARNING)
    unrouted.propagate = True
    unrouted.disabled = False
    unrouted.warning("container exited")
    assert "container exited" in stream.getvalue()
    with pytest.raises(AssertionError, match="not a JSON log line"):
        json_lines(stream.getvalue())


def test_ids_are_unbound_after_the_event_and_trial_id_only_when_present(
    stream: io.StringIO,
) -> None:
    configure_logging("INFO", json=True, stream=stream)
    log = get_logger("services.importer.handlers")
    with bound_event(_started("t-1")):
        pass
    log.info("between events")
    done = ExperimentCompleted(experiment_id="exp-2", n_trials=3, n_scored=3, n_partial=0)
    with bound_event(done):
        log.info("inside")
    between, inside = json_lines(stream.getvalue())
    assert not {"experiment_id", "trial_id", "event_id", "event_type"} & between.keys()
    assert (inside["experiment_id"], inside["event_type"]) == ("exp-2", "experiment_completed")
    assert "trial_id" not in inside  # an experiment-level event binds no trial


async def test_concurrent_handlers_keep_their_own_ids(stream: io.StringIO) -> None:
    configure_logging("INFO", json=True, stream=stream)
    log = get_logger("services.runner.worker")
    both_bound = asyncio.Barrier(2)

    async def handle(trial: str) -> None:
        with bound_event(_started(trial)):
            await both_bound.wait()  # each task logs while the other's ids are bound
            log.info("handling")
            logging.getLogger("harbor").warning("lib line")

    await asyncio.gather(handle("t-a"), handle("t-b"))
    lines = json_lines(stream.getvalue())
    assert len(lines) == 4
    by_trial: dict[str, list[str]] = {}
    for entry in lines:
        by_trial.setdefault(entry["trial_id"], []).append(entry["event"])
    assert {k: sorted(v) for k, v in by_trial.items()} == {
        "t-a": ["handling", "lib line"],
        "t-b": ["handling", "lib line"],
    }


def test_noisy_libraries_stay_at_warnings_and_our_level_applies(stream: io.StringIO) -> None:
    configure_logging("DEBUG", json=True, stream=stream)
    logging.getLogger("harbor.trial").info("per-trial chatter")
    logging.getLogger("faststream").info("per-message chatter")
    get_logger("services.watcher.app").debug("ours at debug")
    [entry] = json_lines(stream.getvalue())
    assert entry["event"] == "ours at debug"


def test_reconfiguring_keeps_one_handler_and_a_terminal_gets_no_json(
    stream: io.StringIO,
) -> None:
    configure_logging("INFO", json=True, stream=io.StringIO())
    configure_logging("INFO", json=False, stream=stream)
    assert len(logging.getLogger().handlers) == 1
    logging.getLogger("harbor").warning("plain for humans")
    text = stream.getvalue()
    assert "plain for humans" in text
    with pytest.raises(AssertionError):
        json_lines(text)


def test_faststream_own_console_handler_is_replaced_by_the_root_one(
    stream: io.StringIO,
) -> None:
    import faststream  # noqa: F401 - its import installs the handler this test is about

    fs = logging.getLogger("faststream")
    saved = (list(fs.handlers), fs.propagate)
    if fs.propagate:
        # An earlier test in this process configured logging already (a service app run
        # in-process): put back the state FastStream's import leaves, a console handler
        # of its own that does not propagate.
        fs.propagate = False
        fs.addHandler(logging.StreamHandler(io.StringIO()))
    # Negative control: FastStream really prints on its own, bypassing the root.
    assert not fs.propagate and any(type(h) is logging.StreamHandler for h in fs.handlers)
    try:
        configure_logging("INFO", json=True, stream=stream)
        fs.warning("app starting")
        [entry] = json_lines(stream.getvalue())
        assert (entry["event"], entry["logger"]) == ("app starting", "faststream")
    finally:
        for handler in list(fs.handlers):
            fs.removeHandler(handler)
        for handler in saved[0]:
            fs.addHandler(handler)
        fs.propagate = saved[1]
