"""An OpenAI-compatible model server for tests: scripted answers per model name.

No real provider is reachable from the test machines, yet trialbus's users run LLM
agents. This stub lets the suite drive a real Harbor LLM agent (terminus-2, which calls
``litellm.acompletion`` -> the OpenAI SDK -> ``POST {api_base}/chat/completions``)
through the whole stack, offline. The request's ``model`` (the part after the
``openai/`` prefix litellm strips) picks the script:

=====================  ==============================================================
model                  answer
=====================  ==============================================================
solve                  terminus-2 JSON that writes ``/app/hello.txt`` (hello-file) and
                       marks the task complete (terminus-2 asks twice; same answer)
fail                   valid terminus-2 JSON that writes the wrong file content
ratelimit              HTTP 429 with ``Retry-After`` and ``retry-after-ms`` (which the
                       OpenAI SDK prefers) and OpenAI's rate-limit error body
ratelimit-then-solve   429 for the first ``flaky_n`` requests, then as ``solve``
server-error           HTTP 500 (with the same two headers when ``server_retry_after_s``
                       is set)
unauthorized           HTTP 401 ``invalid_api_key``
context-length         HTTP 400 ``context_length_exceeded``
malformed              HTTP 200 whose body is not JSON
slow                   ``solve``, after ``slow_s`` seconds (streamed slowly when the
                       request asks for a stream)
=====================  ==============================================================

Every successful answer carries token ``usage`` (about four characters per token), so
cost and token accounting can be checked. Unknown models get OpenAI's 404. Requests are
counted on arrival (``received``) and recorded when answered (model, status, whether a
bearer token was sent; never its value).

``python -m tests.support.model_stub --port 8765`` serves it by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

HELLO_FILE_COMMANDS = "echo 'Hello, world!' > /app/hello.txt\n"
WRONG_COMMANDS = "echo 'Goodbye' > /app/hello.txt\n"
SCRIPTS = (
    "solve",
    "fail",
    "ratelimit",
    "ratelimit-then-solve",
    "server-error",
    "unauthorized",
    "context-length",
    "malformed",
    "slow",
)


def terminus_answer(keystrokes: str, analysis: str) -> str:
    """An answer in terminus-2's JSON format (its ``terminus-json-plain`` template)."""
    return json.dumps(
        {
            "analysis": analysis,
            "plan": "Run the command, then confirm the task is complete.",
            "commands": [{"keystrokes": keystrokes, "duration": 0.2}],
            "task_complete": True,
        }
    )


def count_tokens(text: str) -> int:
    """A stable stand-in for a tokenizer: one token per four characters, at least one."""
    return max(1, len(text) // 4)


def _prompt_text(body: dict[str, Any]) -> str:
    parts: list[str] = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "\n".join(parts)


def _error(status: int, message: str, kind: str, code: str, **headers: str) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def _retry_after(seconds: float) -> dict[str, str]:
    """``Retry-After`` in whole seconds (HTTP's form) and ``retry-after-ms`` exactly."""
    return {"Retry-After": str(math.ceil(seconds)), "retry-after-ms": str(round(seconds * 1000))}


@dataclass(frozen=True)
class Call:
    """One request the stub answered."""

    model: str
    status: int
    stream: bool
    bearer: bool
    at: float


@dataclass
class ModelStub:
    """The server (``start``/``stop`` or a ``with`` block); ``base_url`` is for api_base."""

    slow_s: float = 30.0
    retry_after_s: float = 1.0
    """What a 429 asks the client to wait. The OpenAI SDK prefers ``retry-after-ms`` to
    ``Retry-After`` (whole seconds), so a fraction of a second shortens every SDK retry
    while the SDK still honours the server's delay."""
    server_retry_after_s: float | None = None
    """When set, a 500 says when to come back too (as overloaded providers do); unset, it
    says nothing and the SDK backs off on its own (0.5-8 s)."""
    flaky_n: int = 1
    calls: list[Call] = field(default_factory=list)
    received: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None
    _port: int = 0

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (``.../v1``) to give an agent as ``api_base``."""
        if not self._port:
            raise RuntimeError("the model stub is not started")
        return f"http://127.0.0.1:{self._port}/v1"

    def count(self, model: str, status: int | None = None) -> int:
        """How many requests for ``model`` were answered (with ``status``, if given)."""
        with self._lock:
            return sum(1 for c in self.calls if c.model == model and status in (None, c.status))

    def statuses(self, model: str) -> Counter[int]:
        """The HTTP statuses returned for ``model``, counted."""
        with self._lock:
            return Counter(c.status for c in self.calls if c.model == model)

    def app(self) -> FastAPI:
        """The ASGI app (routes under ``/v1`` and at the root, as providers vary)."""
        app = FastAPI(title="trialbus model stub")

        async def models() -> dict[str, Any]:
            data = [{"id": m, "object": "model", "owned_by": "stub"} for m in SCRIPTS]
            return {"object": "list", "data": data}

        async def completions(request: Request) -> Response:
            raw = await request.body()
            try:
                body = json.loads(raw)
            except ValueError:
                return _error(400, "request body is not JSON", "invalid_request_error", "bad")
            model = str(body.get("model", ""))
            with self._lock:
                self.received[model] += 1  # on arrival: a slow answer may never finish
            response = await self._answer(model, body)
            with self._lock:
                self.calls.append(
                    Call(
                        model=model,
                        status=response.status_code,
                        stream=bool(body.get("stream")),
                        bearer=request.headers.get("authorization", "").startswith("Bearer "),
                        at=time.monotonic(),
                    )
                )
            return response

        for prefix in ("/v1", ""):
            app.add_api_route(f"{prefix}/models", models, methods=["GET"])
            app.add_api_route(f"{prefix}/chat/completions", completions, methods=["POST"])
        return app

    async def _answer(self, model: str, body: dict[str, Any]) -> Response:
        if model == "solve":
            return self._completion(model, body, terminus_answer(HELLO_FILE_COMMANDS, "Empty."))
        if model == "fail":
            return self._completion(model, body, terminus_answer(WRONG_COMMANDS, "Guessing."))
        if model == "ratelimit-then-solve":
            if self.count(model, 429) < self.flaky_n:
                return self._rate_limited()
            return self._completion(model, body, terminus_answer(HELLO_FILE_COMMANDS, "Ok."))
        if model == "ratelimit":
            return self._rate_limited()
        if model == "server-error":
            headers = (
                {} if self.server_retry_after_s is None else _retry_after(self.server_retry_after_s)
            )
            return _error(
                500, "The server had an error", "server_error", "internal_error", **headers
            )
        if model == "unauthorized":
            return _error(
                401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key"
            )
        if model == "context-length":
            return _error(
                400,
                "This model's maximum context length is 128 tokens.",
                "invalid_request_error",
                "context_length_exceeded",
            )
        if model == "malformed":
            return PlainTextResponse(
                '{"id": "chatcmpl-stub", "choices": [ <html>', media_type="application/json"
            )
        if model == "slow":
            content = terminus_answer(HELLO_FILE_COMMANDS, "Slowly.")
            if body.get("stream"):
                return StreamingResponse(
                    self._slow_stream(model, content), media_type="text/event-stream"
                )
            await asyncio.sleep(self.slow_s)
            return self._completion(model, body, content)
        return _error(
            404, f"The model `{model}` does not exist", "invalid_request_error", "model_not_found"
        )

    def _rate_limited(self) -> JSONResponse:
        return _error(
            429,
            "Rate limit reached for requests",
            "requests",
            "rate_limit_exceeded",
            **_retry_after(self.retry_after_s),
        )

    def _completion(self, model: str, body: dict[str, Any], content: str) -> JSONResponse:
        prompt_tokens = count_tokens(_prompt_text(body))
        completion_tokens = count_tokens(content)
        return JSONResponse(
            {
                "id": f"chatcmpl-stub-{len(self.calls)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )

    async def _slow_stream(self, model: str, content: str) -> AsyncIterator[bytes]:
        pieces = [content[i : i + 16] for i in range(0, len(content), 16)]
        pause = self.slow_s / max(1, len(pieces))
        for piece in pieces:
            await asyncio.sleep(pause)
            chunk = {
                "id": "chatcmpl-stub-stream",
                "object": "chat.completion.chunk",
                "model": model,
                "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}],
            }
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    def start(self) -> ModelStub:
        """Serve on a free loopback port (bound here, so no other process can take it)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        ready = threading.Event()

        class _Server(uvicorn.Server):
            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets)
                ready.set()

        # Idle keep-alive connections stay open: with uvicorn's default 5 s, a client
        # retrying after a 4-15 s backoff (Harbor's LiteLLM retry) could send on the
        # pooled connection just as the stub closed it, and the SDK would spend one of
        # its retries on that reset, one request fewer than the layers' product that
        # test_provider_failures_are_classified counts (seen once: 53 of 54).
        config = uvicorn.Config(
            self.app(),
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_keep_alive=600,
        )
        self._server = _Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="model-stub", daemon=True
        )
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the model stub did not start within 30 s")
        return self

    def stop(self) -> None:
        """Stop serving (requests in flight, e.g. a slow one, are cut off)."""
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> ModelStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    """Serve the stub until Ctrl-C (for trying agents by hand)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--slow-s", type=float, default=30.0)
    args = parser.parse_args()
    stub = ModelStub(slow_s=args.slow_s)
    uvicorn.run(stub.app(), host="127.0.0.1", port=args.port, log_level="info")


if __name__ == "__main__":
    main()
