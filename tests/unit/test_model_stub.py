"""The model stub (tests/support/model_stub.py) answers as each script promises.

The stub is what the LLM-agent end-to-end tests stand on: if it answered 200 where it
should say 429, those tests would check nothing. Each script is checked over HTTP, and
the successful answers through the OpenAI SDK (what litellm uses) as well.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support.model_stub import HELLO_FILE_COMMANDS, WRONG_COMMANDS, ModelStub


@pytest.fixture(scope="module")
def stub() -> Iterator[ModelStub]:
    with ModelStub(slow_s=0.5, retry_after_s=7, flaky_n=2) as s:
        yield s


def _post(stub: ModelStub, model: str, **extra: object) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "x" * 400}], **extra}
    return httpx.post(f"{stub.base_url}/chat/completions", json=body, timeout=10)


def _commands(response: httpx.Response) -> str:
    content = json.loads(response.json()["choices"][0]["message"]["content"])
    assert content["task_complete"] is True
    return "".join(c["keystrokes"] for c in content["commands"])


def test_solve_and_fail_are_terminus_answers_with_usage(stub: ModelStub) -> None:
    solve, fail = _post(stub, "solve"), _post(stub, "fail")
    assert solve.status_code == fail.status_code == 200
    assert _commands(solve) == HELLO_FILE_COMMANDS
    assert _commands(fail) == WRONG_COMMANDS != HELLO_FILE_COMMANDS
    usage = solve.json()["usage"]
    assert usage["prompt_tokens"] == 100  # 400 characters, four per token
    assert usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize(
    ("model", "status", "code"),
    [
        ("ratelimit", 429, "rate_limit_exceeded"),
        ("server-error", 500, "internal_error"),
        ("unauthorized", 401, "invalid_api_key"),
        ("context-length", 400, "context_length_exceeded"),
        ("no-such-model", 404, "model_not_found"),
    ],
)
def test_error_scripts_answer_openai_errors(
    stub: ModelStub, model: str, status: int, code: str
) -> None:
    response = _post(stub, model)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    if status == 429:
        assert response.headers["retry-after"] == "7"
        assert response.headers["retry-after-ms"] == "7000"
    else:
        # The control for the test below: unless asked, a 500 names no delay.
        assert "retry-after" not in response.headers
        assert "retry-after-ms" not in response.headers


def test_a_short_retry_after_is_honoured_by_the_openai_sdk() -> None:
    # The end-to-end provider-failure test keeps every layer's retries but shortens the
    # SDK's waits this way: a 429 and a 500 each say 50 ms, and the SDK's 3 tries of
    # each take well under the 1 s that a whole-second Retry-After would cost.
    with ModelStub(retry_after_s=0.05, server_retry_after_s=0.05) as stub:
        for model in ("ratelimit", "server-error"):
            response = _post(stub, model)
            assert response.headers["retry-after-ms"] == "50", model
            assert response.headers["retry-after"] == "1", model  # HTTP's whole seconds
        client = openai.OpenAI(base_url=stub.base_url, api_key="stub-key", max_retries=2)
        for model, error in (
            ("ratelimit", openai.RateLimitError),
            ("server-error", openai.InternalServerError),
        ):
            before = len(stub.calls)
            with pytest.raises(error):
                client.chat.completions.create(model=model, messages=[])
            tries = [c.at for c in stub.calls[before:]]
            assert len(tries) == 3, model  # the SDK still retried twice
            # Its own backoff would wait at least 0.375 s + 0.75 s between the three.
            assert tries[-1] - tries[0] < 1.0, (model, tries)


def test_malformed_body_is_not_json(stub: ModelStub) -> None:
    response = _post(stub, "malformed")
    assert response.status_code == 200
    with pytest.raises(ValueError):
        response.json()


def test_ratelimit_then_solve_recovers_after_flaky_n(stub: ModelStub) -> None:
    statuses = [_post(stub, "ratelimit-then-solve").status_code for _ in range(4)]
    assert statuses == [429, 429, 200, 200]


def test_slow_waits_and_streams_slowly(stub: ModelStub) -> None:
    before = len(stub.calls)
    response = _post(stub, "slow")
    assert response.status_code == 200 and response.elapsed.total_seconds() >= 0.5
    with httpx.stream(
        "POST",
        f"{stub.base_url}/chat/completions",
        json={"model": "slow", "messages": [], "stream": True},
        timeout=10,
    ) as streamed:
        lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) > 3
    text = "".join(json.loads(x[6:])["choices"][0]["delta"]["content"] for x in lines[:-1])
    assert json.loads(text)["commands"][0]["keystrokes"] == HELLO_FILE_COMMANDS
    assert [c.stream for c in stub.calls[before:]] == [False, True]


def test_openai_sdk_reads_answers_and_errors(stub: ModelStub) -> None:
    client = openai.OpenAI(base_url=stub.base_url, api_key="stub-key", max_retries=0)
    done = client.chat.completions.create(
        model="solve", messages=[{"role": "user", "content": "hello"}]
    )
    assert done.usage is not None and done.usage.prompt_tokens == 1
    answer = json.loads(done.choices[0].message.content or "")
    assert answer["commands"][0]["keystrokes"] == HELLO_FILE_COMMANDS
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="ratelimit", messages=[])
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="unauthorized", messages=[])
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="server-error", messages=[])
    assert stub.count("solve") >= 1 and stub.calls[-1].bearer


def test_requests_are_recorded_per_model(stub: ModelStub) -> None:
    before = stub.statuses("unauthorized")[401]
    _post(stub, "unauthorized")
    assert stub.statuses("unauthorized")[401] == before + 1
    assert stub.received["unauthorized"] == stub.count("unauthorized")
    assert stub.count("never-asked") == 0
