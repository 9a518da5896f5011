"""Live-log redaction and bounds (services.common.redaction, services.runner.live_logs).

Pure tests over the redactor and the per-trial sink; the sink publishes into a list
(what would go to core NATS). tests/integration/test_live_logs_nats.py checks the
same rules against a real nats-server's logs stream.
"""

from __future__ import annotations

import base64
import itertools
import json
import random
from pathlib import Path

import pytest

from schemas.events import TrialRequested
from schemas.manifest import AgentSpec
from schemas.subjects import Topology
from services.common.redaction import MIN_SECRET_CHARS, Redactor, base64_forms, runner_secrets
from services.runner.live_logs import CoreNatsLogSinks, LogLimits, TrialLogSink
from tests.support.work_requests import hello_file_request

KEY = "sk-live-0123456789abcdefXYZ"
TOKEN = "ghp_Q1w2E3r4T5y6U7i8O9p0"


def feed_all(redactor: Redactor, chunks: list[str]) -> str:
    stream = redactor.stream()
    return "".join(stream.feed(c) for c in chunks) + stream.flush()


def split_at(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(cuts), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def test_exact_values_are_replaced_by_their_name() -> None:
    redactor = Redactor({"OPENAI_API_KEY": KEY, "GH_TOKEN": TOKEN})
    out = redactor.redact(f"OPENAI_API_KEY={KEY}\nGH_TOKEN={TOKEN} {KEY}")
    assert out == (
        "OPENAI_API_KEY=[redacted:OPENAI_API_KEY]\nGH_TOKEN=[redacted:GH_TOKEN] "
        "[redacted:OPENAI_API_KEY]"
    )


def test_a_secret_split_at_every_position_between_two_chunks_is_caught() -> None:
    redactor = Redactor({"OPENAI_API_KEY": KEY})
    text = f"$ env | grep KEY\nOPENAI_API_KEY={KEY}\n$ "
    expected = redactor.redact(text)
    assert KEY not in expected
    for cut in range(len(text) + 1):
        out = feed_all(redactor, split_at(text, [cut]))
        assert out == expected, cut


def test_a_secret_fed_one_character_at_a_time_is_caught() -> None:
    redactor = Redactor({"K": KEY})
    out = feed_all(redactor, list(f"xx{KEY}yy{KEY}"))
    assert out == "xx[redacted:K]yy[redacted:K]"


def test_random_chunking_of_several_secrets_matches_whole_text_redaction() -> None:
    rng = random.Random(7)
    secrets = {"A_KEY": KEY, "B_TOKEN": TOKEN, "C_PASSWORD": "hunter2-hunter2"}
    redactor = Redactor(secrets)
    for _ in range(200):
        parts = [
            rng.choice([*secrets.values(), "noise ", "sk-", "\n", "ghp_Q1"]) for _ in range(12)
        ]
        text = "".join(parts)
        cuts = [rng.randrange(len(text) + 1) for _ in range(rng.randrange(6))]
        out = feed_all(redactor, split_at(text, cuts))
        assert out == redactor.redact(text)
        assert not any(value in out for value in secrets.values()), out


def test_overlapping_secrets_are_merged_and_no_fragment_of_either_leaks() -> None:
    first, second = "AAAAxxxxxxxx", "xxxxxxxxBBBBBBBB"  # share "xxxxxxxx"
    redactor = Redactor({"FIRST": first, "SECOND": second})
    text = "<AAAAxxxxxxxxBBBBBBBB>"  # both occur, overlapping
    assert redactor.redact(text) == "<[redacted:FIRST+SECOND]>"
    for cut in range(len(text) + 1):
        out = feed_all(redactor, split_at(text, [cut]))
        assert out == "<[redacted:FIRST+SECOND]>", (cut, out)
        assert "BBBB" not in out and "AAAA" not in out


def test_output_that_cannot_start_a_secret_is_not_held_back() -> None:
    stream = Redactor({"K": KEY}).stream()
    assert stream.feed("line one\n") == "line one\n"
    # "sk-" may begin the key: kept back until the next chunk says otherwise.
    assert stream.feed("then sk-") == "then "
    assert stream.held == len("sk-")
    assert stream.feed("something else\n") == "sk-something else\n"
    assert stream.held == 0


def test_base64_forms_are_caught_at_each_alignment() -> None:
    redactor = Redactor({"K": KEY})
    for prefix in ("", "u", "us", "user:"):
        encoded = base64.b64encode(f"{prefix}{KEY}".encode()).decode()
        out = redactor.redact(f"Authorization: Basic {encoded}")
        assert "[redacted:K]" in out, prefix
        assert base64.b64encode(KEY.encode()).decode()[:12] not in out
    # URL-safe alphabet too (a value whose base64 has '+' or '/').
    value = "\xfb\xff\xbe-secret-value"
    urlsafe = base64.urlsafe_b64encode(value.encode()).decode()
    assert "[redacted:V]" in Redactor({"V": value}).redact(urlsafe)


def test_negative_controls_unknown_secret_and_encodings_off() -> None:
    text = f"key={KEY} basic={base64.b64encode(KEY.encode()).decode()}"
    # Nothing known: the secret goes through (what happened before this module).
    assert KEY in feed_all(Redactor({}), [text[:20], text[20:]])
    # Encodings off: the exact value is caught, its base64 form is not.
    plain = Redactor({"K": KEY}, encodings=False).redact(text)
    assert KEY not in plain and base64.b64encode(KEY.encode()).decode() in plain


def test_short_values_are_not_searched_for_but_reported() -> None:
    redactor = Redactor({"PIN": "1234", "EMPTY": "", "K": KEY})
    assert redactor.too_short == ["PIN"]
    assert redactor.names == ["K"]
    assert redactor.redact("1234 and 1234") == "1234 and 1234"
    assert MIN_SECRET_CHARS == 8
    assert all(len(form) >= MIN_SECRET_CHARS for form in base64_forms("12345678"))


def test_runner_secrets_come_from_the_credentials_file_and_url_passwords(tmp_path: Path) -> None:
    creds = tmp_path / "runner.json"
    creds.write_text(
        json.dumps(
            {"role": "runner", "user": "r", "password": "pw-" + "z" * 40, "inbox_prefix": "_I"}
        )
    )
    creds.chmod(0o600)
    found = runner_secrets(
        creds, {"LEDGER_URL": "mongodb://u:s3cr%40t-pass@h/db", "NATS_URL": "nats://h:1"}
    )
    assert found == {"TRIALBUS_NATS_CREDENTIALS": "pw-" + "z" * 40, "LEDGER_URL": "s3cr%40t-pass"}
    assert runner_secrets(tmp_path / "absent.json", {}) == {}


# -- the per-trial sink -------------------------------------------------------------------


def request(api_key_env: list[str], trial_id: str = "hello-file__0") -> TrialRequested:
    """A work message whose agent names ``api_key_env``."""
    agent = AgentSpec(name="terminus-2", model="openai/gpt-x", api_key_env=api_key_env)
    return hello_file_request(trial_id, agent, experiment_id="exp-1", correlation_id="corr-1")


class Published:
    """What the sink hands to core NATS, decoded."""

    def __init__(self) -> None:
        self.events: list[dict[str, object]] = []

    async def __call__(self, subject: str, payload: bytes) -> None:
        self.events.append({"subject": subject, **json.loads(payload)})

    @property
    def texts(self) -> list[str]:
        return [str(e["text"]) for e in self.events]


def sink_for(
    published: Published, environ: dict[str, str], limits: LogLimits | None = None
) -> TrialLogSink:
    sinks = CoreNatsLogSinks(published, Topology("t"), limits=limits, environ=environ)
    return sinks(request(sorted(environ)))


async def test_the_sink_redacts_the_agents_secrets_across_chunks() -> None:
    published = Published()
    sink = sink_for(published, {"OPENAI_API_KEY": KEY})
    await sink("agent", "stdout", f"OPENAI_API_KEY={KEY[:10]}")
    await sink("agent", "stdout", f"{KEY[10:]}\n")
    await sink.close()
    assert "".join(published.texts) == "OPENAI_API_KEY=[redacted:OPENAI_API_KEY]\n"
    assert all(KEY[:10] not in t for t in published.texts)
    assert published.events[0]["subject"] == "t.logs.exp-1.hello-file__0"


async def test_only_the_variables_the_agent_names_are_secrets() -> None:
    # Negative control: a variable the agent does not name is not the trial's secret.
    published = Published()
    sinks = CoreNatsLogSinks(published, Topology("t"), environ={"OTHER_KEY": KEY})
    sink = sinks(request([]))
    await sink("agent", "stdout", KEY)
    await sink.close()
    assert published.texts == [KEY]


async def test_runner_credentials_are_redacted_too() -> None:
    published = Published()
    sinks = CoreNatsLogSinks(
        published, Topology("t"), runner_secrets={"LEDGER_URL": TOKEN}, environ={}
    )
    sink = sinks(request([]))
    await sink("agent", "stderr", f"mongodb://u:{TOKEN}@h")
    await sink.close()
    assert published.texts == ["mongodb://u:[redacted:LEDGER_URL]@h"]
    assert published.events[0]["stream"] == "stderr"


async def test_long_output_is_split_into_events_not_cut() -> None:
    published = Published()
    sink = sink_for(published, {}, LogLimits(trial_bytes=1 << 20, event_chars=100))
    text = "".join(f"{i:04d}" for i in range(250))  # 1000 characters
    await sink("agent", "stdout", text)
    await sink.close()
    assert [len(t) for t in published.texts] == [100] * 10
    assert "".join(published.texts) == text


async def test_the_trial_cap_holds_and_the_dropped_bytes_are_counted_to_the_end() -> None:
    published = Published()
    sink = sink_for(published, {"K": KEY}, LogLimits(trial_bytes=1000, event_chars=300))
    for i in range(50):
        await sink("agent", "stdout", f"line {i:03d} " + "é" * 40 + "\n")  # 90 bytes
    await sink("verification", "stdout", "x" * 500)
    await sink.close()
    output = [t for t in published.texts if not t.startswith("[trialbus: ")]
    notices = [t for t in published.texts if t.startswith("[trialbus: ")]
    sent = sum(len(t.encode()) for t in output)
    assert sent == sink.published_bytes <= 1000
    assert sent > 1000 - 4  # filled up to the cap (a cut never splits a character)
    total = 50 * 90 + 500
    assert sink.dropped_bytes == total - sent
    assert len(notices) == 2
    assert "not published as live logs" in notices[0] and "count follows" in notices[0]
    assert f"{total - sent} bytes" in notices[1] and "cap of 1000 bytes" in notices[1]
    assert published.texts[-1] == notices[1]
    # Nothing is published after close.
    await sink("agent", "stdout", "late")
    assert len(published.events) == len(output) + 2


async def test_under_the_cap_there_is_no_notice() -> None:
    # Negative control for the cap test: the same output under a large cap.
    published = Published()
    sink = sink_for(published, {}, LogLimits(trial_bytes=1 << 20, event_chars=300))
    for i in range(50):
        await sink("agent", "stdout", f"line {i:03d} " + "é" * 40 + "\n")
    await sink.close()
    assert sink.dropped_bytes == 0
    assert not any(t.startswith("[trialbus: ") for t in published.texts)
    assert sink.published_bytes == 50 * 90


@pytest.mark.parametrize("value", ["1234", "short!7"])
async def test_a_secret_too_short_to_redact_withholds_the_trials_output(value: str) -> None:
    published = Published()
    sink = sink_for(published, {"PIN_KEY": value})
    await sink("agent", "stdout", f"the pin is {value}\n")
    await sink.close()
    assert all(value not in t for t in published.texts)
    assert len(published.texts) == 2
    assert "PIN_KEY is shorter than 8 characters" in published.texts[1]
    assert f"{len(f'the pin is {value}\n')} bytes" in published.texts[1]


async def test_a_phase_change_releases_what_the_previous_phase_kept_back() -> None:
    published = Published()
    sink = sink_for(published, {"K": KEY})
    await sink("agent", "stdout", "ends with sk-")
    await sink("verification", "stdout", "ok\n")
    assert published.texts == ["ends with ", "sk-", "ok\n"]
    assert [e["phase"] for e in published.events] == ["agent", "agent", "verification"]
