"""Trial folders are redacted as they are packed: text files only, counted, never valued.

The packing is services.common.archive.pack_trial with the runner's scrub
(services.common.redaction.Redactor.redact_file); each assertion that a value is gone
has its control (the same folder packed without the scrub keeps it).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from schemas.events import TaskRef, TrialRequested
from schemas.manifest import AgentSpec, ComputeSpec, RetrySpec
from services.common.archive import TRIAL_MANIFEST, pack_trial
from services.common.redaction import Redactor, TrialSecrets
from tests.support.stored_results import file_members

KEY = "sk-test-0123456789abcdefghij"
CRED = "cred-9876543210zyxwvutsrq"


def _folder(root: Path) -> Path:
    (root / "agent").mkdir(parents=True)
    result = {"exception_info": {"exception_message": f"auth failed with key {KEY}"}}
    (root / "result.json").write_text(json.dumps(result))
    encoded = base64.b64encode(f"user:{CRED}".encode()).decode()
    (root / "agent" / "trajectory.json").write_text(f'{{"cmd": "Basic {encoded}"}}')
    # Latin-1 bytes around the key: not UTF-8, still text.
    (root / "agent" / "latin1.log").write_bytes(b"caf\xe9 " + KEY.encode() + b" \xff")
    (root / "agent" / "blob.bin").write_bytes(b"\0\1" + KEY.encode())
    return root


def test_text_files_are_redacted_and_counted_binary_files_kept(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "trial")
    redactor = Redactor({"OPENAI_API_KEY": KEY, "MYLLM_CRED": CRED})
    archive = pack_trial(folder, scrub=redactor.redact_file)
    members = file_members(archive.data)
    text = b"".join(v for k, v in members.items() if not k.endswith(".bin"))
    assert KEY.encode() not in text and CRED.encode() not in text
    assert b"[redacted:OPENAI_API_KEY]" in members["result.json"]
    assert b"[redacted:MYLLM_CRED]" in members["agent/trajectory.json"]
    assert members["agent/latin1.log"] == b"caf\xe9 [redacted:OPENAI_API_KEY] \xff"
    assert members["agent/blob.bin"] == b"\0\1" + KEY.encode()  # binary: as it was
    manifest = json.loads(members[TRIAL_MANIFEST])
    assert manifest["redacted"] == {"files": 3, "replacements": 3}
    assert archive.redactions == 3
    assert KEY.encode() not in members[TRIAL_MANIFEST]

    # Control: without the scrub the values are stored, and no count is claimed.
    plain = file_members(pack_trial(folder).data)
    assert KEY.encode() in plain["result.json"]
    assert "redacted" not in json.loads(plain[TRIAL_MANIFEST])


def test_a_redacted_file_that_grows_past_the_cap_is_left_out(tmp_path: Path) -> None:
    folder = tmp_path / "trial"
    folder.mkdir()
    short = "abcdefgh"  # 8 characters become "[redacted:A_LONG_SECRET_NAME]"
    (folder / "result.json").write_text(short * 10)
    cap = len(short) * 10 + 5
    archive = pack_trial(folder, cap, scrub=Redactor({"A_LONG_SECRET_NAME": short}).redact_file)
    assert [x.name for x in archive.left_out] == ["result.json"]
    assert short.encode() not in archive.data  # left out, not stored in clear
    control = pack_trial(folder, cap)
    assert control.left_out == []


def test_trial_secrets_are_the_runners_and_the_agents_named_variables() -> None:
    request = TrialRequested(
        experiment_id="exp-a",
        correlation_id="c",
        trial_id="t-1",
        task=TaskRef(name="hello", checksum="ab" * 32),
        agent=AgentSpec(name="nop", api_key_env=["OPENAI_API_KEY"]),
        repetition=0,
        compute=ComputeSpec(),
        retry=RetrySpec(),
    )
    secrets = TrialSecrets(
        {"LEDGER_URL": "ledger-pw-0123"},
        {"OPENAI_API_KEY": KEY, "MYLLM_CRED": CRED},
    )
    # MYLLM_CRED is not among the agent's api_key_env: the trial is not handed it.
    assert secrets.of(request) == {"LEDGER_URL": "ledger-pw-0123", "OPENAI_API_KEY": KEY}
    assert secrets.redactor(request).redact(f"x {KEY} y") == "x [redacted:OPENAI_API_KEY] y"


def test_a_message_cut_inside_a_secret_keeps_no_beginning_of_it() -> None:
    redactor = Redactor({"MYLLM_CRED": CRED})
    message = ("x" * 1990 + f" {CRED} tail")[:2000]  # cut inside the value
    assert CRED[:8] in message  # control: the cut left the value's beginning
    cut = redactor.redact_cut(message)
    assert cut == "x" * 1990 + " [cut]" and CRED[:5] not in cut
    assert redactor.redact(message) == message  # whole-value redaction misses it
    whole = f"error {CRED} ends"
    assert (
        redactor.redact_cut(whole) == redactor.redact(whole) == "error [redacted:MYLLM_CRED] ends"
    )
