"""The model endpoint the service under evaluation talks to: an OpenAI-compatible server on
127.0.0.1 that records every chat completion request (its kind, model, requested `max_tokens`,
prompt and completion tokens) and either answers it itself (`stub`: `model_stub`, or the
obedient model of `obedient`) or forwards it to a real endpoint (`proxy`), whose `usage` it
records.

Requests are labelled with `label` (the corpus user being replayed), so the report can split
calls and tokens per user; the quality corpus is replayed one user at a time (the memory-policy
corpora, whose users overlap, are labelled `memory-policy` as a whole).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.kit.tokens import TokenCounter
from eval.model_stub import (
    Answer,
    CallKind,
    call_kind,
    prompt_tokens,
    requested_max_tokens,
    stub_answer,
)

AnswerFunction = Callable[[CallKind, Mapping[str, Any], TokenCounter], Answer]
"""What the stub answers a request of a kind: `model_stub.stub_answer` (the offline engine's
reading) or `obedient.obedient_answer` (a model that stores whatever it is told)."""

PROXY_TIMEOUT_SECONDS: Final = 120.0


@dataclass(frozen=True)
class ModelCall:
    """One chat completion request as the recorder saw it."""

    label: str
    kind: CallKind
    model: str
    max_tokens: int | None
    prompt_tokens: int
    completion_tokens: int
    status: int
    finish_reason: str | None
    understood: bool  # the stub could read the prompt (always True for a proxied call)


class _Server(uvicorn.Server):
    """uvicorn without signal handlers: Ctrl-C stays with the eval."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ModelRecorder:
    """`stub` when `upstream` is None, answering with `answer`, else a recording proxy to
    `upstream` (a base URL ending where `/chat/completions` follows, e.g. `https://host/v1`)."""

    def __init__(
        self,
        upstream: str | None = None,
        api_key: str | None = None,
        *,
        answer: AnswerFunction = stub_answer,
    ) -> None:
        self.calls: list[ModelCall] = []
        self._answer = answer
        self.label = ""
        self.upstream = upstream.rstrip("/") if upstream else None
        self._api_key = api_key
        self._counter = TokenCounter()
        self._ids = itertools.count(1)
        self._http: httpx.AsyncClient | None = None
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._port = 0
        self._app = Starlette(
            routes=[Route("/v1/chat/completions", self._completions, methods=["POST"])]
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}/v1"

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app, log_config=None, access_log=False, lifespan="off", ws="none"
        )
        if self.upstream is not None:
            self._http = httpx.AsyncClient(timeout=PROXY_TIMEOUT_SECONDS)
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the model recorder exited during startup")
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
        if self._http is not None:
            await self._http.aclose()
        self._server = self._task = self._http = None

    async def _completions(self, request: Request) -> Response:
        try:
            parsed = json.loads(await request.body())
        except ValueError:
            parsed = None
        body: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
        kind = call_kind(body)
        if self._http is not None and self.upstream is not None:
            return await self._forward(body, kind)
        answer = self._answer(kind, body, self._counter)
        completion_tokens = self._counter.count(answer.text)
        limit = requested_max_tokens(body)
        finish_reason = "stop"
        text = answer.text
        if limit is not None and completion_tokens > limit:
            # What a server does at the output limit: the answer stops there.
            finish_reason, completion_tokens = "length", limit
            text = text[: limit * 3]
        tokens_in = prompt_tokens(body, self._counter)
        answered = _Answered(tokens_in, completion_tokens, 200, finish_reason, answer.understood)
        self._record(body, kind, answered)
        return JSONResponse(
            {
                "id": f"chatcmpl-eval-{next(self._ids)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or "eval-stub",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text, "refusal": None},
                        "finish_reason": finish_reason,
                        "logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": tokens_in,
                    "completion_tokens": completion_tokens,
                    "total_tokens": tokens_in + completion_tokens,
                },
            }
        )

    async def _forward(self, body: dict[str, Any], kind: CallKind) -> Response:
        assert self._http is not None
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        try:
            upstream = await self._http.post(
                f"{self.upstream}/chat/completions", json=body, headers=headers
            )
        except httpx.HTTPError as error:
            self._record(body, kind, _Answered(0, 0, 502, None))
            return JSONResponse(
                {"error": {"message": f"upstream unreachable: {type(error).__name__}"}}, 502
            )
        usage: dict[str, Any] = {}
        finish_reason = None
        with contextlib.suppress(ValueError, AttributeError, IndexError, TypeError):
            answer = upstream.json()
            usage = answer.get("usage") or {}
            finish_reason = answer["choices"][0].get("finish_reason")
        tokens_in, tokens_out = usage.get("prompt_tokens"), usage.get("completion_tokens")
        answered = _Answered(
            tokens_in if isinstance(tokens_in, int) else 0,
            tokens_out if isinstance(tokens_out, int) else 0,
            upstream.status_code,
            finish_reason,
        )
        self._record(body, kind, answered)
        passed = {k: v for k, v in upstream.headers.items() if k.lower() in _PASSED_HEADERS}
        return Response(upstream.content, upstream.status_code, passed)

    def _record(self, body: dict[str, Any], kind: CallKind, answered: _Answered) -> None:
        self.calls.append(
            ModelCall(
                label=self.label,
                kind=kind,
                model=str(body.get("model") or ""),
                max_tokens=requested_max_tokens(body),
                prompt_tokens=answered.prompt_tokens,
                completion_tokens=answered.completion_tokens,
                status=answered.status,
                finish_reason=answered.finish_reason,
                understood=answered.understood,
            )
        )


@dataclass(frozen=True)
class _Answered:
    prompt_tokens: int
    completion_tokens: int
    status: int
    finish_reason: str | None
    understood: bool = True


_PASSED_HEADERS = frozenset({"content-type", "retry-after", "retry-after-ms", "x-request-id"})
