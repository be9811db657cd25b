"""A real OpenAI-compatible HTTP server for tests: scripted answers, recorded requests.

`StubLLMServer` runs a Starlette app under uvicorn on 127.0.0.1 (ephemeral port) as a task in
the running event loop. Each test scripts the answers it expects to be asked for, in order:

    llm_stub.script(reply('{"ops": []}', tokens_in=120), status(429, headers={"Retry-After": "2"}))
    settings = make_settings(url, llm_provider="openai", openai_base_url=llm_stub.base_url)
    ...
    assert [r.model for r in llm_stub.requests] == ["gpt-4o-mini", "gpt-4o-mini"]

A request arriving with the script empty is recorded and answered 500 (`type`
"stub_script_exhausted"), so an unexpected call fails visibly. `answers` records what the stub
itself answered, per request, in the order the answers were sent: the HTTP status and, for a
completion, the model and the `usage` tokens it reported (what a provider would bill).

Serves `POST /v1/chat/completions` and the Azure form
`POST /openai/deployments/{deployment}/chat/completions`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.kit.llm import OpenAIChatModel
from tests.helpers.polling import wait_until

# --- the script ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    text: str
    finish_reason: str = "stop"
    tokens_in: int = 10
    tokens_out: int = 5
    usage: bool = True
    model: str | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    text: str


@dataclass(frozen=True, slots=True)
class Status:
    code: int
    body: Mapping[str, Any] | str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Delay:
    seconds: float
    then: ScriptStep


@dataclass(frozen=True, slots=True)
class Malformed:
    body: str
    content_type: str


ScriptStep = Reply | Refusal | Status | Delay | Malformed


def reply(
    text: str,
    *,
    finish_reason: str = "stop",
    tokens_in: int = 10,
    tokens_out: int = 5,
    usage: bool = True,
    model: str | None = None,
) -> Reply:
    """A completion with `text`. `usage=False` omits the usage block; `model` overrides the
    answering model name (default: the model the request named)."""
    return Reply(text, finish_reason, tokens_in, tokens_out, usage, model)


def refusal(text: str) -> Refusal:
    """A completion whose message has `refusal` set and no content."""
    return Refusal(text)


def status(
    code: int, body: Mapping[str, Any] | str | None = None, headers: Mapping[str, str] | None = None
) -> Status:
    """An HTTP error. A dict body is sent as JSON, a str as text/plain; None sends an
    OpenAI-style `{"error": {...}}` body."""
    return Status(code, body, dict(headers or {}))


def delay(seconds: float, then: ScriptStep | None = None) -> Delay:
    """Wait `seconds` (cut short when the server stops), then answer `then` (default a reply)."""
    return Delay(seconds, then if then is not None else reply("late answer"))


def malformed(
    body: str = '{"id": "chatcmpl-stub", "choices": [', content_type: str = "application/json"
) -> Malformed:
    """HTTP 200 with a body that is not a chat completion (default: truncated JSON)."""
    return Malformed(body, content_type)


# --- what the service sent -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as received: path, query, lower-cased headers, parsed JSON body."""

    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def model(self) -> Any:
        return self.body.get("model")

    @property
    def messages(self) -> Any:
        return self.body.get("messages")


@dataclass(frozen=True, slots=True)
class Answer:
    """What the stub answered one request with. `model`, `prompt_tokens`, `completion_tokens`
    and `finish_reason` are those of the completion it sent (tokens as its `usage` block said,
    0 without one); None and 0 for an answer that is not a completion (an HTTP error, a
    malformed body)."""

    request: RecordedRequest
    status: int
    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None

    @property
    def completion(self) -> bool:
        return self.model is not None


@dataclass(frozen=True, slots=True)
class _Billed:
    model: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


# --- the server ----------------------------------------------------------------------------


class _Server(uvicorn.Server):
    """uvicorn without signal handlers: Ctrl-C must stay with pytest."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class StubLLMServer:
    """An OpenAI-compatible server on 127.0.0.1; `base_url` ends in `/v1`."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self.answers: list[Answer] = []
        self._script: deque[ScriptStep] = deque()
        self._port: int | None = None
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._ids = itertools.count(1)
        self._app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat_completions, methods=["POST"]),
                Route(
                    "/openai/deployments/{deployment}/chat/completions",
                    self._chat_completions,
                    methods=["POST"],
                ),
            ]
        )

    @property
    def root_url(self) -> str:
        """`http://127.0.0.1:<port>`; kept after `stop()` so a test can aim at the closed port."""
        if self._port is None:
            raise RuntimeError("the stub LLM server was never started")
        return f"http://127.0.0.1:{self._port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    @property
    def pending(self) -> int:
        """Scripted answers not yet consumed."""
        return len(self._script)

    def script(self, *steps: ScriptStep) -> None:
        """Queue answers; each request consumes the next one."""
        self._script.extend(steps)

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("the stub LLM server is already running")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app,
            log_config=None,
            access_log=False,
            lifespan="off",
            ws="none",
            timeout_graceful_shutdown=2,
        )
        self._stopping.clear()
        self._server = _Server(config)
        task = self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        server = self._server

        def started() -> bool:
            if task.done():
                sock.close()
                task.result()
                raise RuntimeError("the stub LLM server exited during startup")
            return server.started

        await wait_until(started, 30, what="the stub LLM server serving", every=0.005)

    async def stop(self) -> None:
        """Stop serving; delayed answers are cut short. The port is then refused."""
        if self._task is None or self._server is None:
            return
        self._stopping.set()
        self._server.should_exit = True
        try:
            await self._task
        finally:
            self._task = None
            self._server = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _chat_completions(self, request: Request) -> Response:
        raw = await request.body()
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        body: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
        recorded = RecordedRequest(
            path=request.url.path,
            query=dict(request.query_params),
            headers={name.lower(): value for name, value in request.headers.items()},
            body=body,
        )
        self.requests.append(recorded)
        if not self._script:
            self.answers.append(Answer(recorded, 500))
            return JSONResponse(
                {
                    "error": {
                        "message": "llm_stub: no scripted answer left for this request",
                        "type": "stub_script_exhausted",
                        "code": "stub_script_exhausted",
                    }
                },
                status_code=500,
            )
        response, billed = await self._answer(self._script.popleft(), body)
        if billed is None:
            self.answers.append(Answer(recorded, response.status_code))
        else:
            self.answers.append(
                Answer(
                    recorded,
                    response.status_code,
                    billed.model,
                    billed.prompt_tokens,
                    billed.completion_tokens,
                    billed.finish_reason,
                )
            )
        return response

    async def _answer(
        self, step: ScriptStep, body: dict[str, Any]
    ) -> tuple[Response, _Billed | None]:
        match step:
            case Reply():
                message = {"role": "assistant", "content": step.text, "refusal": None}
                completion = self._completion(body, message, step.finish_reason, step.model, step)
                return JSONResponse(completion), _billed(completion)
            case Refusal():
                message = {"role": "assistant", "content": None, "refusal": step.text}
                completion = self._completion(body, message, "stop", None, None)
                return JSONResponse(completion), _billed(completion)
            case Status(body=str() as text):
                return Response(text, step.code, dict(step.headers), media_type="text/plain"), None
            case Status(body=Mapping() as payload):
                return JSONResponse(dict(payload), step.code, dict(step.headers)), None
            case Status():
                default = {
                    "error": {
                        "message": f"llm_stub scripted status {step.code}",
                        "type": "stub_error",
                        "code": None,
                    }
                }
                return JSONResponse(default, step.code, dict(step.headers)), None
            case Delay():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), step.seconds)
                return await self._answer(step.then, body)
            case Malformed():
                return Response(step.body, 200, media_type=step.content_type), None

    def _completion(
        self,
        body: dict[str, Any],
        message: dict[str, Any],
        finish_reason: str,
        model: str | None,
        usage: Reply | None,
    ) -> dict[str, Any]:
        completion: dict[str, Any] = {
            "id": f"chatcmpl-stub-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model or body.get("model") or "stub-model",
            "choices": [
                {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
            ],
        }
        if usage is None or usage.usage:
            tokens_in = usage.tokens_in if usage else 10
            tokens_out = usage.tokens_out if usage else 0
            completion["usage"] = {
                "prompt_tokens": tokens_in,
                "completion_tokens": tokens_out,
                "total_tokens": tokens_in + tokens_out,
            }
        return completion


def _billed(completion: dict[str, Any]) -> _Billed:
    usage = completion.get("usage") or {}
    return _Billed(
        model=completion["model"],
        prompt_tokens=usage.get("prompt_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
        finish_reason=completion["choices"][0]["finish_reason"],
    )


@pytest.fixture(name="llm_stub")
async def llm_stub_fixture() -> AsyncIterator[StubLLMServer]:
    """Fixture `llm_stub`: a started `StubLLMServer`, stopped after the test.

    Register it with `from tests.helpers.llm_stub import llm_stub_fixture  # noqa: F401` (the
    explicit name keeps test parameters from shadowing the import)."""
    async with StubLLMServer() as stub:
        yield stub


@pytest.fixture(name="chat_model")
async def chat_model_fixture(llm_stub: StubLLMServer) -> AsyncIterator[OpenAIChatModel]:
    """Fixture `chat_model`: the real `OpenAIChatModel` talking to the `llm_stub` server."""
    async with OpenAIChatModel(
        api_key=None, base_url=llm_stub.base_url, timeout_seconds=5.0
    ) as model:
        yield model
